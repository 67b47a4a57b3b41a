// The LMN recurrence (paper eqs. 6-7) and its backward through time on the CPU, and those of
// the GRU and the Elman RNN (linmem.nn.rnns) and of the unrolled network (eq. 10): the binding.
//
// Why a compiled kernel: the products that must stay in the sequential loop are small,
// (B, 250) x (250, 250) for a typical layer, and a BLAS call on them pays thread start-up and
// synchronisation at every step and, on some CPUs, runs a generic code path. Here the batch is
// split across threads once per call (rows of different sequences never interact), every
// thread runs all the steps of its rows on its own, and the products use a register-blocked
// kernel over weights packed once per call (they stay in the core's cache for the whole loop).
//
// The loops themselves are csrc/lmn_kernel.h, compiled once per instruction set (AVX-512,
// AVX2 + FMA, and a portable baseline) with a register tile that fits that instruction set;
// this file is compiled for the baseline, picks a variant by name at each call (the CPU must
// support it: `variants()` lists those it does, best first), splits the batch over torch's
// threads and packs the weights. The weight gradients are large products over all steps, left
// to BLAS by the caller (linmem.ops.lmn_scan).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "lmn_kernel_api.h"

namespace linmem {
namespace {

const Variant* compiled_variants[] = {
#if defined(__x86_64__)
    &avx512_variant, &avx2_variant,
#endif
    &generic_variant,
};

bool cpu_supports(const Variant& v) {
  const std::string name = v.name;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (name == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (name == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return name == "generic";
}

// The variants this CPU can run, best first.
std::vector<std::string> variants() {
  std::vector<std::string> names;
  for (const Variant* v : compiled_variants)
    if (cpu_supports(*v)) names.push_back(v->name);
  return names;
}

const Variant& variant_named(const std::string& name) {
  for (const Variant* v : compiled_variants)
    if (name == v->name) {
      TORCH_CHECK(cpu_supports(*v), "LMN kernel variant '", name, "' is not supported by this CPU");
      return *v;
    }
  TORCH_CHECK(false, "unknown LMN kernel variant '", name, "'");
}

template <typename T>
int64_t padded(int64_t n, const Variant& v) {
  const int64_t lanes = v.vec_bytes / static_cast<int64_t>(sizeof(T));
  return (n + lanes - 1) / lanes * lanes;
}

// Buffers reused across calls (grow-only, one set per thread): allocating and zeroing them at
// every call costs more than a short sequence's whole loop.
template <typename T>
T* buffer(int slot, int64_t size) {
  thread_local std::vector<T> buffers[3];
  std::vector<T>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < size) b.resize(size);
  return b.data();
}

// Where element (k, j) of a packed (k_size x n_total) matrix lies: in panels of `panel`
// columns (the last one narrower), each panel's k_size rows together (`gemm` in lmn_kernel.h).
struct Panels {
  int64_t k_size, n_total, panel;
  int64_t at(int64_t k, int64_t j) const {
    const int64_t p0 = j / panel * panel;
    return p0 * k_size + k * std::min(panel, n_total - p0) + (j - p0);
  }
};

// The panels' width of a variant: the columns of its register tile.
template <typename T>
int64_t panel_width(const Variant& v) {
  return v.vecs * v.vec_bytes / static_cast<int64_t>(sizeof(T));
}

// The (K, N) matrix `w` into rows [k0, k0 + K) and columns [j0, j0 + N) of the packed matrix
// `to` at `out`, zeros in its columns [j0 + N, j0 + n_pad). `w` may be row-major or a
// transposed view of a row-major matrix (W^T for a weight W), read as it lies. Panel by panel,
// each panel's rows written in order: a row-major `w` is copied a row segment at a time, a
// transposed one read as `panel` sequential streams (its rows), with no index arithmetic per
// element (computing `Panels::at` per element made packing cost as much as 37 batch-1 steps).
template <typename T>
void pack(const at::Tensor& w, T* out, const Panels& to, int64_t k0, int64_t j0, int64_t n_pad) {
  const int64_t k_size = w.size(0), n = w.size(1);
  const at::Tensor c = (w.stride(1) == 1 || w.stride(0) == 1) ? w : w.contiguous();
  const T* src = c.data_ptr<T>();
  const int64_t sk = c.stride(0), sj = c.stride(1);
  for (int64_t p0 = j0 / to.panel * to.panel; p0 < j0 + n_pad; p0 += to.panel) {
    const int64_t width = std::min(to.panel, to.n_total - p0);
    const int64_t c0 = std::max(p0, j0), c1 = std::min(p0 + width, j0 + n_pad);
    const int64_t data_end = std::min(c1, j0 + n);  // columns [c0, data_end) hold w's values
    T* panel = out + p0 * to.k_size + (c0 - p0);
    for (int64_t k = 0; k < k_size; ++k) {
      T* row = panel + (k0 + k) * width;
      const T* from = src + k * sk + (c0 - j0) * sj;
      const int64_t filled = data_end - c0;
      if (sj == 1) {
        std::memcpy(row, from, filled * sizeof(T));
      } else {
        for (int64_t j = 0; j < filled; ++j) row[j] = from[j * sj];
      }
      std::fill(row + filled, row + (c1 - c0), T(0));
    }
  }
}

// ATen's vectorised tanh, in place: the PyTorch loop's values.
template <typename T>
void aten_tanh(T* h, int64_t ld, int64_t rows, int64_t n) {
  at::from_blob(h, {rows, n}, {ld, 1}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value))
      .tanh_();
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
              " must have a contiguous last dimension");
}

int64_t grain(int64_t batch) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>(1, (batch + threads - 1) / threads);
}

