// custom_rmsnorm_cpu.cc — owner/my-kernel, cpu variant of CustomRMSNorm (see custom_rmsnorm.h):
// plain loops, f32 math, the guide's two roundings.
#include <cmath>

#include "custom_rmsnorm.h"
#include "hk/dtype.h"

namespace {

float load(const void* base, int32_t dtype, int64_t i) {
  if (dtype == HK_DTYPE_F32) return static_cast<const float*>(base)[i];
  if (dtype == HK_DTYPE_BF16) return hk::bf16_to_float(static_cast<const hk::bf16_t*>(base)[i]);
  return static_cast<float>(static_cast<const _Float16*>(base)[i]);
}
float round_to(int32_t dtype, float v) {
  if (dtype == HK_DTYPE_BF16) return hk::bf16_to_float(hk::float_to_bf16(v));
  if (dtype == HK_DTYPE_F16) return static_cast<float>(static_cast<_Float16>(v));
  return v;
}
void store(void* base, int32_t dtype, int64_t i, float v) {
  if (dtype == HK_DTYPE_F32)
    static_cast<float*>(base)[i] = v;
  else if (dtype == HK_DTYPE_BF16)
    static_cast<hk::bf16_t*>(base)[i] = hk::float_to_bf16(v);
  else
    static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v);
}

void forward(const hk_call& call) {
  const custom_rmsnorm::Rows r = custom_rmsnorm::check(call, HK_DEVICE_CPU);
  for (int64_t row = 0; row < r.rows; ++row) {
    const int64_t xo = row * r.x_stride, yo = row * r.y_stride;
    float sum = 0.0f;
    for (int64_t j = 0; j < r.hidden; ++j) {
      const float h = load(r.x, r.dtype, xo + j);
      sum += h * h;
    }
    const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(r.hidden) + r.eps);
    for (int64_t j = 0; j < r.hidden; ++j) {
      const float normed = round_to(r.dtype, load(r.x, r.dtype, xo + j) * rstd);
      store(r.y, r.dtype, yo + j, load(r.scale, r.dtype, j) * normed);
    }
  }
}

const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "CustomRMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE,
    .device = "cpu",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<forward>,
    .layout = &custom_rmsnorm::kLayout,
})};

}  // namespace

HK_KERNEL_LIBRARY(kEntries)
