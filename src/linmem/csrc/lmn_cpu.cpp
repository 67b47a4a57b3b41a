// The LMN recurrence (paper eqs. 6-7) and its backward through time on the CPU.
//
// Why a compiled kernel: the products that must stay in the sequential loop are small,
// (B, 250) x (250, 250) for a typical layer, and a BLAS call on them pays thread start-up and
// synchronisation at every step and, on some CPUs, runs a generic code path. Here the batch is
// split across threads once per call (rows of different sequences never interact), every
// thread runs all the steps of its rows on its own, and the products use a register-blocked
// kernel over weights packed once per call (they stay in the core's cache for the whole loop).
//
// Forward, per step, for the rows of one thread:
//   [a_t | s_t] = m_{t-1} [W^mh^T | W^mm^T]            one product, m_{t-1} read once
//   h_t = sigma(x_proj_t + a_t)                          (6)
//   m_t = b^m + s_t + h_t W^hm^T                         (7)
// Backward, per step (g_t = [dL/da_t, dL/dm_t], the layout of linmem.nn._Recurrence):
//   dL/da_t = (grad_h_t + dL/dm_t W^hm) * sigma'(a_t)
//   dL/dm_{t-1} = grad_m_{t-1} + g_t [W^mh; W^mm]
// The weight gradients are large products over all steps, left to BLAS by the caller.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int kRows = 6;  // rows of a register tile
constexpr int kVecs = 4;  // vectors of a register tile (64 floats or 32 doubles)

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(64)));
  static constexpr int64_t lanes = 64 / sizeof(T);
};

template <typename T>
inline typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
inline void store(T* p, typename Vec<T>::type v) {
  std::memcpy(p, &v, sizeof(v));
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

template <typename T, int NV>
void row_tiles(const T* a, int64_t lda, int64_t rows, int64_t k_size, const T* b, int64_t ldb,
               T* c, int64_t ldc, bool accumulate) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    tile<T, kRows, NV>(a + r * lda, lda, b, ldb, k_size, c + r * ldc, ldc, accumulate);
  const T* ar = a + r * lda;
  T* cr = c + r * ldc;
  switch (rows - r) {
    case 1: tile<T, 1, NV>(ar, lda, b, ldb, k_size, cr, ldc, accumulate); break;
    case 2: tile<T, 2, NV>(ar, lda, b, ldb, k_size, cr, ldc, accumulate); break;
    case 3: tile<T, 3, NV>(ar, lda, b, ldb, k_size, cr, ldc, accumulate); break;
    case 4: tile<T, 4, NV>(ar, lda, b, ldb, k_size, cr, ldc, accumulate); break;
    case 5: tile<T, 5, NV>(ar, lda, b, ldb, k_size, cr, ldc, accumulate); break;
    default: break;
  }
}

// C (rows x n_pad) (+)= A (rows x K, row stride lda) B (K x n_pad, packed, row stride n_pad).
template <typename T>
void gemm(const T* a, int64_t lda, int64_t rows, int64_t k_size, const T* b, int64_t n_pad,
          T* c, int64_t ldc, bool accumulate) {
  constexpr int64_t L = Vec<T>::lanes;
  int64_t n = 0;
  for (; n + kVecs * L <= n_pad; n += kVecs * L)
    row_tiles<T, kVecs>(a, lda, rows, k_size, b + n, n_pad, c + n, ldc, accumulate);
  switch ((n_pad - n) / L) {
    case 1: row_tiles<T, 1>(a, lda, rows, k_size, b + n, n_pad, c + n, ldc, accumulate); break;
    case 2: row_tiles<T, 2>(a, lda, rows, k_size, b + n, n_pad, c + n, ldc, accumulate); break;
    case 3: row_tiles<T, 3>(a, lda, rows, k_size, b + n, n_pad, c + n, ldc, accumulate); break;
    default: break;
  }
}

