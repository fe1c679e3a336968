// custom_rmsnorm_cuda_library.cc — owner/my-kernel, cuda variant: the entry table and the ABI
// side of CustomRMSNorm (checks in custom_rmsnorm.h, the kernel in custom_rmsnorm_cuda.cu).
#include "custom_rmsnorm.h"

namespace {

void forward(const hk_call& call) {
  const custom_rmsnorm::Rows r = custom_rmsnorm::check(call, HK_DEVICE_CUDA);
  if (r.rows == 0) return;
  if (custom_rmsnorm::launch_cuda(r, call.stream) != 0)
    hk::sdk::fail(HK_STATUS_DEVICE_ERROR, "CustomRMSNorm: the kernel launch failed");
}

const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "CustomRMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_CAPTURE,
    .device = "cuda",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<forward>,
    .layout = &custom_rmsnorm::kLayout,
})};

}  // namespace

HK_KERNEL_LIBRARY(kEntries)
