// CPU softmax over the last dim and its backward, in f32 (f64 for f64 tensors), one rounding.
// A row that is entirely -inf gives zeros (the convention attention's fully masked rows need).
#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"
#include "ops/dispatch.h"
#include "ops/softmax_math.h"

namespace hk::ops::cpu {
namespace {

template <class T>
void softmax_t(const TensorView& x, const TensorView& y) {
  const int64_t n = x.shape[x.ndim - 1], rows = detail::rows_of(x);
  std::vector<T> v = load<T>(x);
  for (int64_t r = 0; r < rows; ++r) softmax_row(&v[r * n], n);
  store(y, v);
}

template <class T>
void softmax_backward_t(const TensorView& dy, const TensorView& y, const TensorView& dx) {
  const int64_t n = y.shape[y.ndim - 1], rows = detail::rows_of(y);
  const std::vector<T> ys = load<T>(y);
  std::vector<T> g = load<T>(dy);
  for (int64_t r = 0; r < rows; ++r) {
    T dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += g[r * n + j] * ys[r * n + j];
    for (int64_t j = 0; j < n; ++j) g[r * n + j] = ys[r * n + j] * (g[r * n + j] - dot);
  }
  store(dx, g);
}

}  // namespace

void softmax(const TensorView& x, const TensorView& y, Stream) {
  if (x.dtype == DType::F64)
    softmax_t<double>(x, y);
  else
    softmax_t<float>(x, y);
}

void softmax_backward(const TensorView& dy, const TensorView& y, const TensorView& dx, Stream) {
  if (y.dtype == DType::F64)
    softmax_backward_t<double>(dy, y, dx);
  else
    softmax_backward_t<float>(dy, y, dx);
}

}  // namespace hk::ops::cpu
