// The kernel of csrc/lmn_kernel.h for any CPU, compiled for the compiler's baseline target:
// 16-byte vectors (SSE2 on x86-64, NEON on aarch64), 6 x 2 tile (6 x 4 with aarch64's 32
// vector registers).
#define LMN_VARIANT generic
#define LMN_VEC_BYTES 16
#define LMN_ROWS 6
#if defined(__aarch64__)
#define LMN_VECS 4
#else
#define LMN_VECS 2
#endif
#include "lmn_kernel.h"
