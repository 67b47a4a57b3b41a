// The LMN recurrence (paper eqs. 6-7) and its backward through time for the rows [b0, b1) of a
// batch, and at the end those of the GRU, the LSTM and the Elman RNN (linmem.nn.rnns) and of the
// ULM (eq. 10): the inner loops of csrc/lmn_cpu.cpp, which splits the batch over threads, packs
// the weights and calls one of the variants compiled from this file.
//
// Each variant is this file compiled for one instruction set (lmn_kernel_avx512.cpp,
// lmn_kernel_avx2.cpp, lmn_kernel_generic.cpp) with the vector width and register tile that
// fit that instruction set's register file: the tile's accumulators, one row of the packed
// weights and a broadcast must all live in registers, or every product spills to memory.
//   avx512:  64-byte vectors, 32 registers: 6 rows x 4 vectors (24 accumulators + 4 + 1)
//   avx2:    32-byte vectors, 16 registers: 6 rows x 2 vectors (12 + 2 + 1)
//   generic: 16-byte vectors (SSE2 on x86-64: 16 registers, 6 x 2; NEON on aarch64: 32, 6 x 4)
// The packed weights lie in panels as wide as the tile (LMN_VECS vectors), each panel's rows
// together, so that a tile streams through contiguous memory (a row-major layout made every
// step of the inner loop touch another page once rows reach a few KB: an LMN-B training step
// 1.26-1.41x slower at (250,250)-(250,500) on an AVX2 AMD EPYC, results/speed).
// The including file defines LMN_VARIANT (a namespace), LMN_VEC_BYTES, LMN_ROWS, LMN_VECS.
// Nothing here includes a standard library header with code in it, so no inline function
// compiled for one instruction set can be shared with (and run by) another variant.
//
// Forward, per step, for the rows of one thread:
//   [a_t | s_t] = m_{t-1} [W^mh^T | W^mm^T]            one product, m_{t-1} read once
//   h_t = sigma(x_proj_t + a_t)                          (6)
//   m_t = b^m + s_t + h_t W^hm^T                         (7)
// Backward, per step (g_t = [dL/da_t, dL/dm_t], the layout of linmem.ops.lmn_scan):
//   dL/da_t = (grad_h_t + dL/dm_t W^hm) * sigma'(a_t)
//   dL/dm_{t-1} = grad_m_{t-1} + g_t [W^mh; W^mm]
#pragma once

#include "lmn_kernel_api.h"

namespace linmem {
namespace LMN_VARIANT {
namespace {

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(LMN_VEC_BYTES)));
  static constexpr int64_t lanes = LMN_VEC_BYTES / sizeof(T);
};