// A variant's loop for the element type T, from its float and double entries.
template <typename T, typename F, typename D>
auto for_type(F for_float, D for_double) {
  if constexpr (std::is_same_v<T, float>) return for_float; else return for_double;
}

// A variant's loop `fn` over the batch's rows, split across torch's threads, each with its own
// scratch rows of `width` values.
template <typename T, typename Fn, typename Args>
void over_rows(Fn fn, const Args& p, int64_t batch, int64_t width) {
  at::parallel_for(0, batch, grain(batch), [&](int64_t b0, int64_t b1) {
    fn(p, b0, b1, buffer<T>(2, (b1 - b0) * width));
  });
}

// `weights` (rows x columns, any strides) packed alone for the kernel's product, in the call's
// weight buffer: its rows padded to `pad` columns, in panels (see `pack`).
template <typename T>
const T* packed(const Variant& v, const at::Tensor& weights, int64_t pad) {
  const int64_t rows = weights.size(0);
  T* w = buffer<T>(0, rows * pad);
  pack<T>(weights, w, Panels{rows, pad, panel_width<T>(v)}, 0, 0, pad);
  return w;
}

// The sizes both directions share, with the rows padded to the variant's vector lanes.
template <typename T, typename Args>
void set_sizes(Args& p, const Variant& v, int64_t steps, int64_t hidden, int64_t memory,
               int64_t nonlinearity) {
  p.steps = steps;
  p.hidden = hidden;
  p.memory = memory;
  p.h_pad = padded<T>(hidden, v);
  p.m_pad = padded<T>(memory, v);
  p.nonlinearity = nonlinearity;
}

template <typename T>
void forward_impl(const Variant& v, const at::Tensor& x_proj, const at::Tensor& m0,
                  const at::Tensor& w_mh, const at::Tensor& w_hm, const at::Tensor& w_mm,
                  const at::Tensor& bias_m, int64_t nonlinearity, at::Tensor& hs,
                  at::Tensor& ms) {
  ForwardArgs<T> p{};
  set_sizes<T>(p, v, x_proj.size(0), x_proj.size(2), m0.size(1), nonlinearity);
  const int64_t batch = x_proj.size(1), width = p.h_pad + p.m_pad;
  T* w_first = buffer<T>(0, p.memory * width);  // [W^mh^T | W^mm^T]: (M, h_pad + m_pad)
  const Panels first{p.memory, width, panel_width<T>(v)};
  pack<T>(w_mh.t(), w_first, first, 0, 0, p.h_pad);
  pack<T>(w_mm.t(), w_first, first, 0, p.h_pad, p.m_pad);
  T* w_second = buffer<T>(1, p.hidden * p.m_pad);  // W^hm^T: (H, m_pad)
  pack<T>(w_hm.t(), w_second, Panels{p.hidden, p.m_pad, panel_width<T>(v)}, 0, 0, p.m_pad);
  p.w_first = w_first;
  p.w_second = w_second;
  p.bias = bias_m.data_ptr<T>();
  p.x = x_proj.data_ptr<T>(), p.xs0 = x_proj.stride(0), p.xs1 = x_proj.stride(1);
  p.m0 = m0.data_ptr<T>(), p.m0s = m0.stride(0);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.m = ms.data_ptr<T>(), p.ms0 = ms.stride(0), p.ms1 = ms.stride(1);
  p.tanh_rows = aten_tanh<T>;
  over_rows<T>(for_type<T>(v.forward_f, v.forward_d), p, batch, width);
}

