// CPU matmul, linear and linear backward on OpenBLAS.
//
// f32 (and f64) operands whose layout BLAS can read (row-major or column-major with a leading
// dimension) go to cblas_sgemm/dgemm directly. bf16/f16 operands are converted to f32 — B in column
// blocks so the temporary stays small for a large weight — multiplied with f32 accumulation, and
// the output rounded once (bias and beta·C added in f32 before that rounding, like addmm). Not
// tuned beyond that: no packing of our own, no threading of our own (OpenBLAS threads).
#include <cblas.h>

#include <algorithm>

#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"
#include "ops/dispatch.h"

namespace hk::ops::cpu {
namespace {

template <class T>
constexpr DType native_dtype() {
  return sizeof(T) == 8 ? DType::F64 : DType::F32;
}

inline void gemm_blas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}
inline void gemm_blas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                      double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// A 2-D operand as BLAS sees it: row-major storage of [rows, cols] (maybe the transpose of the
// view) with leading dimension ld.
template <class T>
struct BlasMatrix {
  const T* p = nullptr;
  int64_t ld = 1;
  bool transposed = false;  // storage is the transpose of the view
  std::vector<T> scratch;
};

template <class T>
BlasMatrix<T> as_blas(const TensorView& v) {
  BlasMatrix<T> m;
  const int64_t rows = v.shape[0], cols = v.shape[1];
  if (v.dtype == native_dtype<T>()) {
    const bool row_major = (cols <= 1 || v.strides[1] == 1) && (rows <= 1 || v.strides[0] >= cols);
    const bool col_major = (rows <= 1 || v.strides[0] == 1) && (cols <= 1 || v.strides[1] >= rows);
    if (row_major) {
      m.p = v.data_as<T>();
      m.ld = std::max<int64_t>({rows > 1 ? v.strides[0] : cols, cols, 1});
      return m;
    }
    if (col_major) {
      m.p = v.data_as<T>();
      m.ld = std::max<int64_t>({cols > 1 ? v.strides[1] : rows, rows, 1});
      m.transposed = true;
      return m;
    }
  }
  m.scratch = load<T>(v);
  m.p = m.scratch.data();
  m.ld = std::max<int64_t>(cols, 1);
  return m;
}

// C = alpha·op(A)·op(B) + beta·C (+ bias[N] broadcast over rows), all 2-D views.
template <class T>
void gemm_2d(bool ta, bool tb, T alpha, const TensorView& a, const TensorView& b, T beta,
             const TensorView& c, const TensorView* bias) {
  const int64_t m = c.shape[0], n = c.shape[1], k = ta ? a.shape[0] : a.shape[1];
  if (m == 0 || n == 0) return;
  const BlasMatrix<T> am = as_blas<T>(a);
  std::vector<T> bias_values;
  if (bias) bias_values = load<T>(*bias);

  const bool c_direct = c.dtype == native_dtype<T>() && (n <= 1 || c.strides[1] == 1) &&
                        (m <= 1 || c.strides[0] >= n) && k > 0;
  // 16-bit B is converted block by block (about 16 MiB of f32 at a time).
  const bool b_native = b.dtype == native_dtype<T>();
  const int64_t block =
      b_native ? n : std::max<int64_t>(1, (int64_t{1} << 22) / std::max<int64_t>(k, 1));
  std::vector<T> tmp;
  for (int64_t n0 = 0; n0 < n; n0 += block) {
    const int64_t nb = std::min(block, n - n0);
    const TensorView bb = block == n ? b : (tb ? b.slice(0, n0, n0 + nb) : b.slice(1, n0, n0 + nb));
    const TensorView cb = block == n ? c : c.slice(1, n0, n0 + nb);
    if (c_direct) {
      const BlasMatrix<T> bm = as_blas<T>(bb);
      T* cp = cb.data_as<T>();
      const int64_t ldc = std::max<int64_t>({m > 1 ? cb.strides[0] : nb, nb, 1});
      gemm_blas(ta != am.transposed, tb != bm.transposed, m, nb, k, alpha, am.p, am.ld, bm.p, bm.ld,
                beta, cp, ldc);
      if (bias)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nb; ++j) cp[i * ldc + j] += bias_values[n0 + j];
      continue;
    }
    if (beta != T{0}) {
      tmp = load<T>(cb);
      for (T& x : tmp) x *= beta;
    } else {
      tmp.assign(static_cast<size_t>(m * nb), T{0});
    }
    if (k > 0) {
      const BlasMatrix<T> bm = as_blas<T>(bb);
      gemm_blas(ta != am.transposed, tb != bm.transposed, m, nb, k, alpha, am.p, am.ld, bm.p, bm.ld,
                T{1}, tmp.data(), nb);
    }
    if (bias)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nb; ++j) tmp[i * nb + j] += bias_values[n0 + j];
    store(cb, tmp);
  }
}