template <typename T>
inline typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
inline void store(T* p, typename Vec<T>::type v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// C[0:R, 0:NV*lanes] (+)= A[0:R, 0:K] B[0:K, 0:NV*lanes]; B is packed (row stride ldb).
template <typename T, int R, int NV>
void tile(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t k_size, T* c, int64_t ldc,
          bool accumulate) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = Vec<T>::lanes;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = accumulate ? load<T>(c + r * ldc + j * L) : V{};
  for (int64_t k = 0; k < k_size; ++k) {
    V bk[NV];
    for (int j = 0; j < NV; ++j) bk[j] = load<T>(b + k * ldb + j * L);
    for (int r = 0; r < R; ++r) {
      const T ark = a[r * lda + k];
      for (int j = 0; j < NV; ++j) acc[r][j] += ark * bk[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) store<T>(c + r * ldc + j * L, acc[r][j]);
}

// The last `R` (< LMN_ROWS) rows: one tile of R rows.
template <typename T, int NV, int R = LMN_ROWS - 1>
void remainder_rows(int64_t rest, const T* a, int64_t lda, int64_t k_size, const T* b,
                    int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if constexpr (R > 0) {
    if (rest == R) return tile<T, R, NV>(a, lda, b, ldb, k_size, c, ldc, accumulate);
    remainder_rows<T, NV, R - 1>(rest, a, lda, k_size, b, ldb, c, ldc, accumulate);
  }
}

template <typename T, int NV>
void row_tiles(const T* a, int64_t lda, int64_t rows, int64_t k_size, const T* b, int64_t ldb,
               T* c, int64_t ldc, bool accumulate) {
  int64_t r = 0;
  for (; r + LMN_ROWS <= rows; r += LMN_ROWS)
    tile<T, LMN_ROWS, NV>(a + r * lda, lda, b, ldb, k_size, c + r * ldc, ldc, accumulate);
  remainder_rows<T, NV>(rows - r, a + r * lda, lda, k_size, b, ldb, c + r * ldc, ldc,
                        accumulate);
}

// The last `NV` (< LMN_VECS) vectors of columns.
template <typename T, int NV = LMN_VECS - 1>
void remainder_vectors(int64_t rest, const T* a, int64_t lda, int64_t rows, int64_t k_size,
                       const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if constexpr (NV > 0) {
    if (rest == NV) return row_tiles<T, NV>(a, lda, rows, k_size, b, ldb, c, ldc, accumulate);
    remainder_vectors<T, NV - 1>(rest, a, lda, rows, k_size, b, ldb, c, ldc, accumulate);
  }
}

// One row of C (batch 1: a vector times the packed matrix) over G whole panels at once. Each
// weight is read once and used once, so the product is bound by streaming the weights from
// cache; a one-row tile holds LMN_VECS accumulators, each a chain of K dependent multiply-adds,
// and waits on their latency. G panels make G x LMN_VECS independent chains (G = 4: avx512 16
// accumulators of 32 registers, avx2 and SSE2 8 of 16), each column still summed over k in
// order, so every value is the one-row tile's, bit for bit.
template <typename T, int G = 4>
void one_row_panels(const T* a, int64_t k_size, const T* b, T* c, bool accumulate) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = Vec<T>::lanes, P = LMN_VECS * L;
  V acc[G][LMN_VECS];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < LMN_VECS; ++j)
      acc[g][j] = accumulate ? load<T>(c + g * P + j * L) : V{};
  for (int64_t k = 0; k < k_size; ++k) {
    const T ak = a[k];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < LMN_VECS; ++j)
        acc[g][j] += ak * load<T>(b + g * P * k_size + k * P + j * L);
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < LMN_VECS; ++j) store<T>(c + g * P + j * L, acc[g][j]);
}

// C (rows x n_pad) (+)= A (rows x K, row stride lda) B (K x n_pad, packed in panels: the
// columns [n, n + P) of every row, P = LMN_VECS vectors (fewer in the last panel), lie together
// at b + n K, so that a tile reads its K x P panel in one contiguous stream; csrc/lmn_cpu.cpp's
// `pack` writes this layout).
template <typename T>
void gemm(const T* a, int64_t lda, int64_t rows, int64_t k_size, const T* b, int64_t n_pad,
          T* c, int64_t ldc, bool accumulate) {
  constexpr int64_t L = Vec<T>::lanes, P = LMN_VECS * L;
  constexpr int G = 4;
  int64_t n = 0;
  if (rows == 1)
    for (; n + G * P <= n_pad; n += G * P)
      one_row_panels<T, G>(a, k_size, b + n * k_size, c + n, accumulate);
  for (; n + P <= n_pad; n += P)
    row_tiles<T, LMN_VECS>(a, lda, rows, k_size, b + n * k_size, P, c + n, ldc, accumulate);
  remainder_vectors<T>((n_pad - n) / L, a, lda, rows, k_size, b + n * k_size, n_pad - n, c + n,
                       ldc, accumulate);
}

// tanh of float32 vectors, Cephes' tanhf vectorised: below |x| = 0.625 the odd polynomial
// x + x^3 P(x^2); above, 1 - 2 / (exp(2|x|) + 1), exp by Cephes' expf (2|x| = n ln 2 + r, a
// degree-6 polynomial in r, times 2^n written into the exponent's bits), |x| clamped at 20
// where tanh is 1 in float32 (from 9.01 on). Within 2 units in the last place of the correctly
// rounded tanh (1.32 measured, tests/test_nn.py: every 7th float32 of a range); NaN stays NaN,
// +-inf gives +-1. The float32 kernel's own, in place of a call into ATen's per step: that
// call (a Tensor made, dispatched) cost 2.2 us of a 15 us batch-1 step at (250, 250) and most
// of a step at 50 units; float64 keeps ATen's (the reference the tests hold the kernel to).
typedef int32_t IVec __attribute__((vector_size(LMN_VEC_BYTES)));
typedef typename Vec<float>::type FVec;