template <typename T>
void backward_impl(const Variant& v, const at::Tensor& grad_hs, const at::Tensor& grad_ms,
                   const at::Tensor& hs, const at::Tensor& w_mh, const at::Tensor& w_hm,
                   const at::Tensor& w_mm, int64_t nonlinearity, at::Tensor& grads,
                   at::Tensor& grad_m0) {
  BackwardArgs<T> p{};
  set_sizes<T>(p, v, hs.size(0), hs.size(2), w_mm.size(0), nonlinearity);
  const int64_t batch = hs.size(1), width = std::max(p.h_pad, p.m_pad);
  T* w_dm = buffer<T>(0, p.memory * p.h_pad);  // W^hm: (M, h_pad)
  pack<T>(w_hm, w_dm, Panels{p.memory, p.h_pad, panel_width<T>(v)}, 0, 0, p.h_pad);
  T* w_dprev = buffer<T>(1, (p.hidden + p.memory) * p.m_pad);  // [W^mh; W^mm]: (H + M, m_pad)
  const Panels dprev{p.hidden + p.memory, p.m_pad, panel_width<T>(v)};
  pack<T>(w_mh, w_dprev, dprev, 0, 0, p.m_pad);
  pack<T>(w_mm, w_dprev, dprev, p.hidden, 0, p.m_pad);
  p.w_dm = w_dm;
  p.w_dprev = w_dprev;
  if (grad_hs.defined())
    p.gh = grad_hs.data_ptr<T>(), p.ghs0 = grad_hs.stride(0), p.ghs1 = grad_hs.stride(1);
  if (grad_ms.defined())
    p.gm = grad_ms.data_ptr<T>(), p.gms0 = grad_ms.stride(0), p.gms1 = grad_ms.stride(1);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.g = grads.data_ptr<T>(), p.gs0 = grads.stride(0), p.gs1 = grads.stride(1);
  p.g0 = grad_m0.data_ptr<T>(), p.g0s = grad_m0.stride(0);
  over_rows<T>(for_type<T>(v.backward_f, v.backward_d), p, batch, width);
}

// hs, ms: outputs (T, B, H) and (T, B, M), any layout with a contiguous last dimension.
void forward(at::Tensor x_proj, at::Tensor m0, at::Tensor w_mh, at::Tensor w_hm,
             at::Tensor w_mm, at::Tensor bias_m, int64_t nonlinearity, at::Tensor hs,
             at::Tensor ms, const std::string& variant) {
  const Variant& v = variant_named(variant);
  for (auto* t : {&x_proj, &m0, &hs, &ms}) check_rows(*t, "LMN recurrence operand");
  TORCH_CHECK(x_proj.dim() == 3 && m0.dim() == 2, "x_proj must be (T, B, H), m0 (B, M)");
  if (x_proj.size(0) == 0 || x_proj.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(x_proj.scalar_type(), "lmn_forward", [&] {
    forward_impl<scalar_t>(v, x_proj, m0, w_mh, w_hm, w_mm, bias_m, nonlinearity, hs, ms);
  });
}

// grads: output (T, B, H + M); grad_m0: output (B, M); grad_hs / grad_ms may be undefined.
void backward(c10::optional<at::Tensor> grad_hs, c10::optional<at::Tensor> grad_ms,
              at::Tensor hs, at::Tensor w_mh, at::Tensor w_hm, at::Tensor w_mm,
              int64_t nonlinearity, at::Tensor grads, at::Tensor grad_m0,
              const std::string& variant) {
  const Variant& v = variant_named(variant);
  at::Tensor gh = grad_hs.has_value() ? *grad_hs : at::Tensor();
  at::Tensor gm = grad_ms.has_value() ? *grad_ms : at::Tensor();
  for (auto* t : {&gh, &gm, &hs, &grads, &grad_m0})
    if (t->defined()) check_rows(*t, "LMN recurrence gradient");
  if (hs.size(0) == 0 || hs.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "lmn_backward", [&] {
    backward_impl<scalar_t>(v, gh, gm, hs, w_mh, w_hm, w_mm, nonlinearity, grads, grad_m0);
  });
}

// ATen's vectorised sigmoid, in place (the GRU's gates): the PyTorch loop's values.
template <typename T>
void aten_sigmoid(T* g, int64_t ld, int64_t rows, int64_t n) {
  at::from_blob(g, {rows, n}, {ld, 1}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value))
      .sigmoid_();
}