template <class T>
void matmul_t(const TensorView& a, const TensorView& b, const TensorView& c,
              const MatmulOptions& o) {
  if (c.ndim == 2) {
    gemm_2d<T>(o.trans_a, o.trans_b, o.alpha, a, b, o.beta, c, nullptr);
    return;
  }
  for (int64_t i = 0; i < c.shape[0]; ++i)
    gemm_2d<T>(o.trans_a, o.trans_b, o.alpha, a.select(0, i), b.select(0, b.shape[0] == 1 ? 0 : i),
               o.beta, c.select(0, i), nullptr);
}

// [..., K] → [rows, K] (a view when the layout allows it, else a contiguous copy kept in `hold`).
TensorView as_rows(const TensorView& v, Tensor& hold) {
  const int64_t last = v.ndim ? v.shape[v.ndim - 1] : 1;
  const Shape shape{detail::rows_of(v), last};
  try {
    return v.reshape(shape);
  } catch (const InvalidArgument&) {
    hold = Tensor::wrap(v).contiguous();
    return hold.view().reshape(shape);
  }
}

template <class T>
void linear_t(const TensorView& x, const TensorView& w, const TensorView* bias,
              const TensorView& y) {
  Tensor hx, hy;
  const TensorView x2 = as_rows(x, hx);
  TensorView y2;
  try {
    y2 = y.reshape({detail::rows_of(y), y.shape[y.ndim - 1]});
  } catch (const InvalidArgument&) {
    hy = Tensor::empty(y.sizes(), y.dtype);
    y2 = hy.view().reshape({detail::rows_of(y), y.shape[y.ndim - 1]});
  }
  gemm_2d<T>(false, true, T{1}, x2, w, T{0}, y2, bias);
  if (hy.defined()) copy_view(y, hy.view());
}

template <class T>
void linear_backward_t(const TensorView& dy, const TensorView& x, const TensorView& w,
                       const TensorView* dx, const TensorView* dw, const TensorView* dbias,
                       bool accumulate) {
  Tensor hdy, hx;
  const TensorView dy2 = as_rows(dy, hdy);
  if (dx) {
    Tensor hdx;
    TensorView dx2;
    try {
      dx2 = dx->reshape({detail::rows_of(*dx), dx->shape[dx->ndim - 1]});
    } catch (const InvalidArgument&) {
      hdx = Tensor::empty(dx->sizes(), dx->dtype);
      dx2 = hdx.view().reshape({detail::rows_of(*dx), dx->shape[dx->ndim - 1]});
    }
    gemm_2d<T>(false, false, T{1}, dy2, w, T{0}, dx2, nullptr);
    if (hdx.defined()) copy_view(*dx, hdx.view());
  }
  if (dw) {
    const TensorView x2 = as_rows(x, hx);
    gemm_2d<T>(true, false, T{1}, dy2, x2, accumulate ? T{1} : T{0}, *dw, nullptr);
  }
  if (dbias) {
    const int64_t rows = dy2.shape[0], n = dy2.shape[1];
    const std::vector<T> g = load<T>(dy2);
    std::vector<T> sum = accumulate ? load<T>(*dbias) : std::vector<T>(n, T{0});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) sum[j] += g[r * n + j];
    store(*dbias, sum);
  }
}

}  // namespace

void matmul(const TensorView& a, const TensorView& b, const TensorView& c,
            const MatmulOptions& options, Stream) {
  if (c.dtype == DType::F64)
    matmul_t<double>(a, b, c, options);
  else
    matmul_t<float>(a, b, c, options);
}

void linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
            Stream) {
  if (y.dtype == DType::F64)
    linear_t<double>(x, w, bias, y);
  else
    linear_t<float>(x, w, bias, y);
}

void linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                     const TensorView* dx, const TensorView* dw, const TensorView* dbias,
                     bool accumulate, Stream) {
  if (dy.dtype == DType::F64)
    linear_backward_t<double>(dy, x, w, dx, dw, dbias, accumulate);
  else
    linear_backward_t<float>(dy, x, w, dx, dw, dbias, accumulate);
}

}  // namespace hk::ops::cpu