inline FVec tanh_vec(FVec x) {
  IVec bits;
  __builtin_memcpy(&bits, &x, sizeof(x));
  const IVec sign = bits & static_cast<int32_t>(0x80000000u);
  const IVec abs_bits = bits & 0x7fffffff;
  FVec ax;
  __builtin_memcpy(&ax, &abs_bits, sizeof(ax));
  const FVec y = 2.0f * (ax < 20.0f ? ax : FVec{} + 20.0f);
  const FVec n = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(y / ln 2)
  FVec r = y - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const FVec poly = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
                       + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f);
  const IVec exponent = (__builtin_convertvector(n, IVec) + 127) << 23;
  FVec two_n;
  __builtin_memcpy(&two_n, &exponent, sizeof(two_n));
  const FVec e = (poly * (r * r) + r + 1.0f) * two_n;  // exp(2|x|)
  const FVec large = 1.0f - 2.0f / (e + 1.0f);
  const FVec z = ax * ax;
  const FVec small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                       + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * ax + ax;
  const FVec magnitude = ax < 0.625f ? small : large;  // tanh(|x|), then x's sign (-0 too)
  IVec out_bits;
  __builtin_memcpy(&out_bits, &magnitude, sizeof(magnitude));
  out_bits |= sign;
  FVec out;
  __builtin_memcpy(&out, &out_bits, sizeof(out));
  return x != x ? x : out;
}

// tanh of `n` float32 values in place, whole vectors, then the rest through one vector.
inline void tanh_row(float* row, int64_t n) {
  constexpr int64_t L = Vec<float>::lanes;
  int64_t j = 0;
  for (; j + L <= n; j += L) store<float>(row + j, tanh_vec(load<float>(row + j)));
  if (j < n) {
    FVec rest{};
    __builtin_memcpy(&rest, row + j, (n - j) * sizeof(float));
    rest = tanh_vec(rest);
    __builtin_memcpy(row + j, &rest, (n - j) * sizeof(float));
  }
}

inline float expm1_of(float v) { return __builtin_expm1f(v); }
inline double expm1_of(double v) { return __builtin_expm1(v); }

// h = sigma(h) for `rows` rows of `n` values (row stride ld).
template <typename T>
void activate(T* h, int64_t ld, int64_t rows, int64_t n, int64_t nonlinearity,
              RowsFn<T> tanh_rows) {
  if (nonlinearity == kTanh) {
    if constexpr (sizeof(T) == sizeof(float)) {
      for (int64_t r = 0; r < rows; ++r) tanh_row(h + r * ld, n);
      return;
    } else {
      return tanh_rows(h, ld, rows, n);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* row = h + r * ld;
    if (nonlinearity == kRelu) {
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] > T(0) ? row[j] : T(0);
    } else {
      for (int64_t j = 0; j < n; ++j)
        row[j] = row[j] > T(0) ? T(kSeluScale) * row[j]
                               : T(kSeluScale * kSeluAlpha) * expm1_of(row[j]);
    }
  }
}

// sigma'(a) from h = sigma(a).
template <typename T>
inline T derivative(T h, int64_t nonlinearity) {
  if (nonlinearity == kTanh) return T(1) - h * h;
  if (nonlinearity == kRelu) return h > T(0) ? T(1) : T(0);
  return h > T(0) ? T(kSeluScale) : h + T(kSeluScale * kSeluAlpha);
}

template <typename T>
void forward_rows(const ForwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, width = p.h_pad + p.m_pad;
  const T* m_prev = p.m0 + b0 * p.m0s;
  int64_t m_prev_ld = p.m0s;
  for (int64_t t = 0; t < p.steps; ++t) {
    const T* x_t = p.x + t * p.xs0 + b0 * p.xs1;
    T* h_t = p.h + t * p.hs0 + b0 * p.hs1;
    T* m_t = p.m + t * p.ms0 + b0 * p.ms1;
    gemm<T>(m_prev, m_prev_ld, rows, p.memory, p.w_first, width, s, width, false);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < p.hidden; ++j)
        h_t[r * p.hs1 + j] = x_t[r * p.xs1 + j] + s[r * width + j];
    activate<T>(h_t, p.hs1, rows, p.hidden, p.nonlinearity, p.tanh_rows);       // (6)
    gemm<T>(h_t, p.hs1, rows, p.hidden, p.w_second, p.m_pad, s + p.h_pad, width, true);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < p.memory; ++j)
        m_t[r * p.ms1 + j] = p.bias[j] + s[r * width + p.h_pad + j];             // (7)
    m_prev = m_t;
    m_prev_ld = p.ms1;
  }
}