template <typename T>
void gru_forward_impl(const Variant& v, const at::Tensor& gi, const at::Tensor& h0,
                      const at::Tensor& weight_hh, const at::Tensor& bias_hh, at::Tensor& hs,
                      at::Tensor& gates, at::Tensor& gh) {
  GruForwardArgs<T> p{};
  p.steps = gi.size(0);
  p.hidden = hs.size(2);
  p.w_pad = padded<T>(3 * p.hidden, v);
  const int64_t batch = gi.size(1);
  p.w = packed<T>(v, weight_hh.t(), p.w_pad);  // W_hh^T: (H, w_pad)
  p.bias = bias_hh.data_ptr<T>();
  p.gi = gi.data_ptr<T>(), p.gis0 = gi.stride(0), p.gis1 = gi.stride(1);
  p.h0 = h0.data_ptr<T>(), p.h0s = h0.stride(0);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.gates = gates.data_ptr<T>(), p.gas0 = gates.stride(0), p.gas1 = gates.stride(1);
  p.gh = gh.data_ptr<T>(), p.ghs0 = gh.stride(0), p.ghs1 = gh.stride(1);
  p.tanh_rows = aten_tanh<T>;
  p.sigmoid_rows = aten_sigmoid<T>;
  over_rows<T>(for_type<T>(v.gru_forward_f, v.gru_forward_d), p, batch, p.w_pad);
}

template <typename T>
void gru_backward_impl(const Variant& v, const at::Tensor& grad_hs, const at::Tensor& h0,
                       const at::Tensor& hs, const at::Tensor& gates, const at::Tensor& gh,
                       const at::Tensor& weight_hh, at::Tensor& d_gh, at::Tensor& d_n,
                       at::Tensor& d_h0) {
  GruBackwardArgs<T> p{};
  p.steps = hs.size(0);
  p.hidden = hs.size(2);
  p.h_pad = padded<T>(p.hidden, v);
  const int64_t batch = hs.size(1);
  p.w = packed<T>(v, weight_hh, p.h_pad);  // W_hh: (3H, h_pad)
  if (grad_hs.defined())
    p.gh_out = grad_hs.data_ptr<T>(), p.gos0 = grad_hs.stride(0), p.gos1 = grad_hs.stride(1);
  p.h0 = h0.data_ptr<T>(), p.h0s = h0.stride(0);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.gates = gates.data_ptr<T>(), p.gas0 = gates.stride(0), p.gas1 = gates.stride(1);
  p.gh = gh.data_ptr<T>(), p.ghs0 = gh.stride(0), p.ghs1 = gh.stride(1);
  p.d_gh = d_gh.data_ptr<T>(), p.dgs0 = d_gh.stride(0), p.dgs1 = d_gh.stride(1);
  p.d_n = d_n.data_ptr<T>(), p.dns0 = d_n.stride(0), p.dns1 = d_n.stride(1);
  p.d_h0 = d_h0.data_ptr<T>(), p.d0s = d_h0.stride(0);
  over_rows<T>(for_type<T>(v.gru_backward_f, v.gru_backward_d), p, batch, p.h_pad);
}

// hs (T, B, H), gates and gh (T, B, 3H): outputs, any layout with a contiguous last dimension.
void gru_forward(at::Tensor gi, at::Tensor h0, at::Tensor weight_hh, at::Tensor bias_hh,
                 at::Tensor hs, at::Tensor gates, at::Tensor gh, const std::string& variant) {
  const Variant& v = variant_named(variant);
  for (auto* t : {&gi, &h0, &bias_hh, &hs, &gates, &gh}) check_rows(*t, "GRU recurrence operand");
  TORCH_CHECK(gi.dim() == 3 && h0.dim() == 2 && gi.size(2) == 3 * h0.size(1),
              "gi must be (T, B, 3H), h0 (B, H)");
  if (gi.size(0) == 0 || gi.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_forward", [&] {
    gru_forward_impl<scalar_t>(v, gi, h0, weight_hh, bias_hh, hs, gates, gh);
  });
}

