// The kernel of csrc/lmn_kernel.h for AVX-512 (x86-64-v4): 64-byte vectors, 6 x 4 tile.
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#endif
#define LMN_VARIANT avx512
#define LMN_VEC_BYTES 64
#define LMN_ROWS 6
#define LMN_VECS 4
#include "lmn_kernel.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
