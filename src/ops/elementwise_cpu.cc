// CPU elementwise add/mul/scale (f32 math, f64 for f64; one rounding), cast between any dtypes
// (round to nearest even into 16-bit floats, truncation into integers, like PyTorch) and fill.
#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

template <class T, class F>
void binary(const TensorView& a, const TensorView& b, const TensorView& out, F f) {
  std::vector<T> x = load<T>(a);
  const std::vector<T> y = load<T>(b);
  for (size_t i = 0; i < x.size(); ++i) x[i] = f(x[i], y[i]);
  store(out, x);
}

}  // namespace

void add(const TensorView& a, const TensorView& b, const TensorView& out, float alpha, Stream) {
  if (a.dtype == DType::F64)
    binary<double>(a, b, out, [alpha](double x, double y) { return x + double(alpha) * y; });
  else
    binary<float>(a, b, out, [alpha](float x, float y) { return x + alpha * y; });
}

void mul(const TensorView& a, const TensorView& b, const TensorView& out, Stream) {
  if (a.dtype == DType::F64)
    binary<double>(a, b, out, [](double x, double y) { return x * y; });
  else
    binary<float>(a, b, out, [](float x, float y) { return x * y; });
}

void scale(const TensorView& x, float factor, const TensorView& out, Stream) {
  if (x.dtype == DType::F64) {
    std::vector<double> v = load<double>(x);
    for (double& e : v) e *= factor;
    store(out, v);
  } else {
    std::vector<float> v = load<float>(x);
    for (float& e : v) e *= factor;
    store(out, v);
  }
}

void cast(const TensorView& x, const TensorView& out, Stream) {
  if (x.dtype == out.dtype) {
    copy_view(out, x);
  } else if (!is_floating(x.dtype) && !is_floating(out.dtype)) {
    store(out, load<int64_t>(x));  // exact for i64 values beyond 2^53
  } else {
    store(out, load<double>(x));
  }
}

void fill(const TensorView& out, double value, Stream) {
  char* base = static_cast<char*>(out.ptr());
  for_each_offset(out, [&](int64_t off) { store_one<double>(base + off, out.dtype, value); });
}

}  // namespace hk::ops::cpu
