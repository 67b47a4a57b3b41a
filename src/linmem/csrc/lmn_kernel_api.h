// What csrc/lmn_cpu.cpp (threads, packing, Python binding) and the kernel variants compiled
// from csrc/lmn_kernel.h share: plain structs of pointers and strides, no library headers.
#pragma once

#include <cstdint>

#define LMN_CONCAT_(a, b) a##b
#define LMN_CONCAT(a, b) LMN_CONCAT_(a, b)
#define LMN_STRING_(a) #a
#define LMN_STRING(a) LMN_STRING_(a)

namespace linmem {

enum Nonlinearity : int64_t { kTanh = 0, kRelu = 1, kSelu = 2 };
constexpr double kSeluScale = 1.0507009873554804934193349852946;
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;

// tanh of `rows` rows of `n` values (row stride ld), in place: ATen's, passed in by the binding.
template <typename T>
using RowsFn = void (*)(T* rows, int64_t ld, int64_t n_rows, int64_t n);

// Strides are in elements; `*s0` steps over time, `*s1` over the batch. Packed weights have
// rows padded with zeros to h_pad / m_pad columns (multiples of the variant's vector lanes).
template <typename T>
struct ForwardArgs {
  const T* x; int64_t xs0, xs1;            // x_proj (T, B, H)
  const T* m0; int64_t m0s;                // (B, M)
  const T* w_first;                        // [W^mh^T | W^mm^T]: (M, h_pad + m_pad)
  const T* w_second;                       // W^hm^T: (H, m_pad)
  const T* bias;                           // b^m (M)
  T* h; int64_t hs0, hs1;                  // out: h_1..h_T (T, B, H)
  T* m; int64_t ms0, ms1;                  // out: m_1..m_T (T, B, M)
  int64_t steps, hidden, memory, h_pad, m_pad, nonlinearity;
  RowsFn<T> tanh_rows;
};

template <typename T>
struct BackwardArgs {
  const T* gh; int64_t ghs0, ghs1;         // dL/dh_t (T, B, H), or nullptr
  const T* gm; int64_t gms0, gms1;         // dL/dm_t from the output (T, B, M), or nullptr
  const T* h; int64_t hs0, hs1;            // h_t (T, B, H)
  const T* w_dm;                           // W^hm: (M, h_pad)
  const T* w_dprev;                        // [W^mh; W^mm]: (H + M, m_pad)
  T* g; int64_t gs0, gs1;                  // out: [dL/da_t, dL/dm_t] (T, B, H + M)
  T* g0; int64_t g0s;                      // out: dL/dm_0 (B, M)
  int64_t steps, hidden, memory, h_pad, m_pad, nonlinearity;
};

// One compiled variant: its loops over the rows [b0, b1) of a batch, with `scratch` holding
// (b1 - b0) x (h_pad + m_pad) values.
struct Variant {
  const char* name;
  int64_t vec_bytes;
  void (*forward_f)(const ForwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*forward_d)(const ForwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
  void (*backward_f)(const BackwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*backward_d)(const BackwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
};

extern const Variant avx512_variant;  // x86-64 only
extern const Variant avx2_variant;    // x86-64 only
extern const Variant generic_variant;

}  // namespace linmem
