// rmsnorm_cuda_library.cc — the entry table of the cuda variant (kernels in rmsnorm_cuda.cu).
//
// The capability range comes from the build (HK_KERNEL_MIN/MAX_CAPABILITY, set by
// hk_add_kernel_repo from HK_CUDA_ARCHITECTURES). Capture-safe: the kernels never allocate or
// synchronise; dweight scratch is the workspace.
#include "hk/kernel_sdk.h"

namespace rmsnorm {
hk_status cuda_forward(const hk_call* call);
hk_status cuda_backward(const hk_call* call);
hk_status cuda_workspace(const hk_call* call, uint32_t pass, size_t* bytes);
}  // namespace rmsnorm

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "RMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING | HK_MODE_CAPTURE,
    .device = "cuda",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = rmsnorm::cuda_forward,
    .backward = rmsnorm::cuda_backward,
    .workspace_size = rmsnorm::cuda_workspace,
})};

HK_KERNEL_LIBRARY(kEntries)
