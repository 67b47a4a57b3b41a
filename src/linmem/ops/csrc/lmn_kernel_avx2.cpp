// The kernel of csrc/lmn_kernel.h for AVX2 with FMA (x86-64-v3): 32-byte vectors, 6 x 2 tile.
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif
#define LMN_VARIANT avx2
#define LMN_VEC_BYTES 32
#define LMN_ROWS 6
#define LMN_VECS 2
#include "lmn_kernel.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