template <typename T>
int64_t padded(int64_t n) {
  constexpr int64_t L = Vec<T>::lanes;
  return (n + L - 1) / L * L;
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

// out[k * ld + j] = w[k][j] for the (K, N) matrix `w`, zeros for N <= j < n_pad. `w` may be
// row-major or a transposed view of a row-major matrix (W^T for a weight W), read as it lies.
template <typename T>
void pack(const at::Tensor& w, T* out, int64_t ld, int64_t n_pad) {
  const int64_t k_size = w.size(0), n = w.size(1);
  const at::Tensor c = (w.stride(1) == 1 || w.stride(0) == 1) ? w : w.contiguous();
  const T* src = c.data_ptr<T>();
  const int64_t sk = c.stride(0), sj = c.stride(1);
  constexpr int64_t kBlock = 32;  // square blocks: both sides of a transpose stay in cache
  for (int64_t k0 = 0; k0 < k_size; k0 += kBlock)
    for (int64_t j0 = 0; j0 < n; j0 += kBlock)
      for (int64_t k = k0; k < std::min(k0 + kBlock, k_size); ++k)
        for (int64_t j = j0; j < std::min(j0 + kBlock, n); ++j)
          out[k * ld + j] = src[k * sk + j * sj];
  for (int64_t k = 0; k < k_size; ++k) std::fill(out + k * ld + n, out + k * ld + n_pad, T(0));
}

enum Nonlinearity : int64_t { kTanh = 0, kRelu = 1, kSelu = 2 };
constexpr double kSeluScale = 1.0507009873554804934193349852946;
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;

// h = sigma(h) for `rows` rows of `n` values (row stride ld).
template <typename T>
void activate(T* h, int64_t ld, int64_t rows, int64_t n, int64_t nonlinearity) {
  if (nonlinearity == kTanh) {  // ATen's vectorised tanh, the PyTorch loop's values
    at::from_blob(h, {rows, n}, {ld, 1}, at::CPU(c10::CppTypeToScalarType<T>::value)).tanh_();
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* row = h + r * ld;
    if (nonlinearity == kRelu) {
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] > T(0) ? row[j] : T(0);
    } else {
      for (int64_t j = 0; j < n; ++j)
        row[j] = row[j] > T(0) ? T(kSeluScale) * row[j]
                               : T(kSeluScale * kSeluAlpha) * std::expm1(row[j]);
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

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
              " must have a contiguous last dimension");
}

int64_t grain(int64_t batch) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>(1, (batch + threads - 1) / threads);
}

template <typename T>
void forward_impl(const at::Tensor& x_proj, const at::Tensor& m0, const at::Tensor& w_mh,
                  const at::Tensor& w_hm, const at::Tensor& w_mm, const at::Tensor& bias_m,
                  int64_t nonlinearity, at::Tensor& hs, at::Tensor& ms) {
  const int64_t steps = x_proj.size(0), batch = x_proj.size(1), hidden = x_proj.size(2);
  const int64_t memory = m0.size(1);
  const int64_t h_pad = padded<T>(hidden), m_pad = padded<T>(memory), width = h_pad + m_pad;
  T* w_first = buffer<T>(0, memory * width);  // [W^mh^T | W^mm^T]: (M, h_pad + m_pad)
  pack<T>(w_mh.t(), w_first, width, h_pad);
  pack<T>(w_mm.t(), w_first + h_pad, width, m_pad);
  T* w_second = buffer<T>(1, hidden * m_pad);  // W^hm^T: (H, m_pad)
  pack<T>(w_hm.t(), w_second, m_pad, m_pad);
  const T* bias = bias_m.data_ptr<T>();
  const T* x = x_proj.data_ptr<T>();
  T* h_out = hs.data_ptr<T>();
  T* m_out = ms.data_ptr<T>();
  const int64_t xs0 = x_proj.stride(0), xs1 = x_proj.stride(1);
  const int64_t hs0 = hs.stride(0), hs1 = hs.stride(1), ms0 = ms.stride(0), ms1 = ms.stride(1);

  at::parallel_for(0, batch, grain(batch), [&](int64_t b0, int64_t b1) {
    const int64_t rows = b1 - b0;
    T* s = buffer<T>(2, rows * width);
    const T* m_prev = m0.data_ptr<T>() + b0 * m0.stride(0);
    int64_t m_prev_ld = m0.stride(0);
    for (int64_t t = 0; t < steps; ++t) {
      const T* x_t = x + t * xs0 + b0 * xs1;
      T* h_t = h_out + t * hs0 + b0 * hs1;
      T* m_t = m_out + t * ms0 + b0 * ms1;
      gemm<T>(m_prev, m_prev_ld, rows, memory, w_first, width, s, width, false);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < hidden; ++j)
          h_t[r * hs1 + j] = x_t[r * xs1 + j] + s[r * width + j];
      activate<T>(h_t, hs1, rows, hidden, nonlinearity);                       // (6)
      gemm<T>(h_t, hs1, rows, hidden, w_second, m_pad, s + h_pad, width, true);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < memory; ++j)
          m_t[r * ms1 + j] = bias[j] + s[r * width + h_pad + j];               // (7)
      m_prev = m_t;
      m_prev_ld = ms1;
    }
  });
}