// d_gh (T, B, 3H), d_n (T, B, H), d_h0 (B, H): outputs; grad_hs may be undefined.
void gru_backward(c10::optional<at::Tensor> grad_hs, at::Tensor h0, at::Tensor hs,
                  at::Tensor gates, at::Tensor gh, at::Tensor weight_hh, at::Tensor d_gh,
                  at::Tensor d_n, at::Tensor d_h0, const std::string& variant) {
  const Variant& v = variant_named(variant);
  at::Tensor go = grad_hs.has_value() ? *grad_hs : at::Tensor();
  for (auto* t : {&go, &h0, &hs, &gates, &gh, &d_gh, &d_n, &d_h0})
    if (t->defined()) check_rows(*t, "GRU recurrence gradient");
  if (hs.size(0) == 0 || hs.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "gru_backward", [&] {
    gru_backward_impl<scalar_t>(v, go, h0, hs, gates, gh, weight_hh, d_gh, d_n, d_h0);
  });
}

template <typename T>
void lstm_forward_impl(const Variant& v, const at::Tensor& gi, const at::Tensor& h0,
                       const at::Tensor& c0, const at::Tensor& weight_hh,
                       const at::Tensor& bias_hh, at::Tensor& hs, at::Tensor& cs,
                       at::Tensor& tcs, at::Tensor& gates) {
  LstmForwardArgs<T> p{};
  p.steps = gi.size(0);
  p.hidden = hs.size(2);
  p.w_pad = padded<T>(4 * p.hidden, v);
  const int64_t batch = gi.size(1);
  p.w = packed<T>(v, weight_hh.t(), p.w_pad);  // W_hh^T: (H, w_pad)
  p.bias = bias_hh.data_ptr<T>();
  p.gi = gi.data_ptr<T>(), p.gis0 = gi.stride(0), p.gis1 = gi.stride(1);
  p.h0 = h0.data_ptr<T>(), p.h0s = h0.stride(0);
  p.c0 = c0.data_ptr<T>(), p.c0s = c0.stride(0);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.c = cs.data_ptr<T>(), p.cs0 = cs.stride(0), p.cs1 = cs.stride(1);
  p.tc = tcs.data_ptr<T>(), p.tcs0 = tcs.stride(0), p.tcs1 = tcs.stride(1);
  p.gates = gates.data_ptr<T>(), p.gas0 = gates.stride(0), p.gas1 = gates.stride(1);
  p.tanh_rows = aten_tanh<T>;
  p.sigmoid_rows = aten_sigmoid<T>;
  over_rows<T>(for_type<T>(v.lstm_forward_f, v.lstm_forward_d), p, batch, p.w_pad);
}

template <typename T>
void lstm_backward_impl(const Variant& v, const at::Tensor& grad_hs, const at::Tensor& grad_cn,
                        const at::Tensor& c0, const at::Tensor& cs, const at::Tensor& tcs,
                        const at::Tensor& gates, const at::Tensor& weight_hh, at::Tensor& d_a,
                        at::Tensor& d_h0, at::Tensor& d_c0) {
  LstmBackwardArgs<T> p{};
  p.steps = cs.size(0);
  p.hidden = cs.size(2);
  p.h_pad = padded<T>(p.hidden, v);
  const int64_t batch = cs.size(1);
  p.w = packed<T>(v, weight_hh, p.h_pad);  // W_hh: (4H, h_pad)
  if (grad_hs.defined())
    p.gh_out = grad_hs.data_ptr<T>(), p.gos0 = grad_hs.stride(0), p.gos1 = grad_hs.stride(1);
  if (grad_cn.defined()) p.gc_last = grad_cn.data_ptr<T>(), p.gcs = grad_cn.stride(0);
  p.c0 = c0.data_ptr<T>(), p.c0s = c0.stride(0);
  p.c = cs.data_ptr<T>(), p.cs0 = cs.stride(0), p.cs1 = cs.stride(1);
  p.tc = tcs.data_ptr<T>(), p.tcs0 = tcs.stride(0), p.tcs1 = tcs.stride(1);
  p.gates = gates.data_ptr<T>(), p.gas0 = gates.stride(0), p.gas1 = gates.stride(1);
  p.d_a = d_a.data_ptr<T>(), p.das0 = d_a.stride(0), p.das1 = d_a.stride(1);
  p.d_h0 = d_h0.data_ptr<T>(), p.dh0s = d_h0.stride(0);
  p.d_c0 = d_c0.data_ptr<T>(), p.dc0s = d_c0.stride(0);
  over_rows<T>(for_type<T>(v.lstm_backward_f, v.lstm_backward_d), p, batch, 2 * p.h_pad);
}

