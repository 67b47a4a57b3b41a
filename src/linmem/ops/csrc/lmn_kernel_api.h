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
// rows padded with zeros to h_pad / m_pad columns (multiples of the variant's vector lanes),
// laid out in panels of columns (see `gemm` in csrc/lmn_kernel.h).
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

// The GRU's recurrence (torch.nn.GRU's equations; linmem.nn.rnns) given its input products
// gi = x W_ih^T + b_ih (T, B, 3H), gates in PyTorch's order r, z, n.
template <typename T>
struct GruForwardArgs {
  const T* gi; int64_t gis0, gis1;         // x W_ih^T + b_ih (T, B, 3H)
  const T* h0; int64_t h0s;                // (B, H)
  const T* w;                              // W_hh^T packed: (H, w_pad), w_pad >= 3H
  const T* bias;                           // b_hh (3H)
  T* h; int64_t hs0, hs1;                  // out: h_1..h_T (T, B, H)
  T* gates; int64_t gas0, gas1;            // out: r, z, n of every step (T, B, 3H)
  T* gh; int64_t ghs0, ghs1;               // out: h_{t-1} W_hh^T + b_hh (T, B, 3H)
  int64_t steps, hidden, w_pad;
  RowsFn<T> tanh_rows, sigmoid_rows;
};

template <typename T>
struct GruBackwardArgs {
  const T* gh_out; int64_t gos0, gos1;     // dL/dh_t from the output (T, B, H), or nullptr
  const T* h0; int64_t h0s;                // (B, H)
  const T* h; int64_t hs0, hs1;            // h_t (T, B, H)
  const T* gates; int64_t gas0, gas1;      // r, z, n (T, B, 3H)
  const T* gh; int64_t ghs0, ghs1;         // h_{t-1} W_hh^T + b_hh (T, B, 3H)
  const T* w;                              // W_hh packed: (3H, h_pad)
  T* d_gh; int64_t dgs0, dgs1;             // out: dL/d(h_{t-1} W_hh^T + b_hh) (T, B, 3H)
  T* d_n; int64_t dns0, dns1;              // out: dL/d(n's pre-activation) (T, B, H)
  T* d_h0; int64_t d0s;                    // out: dL/dh_0 (B, H)
  int64_t steps, hidden, h_pad;
};

// The LSTM's recurrence (torch.nn.LSTM's equations; linmem.nn.rnns) given its input products
// gi = x W_ih^T + b_ih (T, B, 4H), gates in PyTorch's order i, f, g, o.
template <typename T>
struct LstmForwardArgs {
  const T* gi; int64_t gis0, gis1;         // x W_ih^T + b_ih (T, B, 4H)
  const T* h0; int64_t h0s;                // (B, H)
  const T* c0; int64_t c0s;                // (B, H)
  const T* w;                              // W_hh^T packed: (H, w_pad), w_pad >= 4H
  const T* bias;                           // b_hh (4H)
  T* h; int64_t hs0, hs1;                  // out: h_1..h_T (T, B, H)
  T* c; int64_t cs0, cs1;                  // out: c_1..c_T (T, B, H)
  T* tc; int64_t tcs0, tcs1;               // out: tanh(c_t) (T, B, H)
  T* gates; int64_t gas0, gas1;            // out: i, f, g, o of every step (T, B, 4H)
  int64_t steps, hidden, w_pad;
  RowsFn<T> tanh_rows, sigmoid_rows;
};

template <typename T>
struct LstmBackwardArgs {
  const T* gh_out; int64_t gos0, gos1;     // dL/dh_t from the output (T, B, H), or nullptr
  const T* gc_last; int64_t gcs;           // dL/dc_T (B, H), or nullptr
  const T* c0; int64_t c0s;                // (B, H)
  const T* c; int64_t cs0, cs1;            // c_t (T, B, H)
  const T* tc; int64_t tcs0, tcs1;         // tanh(c_t) (T, B, H)
  const T* gates; int64_t gas0, gas1;      // i, f, g, o (T, B, 4H)
  const T* w;                              // W_hh packed: (4H, h_pad)
  T* d_a; int64_t das0, das1;              // out: dL/d(the gates' pre-activations) (T, B, 4H)
  T* d_h0; int64_t dh0s;                   // out: dL/dh_0 (B, H)
  T* d_c0; int64_t dc0s;                   // out: dL/dc_0 (B, H)
  int64_t steps, hidden, h_pad;
};

// The Elman RNN's recurrence (torch.nn.RNN's equations; linmem.nn.rnns) given its input products
// gi = x W_ih^T + b_ih (T, B, H): h_t = sigma(gi_t + b_hh + h_{t-1} W_hh^T), tanh or relu.
template <typename T>
struct RnnForwardArgs {
  const T* gi; int64_t gis0, gis1;         // x W_ih^T + b_ih (T, B, H)
  const T* h0; int64_t h0s;                // (B, H)
  const T* w;                              // W_hh^T packed: (H, h_pad)
  const T* bias;                           // b_hh (H)
  T* h; int64_t hs0, hs1;                  // out: h_1..h_T (T, B, H)
  int64_t steps, hidden, h_pad, nonlinearity;
  RowsFn<T> tanh_rows;
};