template <typename T>
void backward_rows(const BackwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, hidden = p.hidden, memory = p.memory;
  const int64_t width = p.h_pad > p.m_pad ? p.h_pad : p.m_pad;
  const bool has_gh = p.gh != nullptr, has_gm = p.gm != nullptr;
  T* g_last = p.g + (p.steps - 1) * p.gs0 + b0 * p.gs1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < memory; ++j)
      g_last[r * p.gs1 + hidden + j] =
          has_gm ? p.gm[(p.steps - 1) * p.gms0 + (b0 + r) * p.gms1 + j] : T(0);
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    T* g_t = p.g + t * p.gs0 + b0 * p.gs1;
    const T* h_t = p.h + t * p.hs0 + b0 * p.hs1;
    gemm<T>(g_t + hidden, p.gs1, rows, memory, p.w_dm, p.h_pad, s, width, false);
    for (int64_t r = 0; r < rows; ++r) {
      const T* gh_r = has_gh ? p.gh + t * p.ghs0 + (b0 + r) * p.ghs1 : nullptr;
      for (int64_t j = 0; j < hidden; ++j) {
        const T total = has_gh ? s[r * width + j] + gh_r[j] : s[r * width + j];
        g_t[r * p.gs1 + j] = total * derivative<T>(h_t[r * p.hs1 + j], p.nonlinearity);
      }
    }
    gemm<T>(g_t, p.gs1, rows, hidden + memory, p.w_dprev, p.m_pad, s, width, false);
    if (t == 0) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < memory; ++j) p.g0[(b0 + r) * p.g0s + j] = s[r * width + j];
    } else {
      T* g_prev = p.g + (t - 1) * p.gs0 + b0 * p.gs1 + hidden;
      for (int64_t r = 0; r < rows; ++r) {
        const T* gm_r = has_gm ? p.gm + (t - 1) * p.gms0 + (b0 + r) * p.gms1 : nullptr;
        for (int64_t j = 0; j < memory; ++j)
          g_prev[r * p.gs1 + j] = has_gm ? s[r * width + j] + gm_r[j] : s[r * width + j];
      }
    }
  }
}

// The GRU (linmem.nn.rnns), forward, per step, for the rows of one thread:
//   gh_t = h_{t-1} W_hh^T + b_hh                         one product
//   r_t, z_t = sigmoid(gi_t + gh_t)   (their 2H columns)
//   n_t = tanh(gi_n + r_t * gh_n)
//   h_t = n_t + z_t (h_{t-1} - n_t)                      = (1 - z_t) n_t + z_t h_{t-1}
template <typename T>
void gru_forward_rows(const GruForwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, H = p.hidden, W = p.w_pad;
  const T* h_prev = p.h0 + b0 * p.h0s;
  int64_t h_prev_ld = p.h0s;
  for (int64_t t = 0; t < p.steps; ++t) {
    const T* gi_t = p.gi + t * p.gis0 + b0 * p.gis1;
    T* gh_t = p.gh + t * p.ghs0 + b0 * p.ghs1;
    T* g_t = p.gates + t * p.gas0 + b0 * p.gas1;
    T* h_t = p.h + t * p.hs0 + b0 * p.hs1;
    gemm<T>(h_prev, h_prev_ld, rows, H, p.w, W, s, W, false);
    for (int64_t r = 0; r < rows; ++r) {
      T* gh_r = gh_t + r * p.ghs1;
      T* g_r = g_t + r * p.gas1;
      const T* gi_r = gi_t + r * p.gis1;
      for (int64_t j = 0; j < 3 * H; ++j) gh_r[j] = s[r * W + j] + p.bias[j];
      for (int64_t j = 0; j < 2 * H; ++j) g_r[j] = gi_r[j] + gh_r[j];
    }
    p.sigmoid_rows(g_t, p.gas1, rows, 2 * H);
    for (int64_t r = 0; r < rows; ++r) {
      const T* gh_r = gh_t + r * p.ghs1;
      const T* gi_r = gi_t + r * p.gis1;
      T* g_r = g_t + r * p.gas1;
      for (int64_t j = 0; j < H; ++j) g_r[2 * H + j] = gi_r[2 * H + j] + g_r[j] * gh_r[2 * H + j];
    }
    p.tanh_rows(g_t + 2 * H, p.gas1, rows, H);
    for (int64_t r = 0; r < rows; ++r) {
      const T* g_r = g_t + r * p.gas1;
      const T* hp_r = h_prev + r * h_prev_ld;
      T* h_r = h_t + r * p.hs1;
      for (int64_t j = 0; j < H; ++j) {
        const T n = g_r[2 * H + j];
        h_r[j] = n + g_r[H + j] * (hp_r[j] - n);
      }
    }
    h_prev = h_t;
    h_prev_ld = p.hs1;
  }
}

