// custom_rmsnorm_cpu.cc — owner/my-kernel, cpu variant of CustomRMSNorm (see custom_rmsnorm.h):
// plain loops, f32 math, the guide's two roundings.
#include <cmath>

#include "custom_rmsnorm.h"

namespace {

using hk::sdk::load_float;
using hk::sdk::round_float;
using hk::sdk::store_float;

void forward(const hk_call& call) {
  const custom_rmsnorm::Rows r = custom_rmsnorm::check(call, HK_DEVICE_CPU);
  for (int64_t row = 0; row < r.rows; ++row) {
    const int64_t xo = row * r.x_stride, yo = row * r.y_stride;
    float sum = 0.0f;
    for (int64_t j = 0; j < r.hidden; ++j) {
      const float h = load_float(r.x, r.dtype, xo + j);
      sum += h * h;
    }
    const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(r.hidden) + r.eps);
    for (int64_t j = 0; j < r.hidden; ++j) {
      const float normed = round_float(r.dtype, load_float(r.x, r.dtype, xo + j) * rstd);
      store_float(r.y, r.dtype, yo + j, load_float(r.scale, r.dtype, j) * normed);
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
