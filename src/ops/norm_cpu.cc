// CPU RMSNorm (forward/backward) and LayerNorm, row by row in f32 (f64 for f64 tensors).
//
// RMSNorm follows Transformers' Llama/Qwen code: r = rsqrt(mean(x²) + eps) in f32, the normalised
// value x·r rounded to x's dtype, then multiplied by the weight and rounded once to y's dtype. The
// backward is the exact gradient of x·r·w (the rounding is treated as identity, as autograd does),
// with dweight taken against the rounded normalised value autograd would have saved.
#include <cmath>

#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"
#include "ops/dispatch.h"

namespace hk::ops::cpu {
namespace {

template <class T>
std::vector<T> inverse_rms(const std::vector<T>& xs, int64_t rows, int64_t h, float eps) {
  std::vector<T> r(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    T ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += xs[i * h + j] * xs[i * h + j];
    r[i] = T{1} / std::sqrt(ss / static_cast<T>(h) + static_cast<T>(eps));
  }
  return r;
}

template <class T>
void rms_norm_t(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                const TensorView* rstd) {
  const int64_t h = x.shape[x.ndim - 1], rows = detail::rows_of(x);
  const std::vector<T> xs = load<T>(x), w = load<T>(weight);
  const std::vector<T> r = inverse_rms(xs, rows, h, eps);
  std::vector<T> out(xs.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < h; ++j) out[i * h + j] = round_as(x.dtype, xs[i * h + j] * r[i]) * w[j];
  store(y, out);
  if (rstd) store(*rstd, r);
}

template <class T>
void rms_norm_backward_t(const TensorView& dy, const TensorView& x, const TensorView& weight,
                         float eps, const TensorView* rstd, const TensorView& dx,
                         const TensorView* dweight, bool accumulate) {
  const int64_t h = x.shape[x.ndim - 1], rows = detail::rows_of(x);
  const std::vector<T> xs = load<T>(x), g = load<T>(dy), w = load<T>(weight);
  const std::vector<T> r = rstd ? load<T>(*rstd) : inverse_rms(xs, rows, h, eps);
  std::vector<T> out(xs.size());
  std::vector<T> dw = dweight && accumulate ? load<T>(*dweight) : std::vector<T>(h, T{0});
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = &xs[i * h];
    const T* gr = &g[i * h];
    T dot = 0;  // Σ (dy·w)·x
    for (int64_t j = 0; j < h; ++j) dot += gr[j] * w[j] * xr[j];
    const T c = r[i] * r[i] * r[i] * dot / static_cast<T>(h);
    for (int64_t j = 0; j < h; ++j) {
      out[i * h + j] = r[i] * gr[j] * w[j] - c * xr[j];
      dw[j] += gr[j] * round_as(x.dtype, xr[j] * r[i]);
    }
  }
  store(dx, out);
  if (dweight) store(*dweight, dw);
}

template <class T>
void layer_norm_t(const TensorView& x, const TensorView& weight, const TensorView* bias, float eps,
                  const TensorView& y) {
  const int64_t h = x.shape[x.ndim - 1], rows = detail::rows_of(x);
  const std::vector<T> xs = load<T>(x), w = load<T>(weight);
  const std::vector<T> b = bias ? load<T>(*bias) : std::vector<T>(h, T{0});
  std::vector<T> out(xs.size());
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = &xs[i * h];
    T mean = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mean += xr[j];
    mean /= static_cast<T>(h);
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const T rs = T{1} / std::sqrt(var / static_cast<T>(h) + static_cast<T>(eps));
    for (int64_t j = 0; j < h; ++j) out[i * h + j] = (xr[j] - mean) * rs * w[j] + b[j];
  }
  store(y, out);
}

}  // namespace

void add_rms_norm(const TensorView& residual, const TensorView& delta, const TensorView& weight,
                  float eps, const TensorView& y, Stream stream) {
  add(residual, delta, residual, 1.0f, stream);
  rms_norm(residual, weight, eps, y, nullptr, stream);
}

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              const TensorView* rstd, Stream) {
  if (x.dtype == DType::F64)
    rms_norm_t<double>(x, weight, eps, y, rstd);
  else
    rms_norm_t<float>(x, weight, eps, y, rstd);
}

void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       float eps, const TensorView* rstd, const TensorView& dx,
                       const TensorView* dweight, bool accumulate_dweight, Stream) {
  if (x.dtype == DType::F64)
    rms_norm_backward_t<double>(dy, x, weight, eps, rstd, dx, dweight, accumulate_dweight);
  else
    rms_norm_backward_t<float>(dy, x, weight, eps, rstd, dx, dweight, accumulate_dweight);
}

void layer_norm(const TensorView& x, const TensorView& weight, const TensorView* bias, float eps,
                const TensorView& y, Stream) {
  if (x.dtype == DType::F64)
    layer_norm_t<double>(x, weight, bias, eps, y);
  else
    layer_norm_t<float>(x, weight, bias, eps, y);
}

}  // namespace hk::ops::cpu