// The GRU, backward, per step (dh: dL/dh_t, from the output and from step t + 1):
//   dL/d(n's pre-activation) = dh (1 - z) (1 - n^2)                          (= dL/d gi_n)
//   d_gh = [dn gh_n r (1 - r), dh (h_{t-1} - n) z (1 - z), dn r]    (r's and z's = dL/d gi)
//   dL/dh_{t-1} = dh z + d_gh W_hh
template <typename T>
void gru_backward_rows(const GruBackwardArgs<T>& p, int64_t b0, int64_t b1, T* dh) {
  const int64_t rows = b1 - b0, H = p.hidden, hp = p.h_pad;
  for (int64_t i = 0; i < rows * hp; ++i) dh[i] = T(0);
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    const T* g_t = p.gates + t * p.gas0 + b0 * p.gas1;
    const T* gh_t = p.gh + t * p.ghs0 + b0 * p.ghs1;
    const T* h_prev = t > 0 ? p.h + (t - 1) * p.hs0 + b0 * p.hs1 : p.h0 + b0 * p.h0s;
    const int64_t h_prev_ld = t > 0 ? p.hs1 : p.h0s;
    T* dg_t = p.d_gh + t * p.dgs0 + b0 * p.dgs1;
    T* dn_t = p.d_n + t * p.dns0 + b0 * p.dns1;
    for (int64_t r = 0; r < rows; ++r) {
      const T* g_r = g_t + r * p.gas1;
      const T* gh_r = gh_t + r * p.ghs1;
      const T* hp_r = h_prev + r * h_prev_ld;
      const T* go_r = p.gh_out ? p.gh_out + t * p.gos0 + (b0 + r) * p.gos1 : nullptr;
      T* dg_r = dg_t + r * p.dgs1;
      T* dn_r = dn_t + r * p.dns1;
      T* dh_r = dh + r * hp;
      for (int64_t j = 0; j < H; ++j) {
        const T d = go_r ? dh_r[j] + go_r[j] : dh_r[j];
        const T rr = g_r[j], z = g_r[H + j], n = g_r[2 * H + j];
        const T dn = d * (T(1) - z) * (T(1) - n * n);
        dn_r[j] = dn;
        dg_r[j] = dn * gh_r[2 * H + j] * rr * (T(1) - rr);
        dg_r[H + j] = d * (hp_r[j] - n) * z * (T(1) - z);
        dg_r[2 * H + j] = dn * rr;
        dh_r[j] = d * z;
      }
    }
    gemm<T>(dg_t, p.dgs1, rows, 3 * H, p.w, hp, dh, hp, true);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < H; ++j) p.d_h0[(b0 + r) * p.d0s + j] = dh[r * hp + j];
}