// hs, cs, tcs (T, B, H) and gates (T, B, 4H): outputs, any layout with a contiguous last
// dimension.
void lstm_forward(at::Tensor gi, at::Tensor h0, at::Tensor c0, at::Tensor weight_hh,
                  at::Tensor bias_hh, at::Tensor hs, at::Tensor cs, at::Tensor tcs,
                  at::Tensor gates, const std::string& variant) {
  const Variant& v = variant_named(variant);
  for (auto* t : {&gi, &h0, &c0, &bias_hh, &hs, &cs, &tcs, &gates})
    check_rows(*t, "LSTM recurrence operand");
  TORCH_CHECK(gi.dim() == 3 && h0.dim() == 2 && c0.sizes() == h0.sizes() &&
                  gi.size(2) == 4 * h0.size(1),
              "gi must be (T, B, 4H), h0 and c0 (B, H)");
  if (gi.size(0) == 0 || gi.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "lstm_forward", [&] {
    lstm_forward_impl<scalar_t>(v, gi, h0, c0, weight_hh, bias_hh, hs, cs, tcs, gates);
  });
}

// d_a (T, B, 4H), d_h0 and d_c0 (B, H): outputs; grad_hs and grad_cn may be undefined.
void lstm_backward(c10::optional<at::Tensor> grad_hs, c10::optional<at::Tensor> grad_cn,
                   at::Tensor c0, at::Tensor cs, at::Tensor tcs, at::Tensor gates,
                   at::Tensor weight_hh, at::Tensor d_a, at::Tensor d_h0, at::Tensor d_c0,
                   const std::string& variant) {
  const Variant& v = variant_named(variant);
  at::Tensor go = grad_hs.has_value() ? *grad_hs : at::Tensor();
  at::Tensor gc = grad_cn.has_value() ? *grad_cn : at::Tensor();
  for (auto* t : {&go, &gc, &c0, &cs, &tcs, &gates, &d_a, &d_h0, &d_c0})
    if (t->defined()) check_rows(*t, "LSTM recurrence gradient");
  if (cs.size(0) == 0 || cs.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(cs.scalar_type(), "lstm_backward", [&] {
    lstm_backward_impl<scalar_t>(v, go, gc, c0, cs, tcs, gates, weight_hh, d_a, d_h0, d_c0);
  });
}

template <typename T>
void rnn_forward_impl(const Variant& v, const at::Tensor& gi, const at::Tensor& h0,
                      const at::Tensor& weight_hh, const at::Tensor& bias_hh,
                      int64_t nonlinearity, at::Tensor& hs) {
  RnnForwardArgs<T> p{};
  p.steps = gi.size(0);
  p.hidden = hs.size(2);
  p.h_pad = padded<T>(p.hidden, v);
  p.nonlinearity = nonlinearity;
  const int64_t batch = gi.size(1);
  p.w = packed<T>(v, weight_hh.t(), p.h_pad);  // W_hh^T: (H, h_pad)
  p.bias = bias_hh.data_ptr<T>();
  p.gi = gi.data_ptr<T>(), p.gis0 = gi.stride(0), p.gis1 = gi.stride(1);
  p.h0 = h0.data_ptr<T>(), p.h0s = h0.stride(0);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.tanh_rows = aten_tanh<T>;
  over_rows<T>(for_type<T>(v.rnn_forward_f, v.rnn_forward_d), p, batch, p.h_pad);
}

template <typename T>
void rnn_backward_impl(const Variant& v, const at::Tensor& grad_hs, const at::Tensor& hs,
                       const at::Tensor& weight_hh, int64_t nonlinearity, at::Tensor& d_a,
                       at::Tensor& d_h0) {
  RnnBackwardArgs<T> p{};
  p.steps = hs.size(0);
  p.hidden = hs.size(2);
  p.h_pad = padded<T>(p.hidden, v);
  p.nonlinearity = nonlinearity;
  const int64_t batch = hs.size(1);
  p.w = packed<T>(v, weight_hh, p.h_pad);  // W_hh: (H, h_pad)
  if (grad_hs.defined())
    p.gh_out = grad_hs.data_ptr<T>(), p.gos0 = grad_hs.stride(0), p.gos1 = grad_hs.stride(1);
  p.h = hs.data_ptr<T>(), p.hs0 = hs.stride(0), p.hs1 = hs.stride(1);
  p.d_a = d_a.data_ptr<T>(), p.das0 = d_a.stride(0), p.das1 = d_a.stride(1);
  p.d_h0 = d_h0.data_ptr<T>(), p.d0s = d_h0.stride(0);
  over_rows<T>(for_type<T>(v.rnn_backward_f, v.rnn_backward_d), p, batch, p.h_pad);
}

// hs (T, B, H): output, any layout with a contiguous last dimension.
void rnn_forward(at::Tensor gi, at::Tensor h0, at::Tensor weight_hh, at::Tensor bias_hh,
                 int64_t nonlinearity, at::Tensor hs, const std::string& variant) {
  const Variant& v = variant_named(variant);
  for (auto* t : {&gi, &h0, &bias_hh, &hs}) check_rows(*t, "RNN recurrence operand");
  TORCH_CHECK(gi.dim() == 3 && h0.dim() == 2 && gi.size(2) == h0.size(1),
              "gi must be (T, B, H), h0 (B, H)");
  if (gi.size(0) == 0 || gi.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "rnn_forward", [&] {
    rnn_forward_impl<scalar_t>(v, gi, h0, weight_hh, bias_hh, nonlinearity, hs);
  });
}

// d_a (T, B, H), d_h0 (B, H): outputs; grad_hs may be undefined.
void rnn_backward(c10::optional<at::Tensor> grad_hs, at::Tensor hs, at::Tensor weight_hh,
                  int64_t nonlinearity, at::Tensor d_a, at::Tensor d_h0,
                  const std::string& variant) {
  const Variant& v = variant_named(variant);
  at::Tensor go = grad_hs.has_value() ? *grad_hs : at::Tensor();
  for (auto* t : {&go, &hs, &d_a, &d_h0})
    if (t->defined()) check_rows(*t, "RNN recurrence gradient");
  if (hs.size(0) == 0 || hs.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "rnn_backward", [&] {
    rnn_backward_impl<scalar_t>(v, go, hs, weight_hh, nonlinearity, d_a, d_h0);
  });
}

template <typename T>
void ulm_forward_impl(const Variant& v, const at::Tensor& x_proj, const at::Tensor& w_time,
                      int64_t nonlinearity, at::Tensor& buf) {
  UlmForwardArgs<T> p{};
  p.steps = x_proj.size(0);
  p.hidden = x_proj.size(2);
  p.k = w_time.size(1) / p.hidden;
  p.h_pad = padded<T>(p.hidden, v);
  p.nonlinearity = nonlinearity;
  const int64_t batch = x_proj.size(1);
  p.w = packed<T>(v, w_time.t(), p.h_pad);  // [W^hh_k ... W^hh_1]^T: (k H, h_pad)
  p.x = x_proj.data_ptr<T>(), p.xs0 = x_proj.stride(0), p.xs1 = x_proj.stride(1);
  p.buf = buf.data_ptr<T>(), p.row = buf.stride(0);
  p.tanh_rows = aten_tanh<T>;
  over_rows<T>(for_type<T>(v.ulm_forward_f, v.ulm_forward_d), p, batch, p.h_pad);
}

template <typename T>
void ulm_backward_impl(const Variant& v, const at::Tensor& buf, const at::Tensor& w_time,
                       int64_t nonlinearity, at::Tensor& d_buf, at::Tensor& d_a) {
  UlmBackwardArgs<T> p{};
  p.steps = d_a.size(1);
  p.hidden = d_a.size(2);
  p.k = w_time.size(1) / p.hidden;
  p.kh_pad = padded<T>(p.k * p.hidden, v);
  p.nonlinearity = nonlinearity;
  const int64_t batch = d_a.size(0);
  p.w = packed<T>(v, w_time, p.kh_pad);  // [W^hh_k ... W^hh_1]: (H, kh_pad)
  p.buf = buf.data_ptr<T>(), p.row = buf.stride(0);
  p.d_buf = d_buf.data_ptr<T>();
  p.d_a = d_a.data_ptr<T>();
  over_rows<T>(for_type<T>(v.ulm_backward_f, v.ulm_backward_d), p, batch, p.kh_pad);
}

// buf (B, k + T, H), contiguous: the k states before the start in, every state out.
void ulm_forward(at::Tensor x_proj, at::Tensor w_time, int64_t nonlinearity, at::Tensor buf,
                 const std::string& variant) {
  const Variant& v = variant_named(variant);
  check_rows(x_proj, "ULM recurrence operand");
  TORCH_CHECK(buf.is_contiguous() && buf.dim() == 3 && x_proj.dim() == 3 &&
                  buf.size(2) == x_proj.size(2) && w_time.size(0) == x_proj.size(2),
              "buf must be a contiguous (B, k + T, H), x_proj (T, B, H)");
  if (x_proj.size(0) == 0 || x_proj.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(x_proj.scalar_type(), "ulm_forward", [&] {
    ulm_forward_impl<scalar_t>(v, x_proj, w_time, nonlinearity, buf);
  });
}

// d_buf (B, k + T, H), contiguous, in/out; d_a (B, T, H), contiguous, out.
void ulm_backward(at::Tensor buf, at::Tensor w_time, int64_t nonlinearity, at::Tensor d_buf,
                  at::Tensor d_a, const std::string& variant) {
  const Variant& v = variant_named(variant);
  TORCH_CHECK(buf.is_contiguous() && d_buf.is_contiguous() && d_a.is_contiguous(),
              "the ULM's buffers must be contiguous");
  if (d_a.size(0) == 0 || d_a.size(1) == 0) return;
  AT_DISPATCH_FLOATING_TYPES(buf.scalar_type(), "ulm_backward", [&] {
    ulm_backward_impl<scalar_t>(v, buf, w_time, nonlinearity, d_buf, d_a);
  });
}

// The sum of `data` (contiguous float32) read `repeats` times by `variant`'s loads
// (Variant::stream_read_f): the caller times it for the cache's streaming rate.
double stream_read(at::Tensor data, int64_t repeats, const std::string& variant) {
  const Variant& v = variant_named(variant);
  TORCH_CHECK(data.is_contiguous() && data.scalar_type() == at::kFloat && data.device().is_cpu(),
              "stream_read needs a contiguous float32 CPU tensor");
  return v.stream_read_f(data.data_ptr<float>(), data.numel(), repeats);
}

// `data` (contiguous float32) through `variant`'s tanh, in place: what its float32 loops apply.
void tanh_(at::Tensor data, const std::string& variant) {
  const Variant& v = variant_named(variant);
  TORCH_CHECK(data.is_contiguous() && data.scalar_type() == at::kFloat && data.device().is_cpu(),
              "tanh_ needs a contiguous float32 CPU tensor");
  v.tanh_f(data.data_ptr<float>(), data.numel());
}

}  // namespace
}  // namespace linmem

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &linmem::forward, "LMN recurrence, forward (eqs. 6-7)",
        py::call_guard<py::gil_scoped_release>());
  m.def("backward", &linmem::backward, "LMN recurrence, backward through time",
        py::call_guard<py::gil_scoped_release>());
  m.def("gru_forward", &linmem::gru_forward, "GRU recurrence, forward (linmem.nn.rnns)",
        py::call_guard<py::gil_scoped_release>());
  m.def("gru_backward", &linmem::gru_backward, "GRU recurrence, backward through time",
        py::call_guard<py::gil_scoped_release>());
  m.def("lstm_forward", &linmem::lstm_forward, "LSTM recurrence, forward (linmem.nn.rnns)",
        py::call_guard<py::gil_scoped_release>());
  m.def("lstm_backward", &linmem::lstm_backward, "LSTM recurrence, backward through time",
        py::call_guard<py::gil_scoped_release>());
  m.def("rnn_forward", &linmem::rnn_forward, "Elman RNN recurrence, forward (linmem.nn.rnns)",
        py::call_guard<py::gil_scoped_release>());
  m.def("rnn_backward", &linmem::rnn_backward, "Elman RNN recurrence, backward through time",
        py::call_guard<py::gil_scoped_release>());
  m.def("ulm_forward", &linmem::ulm_forward, "unrolled network's recurrence, forward (eq. 10)",
        py::call_guard<py::gil_scoped_release>());
  m.def("ulm_backward", &linmem::ulm_backward, "unrolled network's recurrence, backward",
        py::call_guard<py::gil_scoped_release>());
  m.def("stream_read", &linmem::stream_read,
        "a float32 tensor read `repeats` times by a variant's loads (a cache's streaming rate)",
        py::call_guard<py::gil_scoped_release>());
  m.def("tanh_", &linmem::tanh_, "a variant's float32 tanh, in place (what its loops apply)",
        py::call_guard<py::gil_scoped_release>());
  m.def("variants", &linmem::variants,
        "the kernel variants compiled here that this CPU can run, best first");
}
