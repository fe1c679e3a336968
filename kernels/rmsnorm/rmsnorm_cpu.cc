// rmsnorm_cpu.cc — the cpu variant of kernels-community/rmsnorm: entry `RMSNorm`, rms_norm@1.
//
// Plain loops, f32 math, one rounding per output, the same semantics as hk::ops::rms_norm
// (r = rsqrt(mean(x²) + eps); llama casting rounds x·r to x's dtype before the weight product).
// Any mix of f32/bf16/f16 tensors. dweight is reduced over rows in f32. Single-threaded on
// purpose: it is the portable reference variant, not a fast one.
#include <cmath>
#include <vector>

#include "hk/kernel_sdk.h"
#include "rmsnorm_problem.h"

namespace rmsnorm {
namespace {

inline float load(const char* base, int32_t dtype, int64_t i) {
  return hk::sdk::load_float(base, dtype, i);
}
inline void store(char* base, int32_t dtype, int64_t i, float v) {
  hk::sdk::store_float(base, dtype, i, v);
}
inline float round_to(int32_t dtype, float v) {
  return hk::sdk::round_float(dtype, v);
}

inline size_t elem_size(int32_t dtype) {
  return hk::sdk::dtype_code_size(dtype);
}
inline char* row_ptr(const RowTensor& t, int64_t row) {
  return static_cast<char*>(t.ptr) + row * t.row_stride * static_cast<int64_t>(elem_size(t.dtype));
}

float row_rstd(const Problem& p, int64_t row) {
  if (p.rstd.t != nullptr && p.dy.t != nullptr) {  // backward with a saved rstd
    return reinterpret_cast<const float*>(p.rstd.ptr)[row * p.rstd.row_stride];
  }
  const char* x = row_ptr(p.x, row);
  float sum = 0.0f;
  for (int64_t j = 0; j < p.hidden; ++j) {
    const float v = load(x, p.x.dtype, j);
    sum += v * v;
  }
  return 1.0f / std::sqrt(sum / static_cast<float>(p.hidden) + p.attrs.eps);
}

void forward(const hk_call& call) {
  const Problem p = forward_problem(call, HK_DEVICE_CPU);
  const bool llama = p.attrs.casting_mode == hk::kRmsNormCastingLlama;
  const char* w = static_cast<const char*>(p.weight.ptr);
  for (int64_t row = 0; row < p.rows; ++row) {
    const float r = row_rstd(p, row);
    const char* x = row_ptr(p.x, row);
    char* y = row_ptr(p.y, row);
    for (int64_t j = 0; j < p.hidden; ++j) {
      float n = load(x, p.x.dtype, j) * r;
      if (llama) n = round_to(p.x.dtype, n);
      store(y, p.y.dtype, j, n * (p.attrs.offset + load(w, p.weight.dtype, j)));
    }
    if (p.rstd.t != nullptr) reinterpret_cast<float*>(p.rstd.ptr)[row * p.rstd.row_stride] = r;
  }
}

void backward(const hk_call& call) {
  const Problem p = backward_problem(call, HK_DEVICE_CPU);
  const bool llama = p.attrs.casting_mode == hk::kRmsNormCastingLlama;
  const char* w = static_cast<const char*>(p.weight.ptr);
  std::vector<float> dweight(p.dweight.t != nullptr ? p.hidden : 0, 0.0f);
  std::vector<float> g(p.hidden);
  const float inv_h = 1.0f / static_cast<float>(p.hidden);
  for (int64_t row = 0; row < p.rows; ++row) {
    const float r = row_rstd(p, row);
    const char* x = row_ptr(p.x, row);
    const char* dy = row_ptr(p.dy, row);
    char* dx = row_ptr(p.dx, row);
    float dot = 0.0f;  // Σ g·m with m = x·r
    for (int64_t j = 0; j < p.hidden; ++j) {
      const float xj = load(x, p.x.dtype, j);
      const float dyj = load(dy, p.dy.dtype, j);
      g[j] = dyj * (p.attrs.offset + load(w, p.weight.dtype, j));
      dot += g[j] * xj * r;
      if (!dweight.empty()) {
        const float n = llama ? round_to(p.x.dtype, xj * r) : xj * r;
        dweight[j] += dyj * n;
      }
    }
    const float mean_dot = dot * inv_h;
    for (int64_t j = 0; j < p.hidden; ++j) {
      const float m = load(x, p.x.dtype, j) * r;
      store(dx, p.dx.dtype, j, r * (g[j] - m * mean_dot));
    }
  }
  if (p.dweight.t != nullptr) {
    char* dw = static_cast<char*>(p.dweight.ptr);
    const bool accumulate = (p.attrs.flags & hk::kAccumulateWeightGrads) != 0;
    for (int64_t j = 0; j < p.hidden; ++j) {
      const float previous = accumulate ? load(dw, p.dweight.dtype, j) : 0.0f;
      store(dw, p.dweight.dtype, j, previous + dweight[j]);
    }
  }
}

}  // namespace
}  // namespace rmsnorm

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "RMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING,
    .device = "cpu",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<rmsnorm::forward>,
    .backward = hk::sdk::entry_point<rmsnorm::backward>,
})};

HK_KERNEL_LIBRARY(kEntries)