// The LSTM (linmem.nn.rnns), forward, per step, for the rows of one thread:
//   a_t = h_{t-1} W_hh^T + b_hh + gi_t                   one product
//   i_t, f_t, o_t = sigmoid(their H columns of a_t),  g_t = tanh(its H columns)
//   c_t = f_t c_{t-1} + i_t g_t,  h_t = o_t tanh(c_t)
template <typename T>
void lstm_forward_rows(const LstmForwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, H = p.hidden, W = p.w_pad;
  const T* h_prev = p.h0 + b0 * p.h0s;
  const T* c_prev = p.c0 + b0 * p.c0s;
  int64_t h_prev_ld = p.h0s, c_prev_ld = p.c0s;
  for (int64_t t = 0; t < p.steps; ++t) {
    const T* gi_t = p.gi + t * p.gis0 + b0 * p.gis1;
    T* g_t = p.gates + t * p.gas0 + b0 * p.gas1;
    T* h_t = p.h + t * p.hs0 + b0 * p.hs1;
    T* c_t = p.c + t * p.cs0 + b0 * p.cs1;
    T* tc_t = p.tc + t * p.tcs0 + b0 * p.tcs1;
    gemm<T>(h_prev, h_prev_ld, rows, H, p.w, W, s, W, false);
    for (int64_t r = 0; r < rows; ++r) {
      const T* gi_r = gi_t + r * p.gis1;
      T* g_r = g_t + r * p.gas1;
      for (int64_t j = 0; j < 4 * H; ++j) g_r[j] = s[r * W + j] + p.bias[j] + gi_r[j];
    }
    p.sigmoid_rows(g_t, p.gas1, rows, 2 * H);          // i, f
    p.tanh_rows(g_t + 2 * H, p.gas1, rows, H);         // g
    p.sigmoid_rows(g_t + 3 * H, p.gas1, rows, H);      // o
    for (int64_t r = 0; r < rows; ++r) {
      const T* g_r = g_t + r * p.gas1;
      const T* cp_r = c_prev + r * c_prev_ld;
      T* c_r = c_t + r * p.cs1;
      T* tc_r = tc_t + r * p.tcs1;
      for (int64_t j = 0; j < H; ++j) {
        c_r[j] = g_r[H + j] * cp_r[j] + g_r[j] * g_r[2 * H + j];
        tc_r[j] = c_r[j];
      }
    }
    p.tanh_rows(tc_t, p.tcs1, rows, H);
    for (int64_t r = 0; r < rows; ++r) {
      const T* g_r = g_t + r * p.gas1;
      const T* tc_r = tc_t + r * p.tcs1;
      T* h_r = h_t + r * p.hs1;
      for (int64_t j = 0; j < H; ++j) h_r[j] = g_r[3 * H + j] * tc_r[j];
    }
    h_prev = h_t, h_prev_ld = p.hs1;
    c_prev = c_t, c_prev_ld = p.cs1;
  }
}

// The LSTM, backward, per step from the last (dh: dL/dh_t from the output and from step t + 1,
// dc: dL/dc_t from step t + 1 and, at the last step, from c_T):
//   dc += dh o (1 - tanh(c)^2)
//   da = [dc g i (1 - i), dc c_{t-1} f (1 - f), dc i (1 - g^2), dh tanh(c) o (1 - o)]
//   dL/dc_{t-1} = dc f,  dL/dh_{t-1} = da W_hh
template <typename T>
void lstm_backward_rows(const LstmBackwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, H = p.hidden, hp = p.h_pad;
  T* dh = s;
  T* dc = s + rows * hp;
  for (int64_t i = 0; i < rows * hp; ++i) dh[i] = T(0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < H; ++j)
      dc[r * hp + j] = p.gc_last ? p.gc_last[(b0 + r) * p.gcs + j] : T(0);
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    const T* g_t = p.gates + t * p.gas0 + b0 * p.gas1;
    const T* tc_t = p.tc + t * p.tcs0 + b0 * p.tcs1;
    const T* c_prev = t > 0 ? p.c + (t - 1) * p.cs0 + b0 * p.cs1 : p.c0 + b0 * p.c0s;
    const int64_t c_prev_ld = t > 0 ? p.cs1 : p.c0s;
    T* da_t = p.d_a + t * p.das0 + b0 * p.das1;
    for (int64_t r = 0; r < rows; ++r) {
      const T* g_r = g_t + r * p.gas1;
      const T* tc_r = tc_t + r * p.tcs1;
      const T* cp_r = c_prev + r * c_prev_ld;
      const T* go_r = p.gh_out ? p.gh_out + t * p.gos0 + (b0 + r) * p.gos1 : nullptr;
      T* da_r = da_t + r * p.das1;
      T* dh_r = dh + r * hp;
      T* dc_r = dc + r * hp;
      for (int64_t j = 0; j < H; ++j) {
        const T d = go_r ? dh_r[j] + go_r[j] : dh_r[j];
        const T i = g_r[j], f = g_r[H + j], g = g_r[2 * H + j], o = g_r[3 * H + j];
        const T tc = tc_r[j];
        const T dct = dc_r[j] + d * o * (T(1) - tc * tc);
        da_r[j] = dct * g * i * (T(1) - i);
        da_r[H + j] = dct * cp_r[j] * f * (T(1) - f);
        da_r[2 * H + j] = dct * i * (T(1) - g * g);
        da_r[3 * H + j] = d * tc * o * (T(1) - o);
        dc_r[j] = dct * f;
      }
    }
    gemm<T>(da_t, p.das1, rows, 4 * H, p.w, hp, dh, hp, false);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < H; ++j) {
      p.d_h0[(b0 + r) * p.dh0s + j] = dh[r * hp + j];
      p.d_c0[(b0 + r) * p.dc0s + j] = dc[r * hp + j];
    }
}