template <typename T>
struct RnnBackwardArgs {
  const T* gh_out; int64_t gos0, gos1;     // dL/dh_t from the output (T, B, H), or nullptr
  const T* h; int64_t hs0, hs1;            // h_t (T, B, H)
  const T* w;                              // W_hh packed: (H, h_pad)
  T* d_a; int64_t das0, das1;              // out: dL/d(pre-activation) (T, B, H)
  T* d_h0; int64_t d0s;                    // out: dL/dh_0 (B, H)
  int64_t steps, hidden, h_pad, nonlinearity;
};

// The unrolled network's recurrence (paper eq. 10; linmem.nn.UnrolledNet) given its input
// products x_proj = W^xh x_t + b^h (T, B, H): the states live in one batch-major buffer
// (B, k + T, H) in time order, the k before step t one (k H) row of it (row stride (k + T) H).
template <typename T>
struct UlmForwardArgs {
  const T* x; int64_t xs0, xs1;            // x_proj (T, B, H)
  const T* w;                              // [W^hh_k ... W^hh_1]^T packed: (k H, h_pad)
  T* buf; int64_t row;                     // in/out: the states, buf[b][k + t] = h_{t+1}
  int64_t steps, hidden, k, h_pad, nonlinearity;
  RowsFn<T> tanh_rows;
};

template <typename T>
struct UlmBackwardArgs {
  const T* buf; int64_t row;               // the states (B, k + T, H)
  const T* w;                              // [W^hh_k ... W^hh_1] packed: (H, kh_pad)
  T* d_buf;                                // in/out (B, k + T, H): dL/dh from the output in,
                                           // every state's total gradient out
  T* d_a;                                  // out: dL/d(pre-activation) (B, T, H)
  int64_t steps, hidden, k, kh_pad, nonlinearity;
};

// One compiled variant: its loops over the rows [b0, b1) of a batch, with `scratch` holding
// (b1 - b0) x (h_pad + m_pad) values (the GRU's and the LSTM's: (b1 - b0) x w_pad, or x h_pad
// backward (the LSTM's: x 2 h_pad); the RNN's: (b1 - b0) x h_pad; the ULM's: (b1 - b0) x h_pad
// forward, x kh_pad backward).
struct Variant {
  const char* name;
  int64_t vec_bytes;
  int64_t vecs;  // vectors per tile row: the packed weights' panels are vecs vectors wide
  void (*forward_f)(const ForwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*forward_d)(const ForwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
  void (*backward_f)(const BackwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*backward_d)(const BackwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
  void (*gru_forward_f)(const GruForwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*gru_forward_d)(const GruForwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
  void (*gru_backward_f)(const GruBackwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*gru_backward_d)(const GruBackwardArgs<double>&, int64_t b0, int64_t b1,
                         double* scratch);
  void (*lstm_forward_f)(const LstmForwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*lstm_forward_d)(const LstmForwardArgs<double>&, int64_t b0, int64_t b1,
                         double* scratch);
  void (*lstm_backward_f)(const LstmBackwardArgs<float>&, int64_t b0, int64_t b1,
                          float* scratch);
  void (*lstm_backward_d)(const LstmBackwardArgs<double>&, int64_t b0, int64_t b1,
                          double* scratch);
  void (*rnn_forward_f)(const RnnForwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*rnn_forward_d)(const RnnForwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
  void (*rnn_backward_f)(const RnnBackwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*rnn_backward_d)(const RnnBackwardArgs<double>&, int64_t b0, int64_t b1,
                         double* scratch);
  void (*ulm_forward_f)(const UlmForwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*ulm_forward_d)(const UlmForwardArgs<double>&, int64_t b0, int64_t b1, double* scratch);
  void (*ulm_backward_f)(const UlmBackwardArgs<float>&, int64_t b0, int64_t b1, float* scratch);
  void (*ulm_backward_d)(const UlmBackwardArgs<double>&, int64_t b0, int64_t b1,
                         double* scratch);
  // the bound of a batch-1 step (benchmarks/throughput.py): `n` floats read `repeats` times
  // with this variant's vectors; returns their sum, so that nothing can skip the reads
  float (*stream_read_f)(const float* data, int64_t n, int64_t repeats);
  // the float32 loops' tanh (csrc/lmn_kernel.h), in place: `n` values
  void (*tanh_f)(float* data, int64_t n);
};

extern const Variant avx512_variant;  // x86-64 only
extern const Variant avx2_variant;    // x86-64 only
extern const Variant generic_variant;

}  // namespace linmem
