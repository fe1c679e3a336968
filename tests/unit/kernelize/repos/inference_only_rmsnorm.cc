// Test kernel: an rms_norm@1 entry with forward only (modes: inference), f32 contiguous rows.
// kernelize must refuse it under Training (no backward) and bind it under Inference.
#include <cmath>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace {

void forward(const hk_call& call) {
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& w = hk::sdk::input(call, 1, "weight");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  if (x.dtype != HK_DTYPE_F32 || y.dtype != HK_DTYPE_F32 || w.dtype != HK_DTYPE_F32)
    hk::sdk::fail(HK_STATUS_UNSUPPORTED, "inference-only rmsnorm handles f32 only");
  int64_t xs = 0, ys = 0;
  if (!hk::sdk::rows_dense(x, &xs) || !hk::sdk::rows_dense(y, &ys))
    hk::sdk::fail(HK_STATUS_UNSUPPORTED, "inference-only rmsnorm needs dense rows");
  const auto* attrs = static_cast<const hk::RmsNormAttrs*>(call.attrs);
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x);
  const float* xp =
      reinterpret_cast<const float*>(static_cast<const char*>(x.data) + x.byte_offset);
  const float* wp =
      reinterpret_cast<const float*>(static_cast<const char*>(w.data) + w.byte_offset);
  float* yp = reinterpret_cast<float*>(static_cast<char*>(y.data) + y.byte_offset);
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (int64_t j = 0; j < h; ++j) sum += xp[r * xs + j] * xp[r * xs + j];
    const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(h) + attrs->eps);
    for (int64_t j = 0; j < h; ++j) yp[r * ys + j] = xp[r * xs + j] * rstd * wp[j];
  }
}

}  // namespace

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "RMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE,
    .device = "cpu",
    .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
    .forward = hk::sdk::entry_point<forward>,
})};

HK_KERNEL_LIBRARY(kEntries)