// The Elman RNN (linmem.nn.rnns), forward, per step: h_t = sigma(gi_t + b_hh + h_{t-1} W_hh^T).
template <typename T>
void rnn_forward_rows(const RnnForwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, H = p.hidden, hp = p.h_pad;
  const T* h_prev = p.h0 + b0 * p.h0s;
  int64_t h_prev_ld = p.h0s;
  for (int64_t t = 0; t < p.steps; ++t) {
    const T* gi_t = p.gi + t * p.gis0 + b0 * p.gis1;
    T* h_t = p.h + t * p.hs0 + b0 * p.hs1;
    gemm<T>(h_prev, h_prev_ld, rows, H, p.w, hp, s, hp, false);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < H; ++j)
        h_t[r * p.hs1 + j] = s[r * hp + j] + p.bias[j] + gi_t[r * p.gis1 + j];
    activate<T>(h_t, p.hs1, rows, H, p.nonlinearity, p.tanh_rows);
    h_prev = h_t;
    h_prev_ld = p.hs1;
  }
}

// The Elman RNN, backward, per step: dL/da_t = dh_t sigma'(a_t), dL/dh_{t-1} = dL/da_t W_hh.
template <typename T>
void rnn_backward_rows(const RnnBackwardArgs<T>& p, int64_t b0, int64_t b1, T* dh) {
  const int64_t rows = b1 - b0, H = p.hidden, hp = p.h_pad;
  for (int64_t i = 0; i < rows * hp; ++i) dh[i] = T(0);
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    const T* h_t = p.h + t * p.hs0 + b0 * p.hs1;
    T* da_t = p.d_a + t * p.das0 + b0 * p.das1;
    for (int64_t r = 0; r < rows; ++r) {
      const T* go_r = p.gh_out ? p.gh_out + t * p.gos0 + (b0 + r) * p.gos1 : nullptr;
      for (int64_t j = 0; j < H; ++j) {
        const T d = go_r ? dh[r * hp + j] + go_r[j] : dh[r * hp + j];
        da_t[r * p.das1 + j] = d * derivative<T>(h_t[r * p.hs1 + j], p.nonlinearity);
      }
    }
    gemm<T>(da_t, p.das1, rows, H, p.w, hp, dh, hp, false);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < H; ++j) p.d_h0[(b0 + r) * p.d0s + j] = dh[r * hp + j];
}

// The ULM (eq. 10), forward, per step: h_t = sigma(x_proj_t + [h_{t-k} .. h_{t-1}] W_time^T),
// the window one contiguous (k H) row of the state buffer.
template <typename T>
void ulm_forward_rows(const UlmForwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, H = p.hidden, hp = p.h_pad;
  for (int64_t t = 0; t < p.steps; ++t) {
    const T* window = p.buf + b0 * p.row + t * H;
    gemm<T>(window, p.row, rows, p.k * H, p.w, hp, s, hp, false);
    const T* x_t = p.x + t * p.xs0 + b0 * p.xs1;
    T* h_t = p.buf + b0 * p.row + (p.k + t) * H;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < H; ++j) h_t[r * p.row + j] = x_t[r * p.xs1 + j] + s[r * hp + j];
    activate<T>(h_t, p.row, rows, H, p.nonlinearity, p.tanh_rows);                 // (10)
  }
}