template <typename T>
void backward_impl(const at::Tensor& grad_hs, const at::Tensor& grad_ms, const at::Tensor& hs,
                   const at::Tensor& w_mh, const at::Tensor& w_hm, const at::Tensor& w_mm,
                   int64_t nonlinearity, at::Tensor& grads, at::Tensor& grad_m0) {
  const int64_t steps = hs.size(0), batch = hs.size(1), hidden = hs.size(2);
  const int64_t memory = w_mm.size(0);
  const int64_t h_pad = padded<T>(hidden), m_pad = padded<T>(memory);
  T* w_dm = buffer<T>(0, memory * h_pad);  // W^hm: (M, h_pad)
  pack<T>(w_hm, w_dm, h_pad, h_pad);
  T* w_dprev = buffer<T>(1, (hidden + memory) * m_pad);  // [W^mh; W^mm]: (H + M, m_pad)
  pack<T>(w_mh, w_dprev, m_pad, m_pad);
  pack<T>(w_mm, w_dprev + hidden * m_pad, m_pad, m_pad);
  const bool has_gh = grad_hs.defined(), has_gm = grad_ms.defined();
  const T* gh = has_gh ? grad_hs.data_ptr<T>() : nullptr;
  const T* gm = has_gm ? grad_ms.data_ptr<T>() : nullptr;
  const int64_t ghs0 = has_gh ? grad_hs.stride(0) : 0, ghs1 = has_gh ? grad_hs.stride(1) : 0;
  const int64_t gms0 = has_gm ? grad_ms.stride(0) : 0, gms1 = has_gm ? grad_ms.stride(1) : 0;
  const T* h = hs.data_ptr<T>();
  const int64_t hs0 = hs.stride(0), hs1 = hs.stride(1);
  T* g = grads.data_ptr<T>();
  const int64_t gs0 = grads.stride(0), gs1 = grads.stride(1);
  T* g0 = grad_m0.data_ptr<T>();
  const int64_t g0s = grad_m0.stride(0);

  at::parallel_for(0, batch, grain(batch), [&](int64_t b0, int64_t b1) {
    const int64_t rows = b1 - b0;
    const int64_t width = std::max(h_pad, m_pad);
    T* s = buffer<T>(2, rows * width);
    T* g_last = g + (steps - 1) * gs0 + b0 * gs1;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < memory; ++j)
        g_last[r * gs1 + hidden + j] =
            has_gm ? gm[(steps - 1) * gms0 + (b0 + r) * gms1 + j] : T(0);
    for (int64_t t = steps - 1; t >= 0; --t) {
      T* g_t = g + t * gs0 + b0 * gs1;
      const T* h_t = h + t * hs0 + b0 * hs1;
      gemm<T>(g_t + hidden, gs1, rows, memory, w_dm, h_pad, s, width, false);
      for (int64_t r = 0; r < rows; ++r) {
        const T* gh_r = has_gh ? gh + t * ghs0 + (b0 + r) * ghs1 : nullptr;
        for (int64_t j = 0; j < hidden; ++j) {
          const T total = has_gh ? s[r * width + j] + gh_r[j] : s[r * width + j];
          g_t[r * gs1 + j] = total * derivative<T>(h_t[r * hs1 + j], nonlinearity);
        }
      }
      gemm<T>(g_t, gs1, rows, hidden + memory, w_dprev, m_pad, s, width, false);
      if (t == 0) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < memory; ++j) g0[(b0 + r) * g0s + j] = s[r * width + j];
      } else {
        T* g_prev = g + (t - 1) * gs0 + b0 * gs1 + hidden;
        for (int64_t r = 0; r < rows; ++r) {
          const T* gm_r = has_gm ? gm + (t - 1) * gms0 + (b0 + r) * gms1 : nullptr;
          for (int64_t j = 0; j < memory; ++j)
            g_prev[r * gs1 + j] = has_gm ? s[r * width + j] + gm_r[j] : s[r * width + j];
        }
      }
    }
  });
}

// hs, ms: outputs (T, B, H) and (T, B, M), any layout with a contiguous last dimension.
void forward(at::Tensor x_proj, at::Tensor m0, at::Tensor w_mh, at::Tensor w_hm,
             at::Tensor w_mm, at::Tensor bias_m, int64_t nonlinearity, at::Tensor hs,
             at::Tensor ms) {
  for (auto* t : {&x_proj, &m0, &hs, &ms}) check_rows(*t, "LMN recurrence operand");
  TORCH_CHECK(x_proj.dim() == 3 && m0.dim() == 2, "x_proj must be (T, B, H), m0 (B, M)");
  AT_DISPATCH_FLOATING_TYPES(x_proj.scalar_type(), "lmn_forward", [&] {
    forward_impl<scalar_t>(x_proj, m0, w_mh, w_hm, w_mm, bias_m, nonlinearity, hs, ms);
  });
}

// grads: output (T, B, H + M); grad_m0: output (B, M); grad_hs / grad_ms may be undefined.
void backward(c10::optional<at::Tensor> grad_hs, c10::optional<at::Tensor> grad_ms,
              at::Tensor hs, at::Tensor w_mh, at::Tensor w_hm, at::Tensor w_mm,
              int64_t nonlinearity, at::Tensor grads, at::Tensor grad_m0) {
  at::Tensor gh = grad_hs.has_value() ? *grad_hs : at::Tensor();
  at::Tensor gm = grad_ms.has_value() ? *grad_ms : at::Tensor();
  for (auto* t : {&gh, &gm, &hs, &grads, &grad_m0})
    if (t->defined()) check_rows(*t, "LMN recurrence gradient");
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "lmn_backward", [&] {
    backward_impl<scalar_t>(gh, gm, hs, w_mh, w_hm, w_mm, nonlinearity, grads, grad_m0);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "LMN recurrence, forward (eqs. 6-7)",
        py::call_guard<py::gil_scoped_release>());
  m.def("backward", &backward, "LMN recurrence, backward through time",
        py::call_guard<py::gil_scoped_release>());
}
