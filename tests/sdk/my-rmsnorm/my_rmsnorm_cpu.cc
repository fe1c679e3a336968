// my_rmsnorm_cpu.cc — the cpu variant of someorg/my-rmsnorm: entry `MyRMSNorm`, rms_norm@1.
//
// The smallest useful kernel an out-of-tree repo can publish: RMSNorm forward over f32 rows,
// y = x·rsqrt(mean(x²) + eps)·(offset + w), and the optional rstd output. For f32 the three
// casting modes of rms_norm@1 give the same value (every rounding is to f32), so all are served.
// It deliberately does no backward (inference only), no 16-bit dtypes and no strided rows other
// than a fixed row stride: those return HK_STATUS_UNSUPPORTED and hk falls back.
#include <cmath>
#include <string>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace {

using hk::sdk::fail;

// Row stride (elements) of a tensor whose rows hold `hidden` f32 values, or fail.
int64_t f32_row_stride(const hk_tensor& t, int64_t hidden, const char* what) {
  if (t.dtype != HK_DTYPE_F32)
    fail(HK_STATUS_UNSUPPORTED, std::string(what) + " must be f32 in my-rmsnorm");
  if (t.device_type != HK_DEVICE_CPU)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " is not on the cpu");
  if (hk::sdk::last_dim(t) != hidden)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " has a last dim other than H");
  int64_t stride = 0;
  if (!hk::sdk::rows_dense(t, &stride))
    fail(HK_STATUS_UNSUPPORTED, std::string(what) + " is strided along its rows");
  return stride;
}

void forward(const hk_call& call) {
  const auto attrs = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  if (attrs.casting_mode > hk::kRmsNormCastingNone)
    fail(HK_STATUS_INVALID_ARGUMENT, "unknown casting_mode " + std::to_string(attrs.casting_mode));
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& weight = hk::sdk::input(call, 1, "weight");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  const hk_tensor* rstd = hk::sdk::optional_output(call, 1);
  if (!hk::sdk::same_shape(x, y)) fail(HK_STATUS_INVALID_ARGUMENT, "y's shape differs from x's");

  const int64_t hidden = hk::sdk::last_dim(x);
  const int64_t rows = hk::sdk::rows(x);
  const int64_t x_stride = f32_row_stride(x, hidden, "x");
  const int64_t y_stride = f32_row_stride(y, hidden, "y");
  f32_row_stride(weight, hidden, "weight");
  if (weight.ndim != 1) fail(HK_STATUS_INVALID_ARGUMENT, "weight must be [H]");
  if (rstd != nullptr && (rstd->dtype != HK_DTYPE_F32 || hk::sdk::numel(*rstd) != rows))
    fail(HK_STATUS_INVALID_ARGUMENT, "rstd must be f32 with one value per row");
  const int64_t w_stride = weight.strides[0];
  const int64_t r_stride = rstd != nullptr && rstd->ndim > 0 ? rstd->strides[rstd->ndim - 1] : 1;

  const float* xp = hk::sdk::data_ptr<const float>(x);
  const float* wp = hk::sdk::data_ptr<const float>(weight);
  float* yp = hk::sdk::data_ptr<float>(y);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = xp + row * x_stride;
    float sum = 0.0f;
    for (int64_t j = 0; j < hidden; ++j) sum += xr[j] * xr[j];
    const float r = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + attrs.eps);
    float* yr = yp + row * y_stride;
    for (int64_t j = 0; j < hidden; ++j) yr[j] = xr[j] * r * (attrs.offset + wp[j * w_stride]);
    if (rstd != nullptr) hk::sdk::data_ptr<float>(*rstd)[row * r_stride] = r;
  }
}

}  // namespace

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "MyRMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE,
    .device = "cpu",
    .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
    .forward = hk::sdk::entry_point<forward>,
})};

HK_KERNEL_LIBRARY(kEntries)