// The ULM, backward, per step from the last: dL/da_t = dL/dh_t sigma'(a_t), and the window's
// gradient (the k states before step t) += dL/da_t [W^hh_k ... W^hh_1].
template <typename T>
void ulm_backward_rows(const UlmBackwardArgs<T>& p, int64_t b0, int64_t b1, T* s) {
  const int64_t rows = b1 - b0, H = p.hidden, kh = p.k * H, khp = p.kh_pad;
  const int64_t da_row = p.steps * H;
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    T* da_t = p.d_a + b0 * da_row + t * H;
    for (int64_t r = 0; r < rows; ++r) {
      const T* h_r = p.buf + (b0 + r) * p.row + (p.k + t) * H;
      const T* g_r = p.d_buf + (b0 + r) * p.row + (p.k + t) * H;
      for (int64_t j = 0; j < H; ++j)
        da_t[r * da_row + j] = g_r[j] * derivative<T>(h_r[j], p.nonlinearity);
    }
    gemm<T>(da_t, da_row, rows, H, p.w, khp, s, khp, false);
    for (int64_t r = 0; r < rows; ++r) {
      T* window = p.d_buf + (b0 + r) * p.row + t * H;
      for (int64_t j = 0; j < kh; ++j) window[j] += s[r * khp + j];
    }
  }
}

// A batch-1 step reads every packed weight once, so its time is bounded below by streaming
// them from the cache they sit in: `n` values read `repeats` times into 8 independent vector
// sums (no chain of dependent additions slows the reads), as the products load them.
template <typename T>
T stream_read(const T* data, int64_t n, int64_t repeats) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = Vec<T>::lanes;
  V sums[8];
  for (int j = 0; j < 8; ++j) sums[j] = V{};
  for (int64_t rep = 0; rep < repeats; ++rep)
    for (int64_t i = 0; i + 8 * L <= n; i += 8 * L)
      for (int j = 0; j < 8; ++j) sums[j] += load<T>(data + i + j * L);
  V total = sums[0];
  for (int j = 1; j < 8; ++j) total += sums[j];
  T out = T(0);
  for (int64_t l = 0; l < L; ++l) out += total[l];
  return out;
}

}  // namespace
}  // namespace LMN_VARIANT

// This variant's entry in the table of csrc/lmn_cpu.cpp.
extern const Variant LMN_CONCAT(LMN_VARIANT, _variant) = {
    LMN_STRING(LMN_VARIANT), LMN_VEC_BYTES, LMN_VECS,
    LMN_VARIANT::forward_rows<float>, LMN_VARIANT::forward_rows<double>,
    LMN_VARIANT::backward_rows<float>, LMN_VARIANT::backward_rows<double>,
    LMN_VARIANT::gru_forward_rows<float>, LMN_VARIANT::gru_forward_rows<double>,
    LMN_VARIANT::gru_backward_rows<float>, LMN_VARIANT::gru_backward_rows<double>,
    LMN_VARIANT::lstm_forward_rows<float>, LMN_VARIANT::lstm_forward_rows<double>,
    LMN_VARIANT::lstm_backward_rows<float>, LMN_VARIANT::lstm_backward_rows<double>,
    LMN_VARIANT::rnn_forward_rows<float>, LMN_VARIANT::rnn_forward_rows<double>,
    LMN_VARIANT::rnn_backward_rows<float>, LMN_VARIANT::rnn_backward_rows<double>,
    LMN_VARIANT::ulm_forward_rows<float>, LMN_VARIANT::ulm_forward_rows<double>,
    LMN_VARIANT::ulm_backward_rows<float>, LMN_VARIANT::ulm_backward_rows<double>,
    LMN_VARIANT::stream_read<float>,
    LMN_VARIANT::tanh_row,
};

}  // namespace linmem
