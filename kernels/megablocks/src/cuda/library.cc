// library.cc — the entry table of the cuda variant (kernels in moe_cuda.cu). The capability range
// comes from the build (HK_CUDA_ARCHITECTURES, default 90a). Capture-safe: no host sync, no
// allocation (the workspace is the caller's), grids from host-known shapes.
#include "hk/kernel_sdk.h"

namespace megablocks::cuda {
void forward(const hk_call& call);
void backward(const hk_call& call);
size_t workspace(const hk_call& call, uint32_t pass);
}  // namespace megablocks::cuda

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "MegaBlocksMoeMLP",
    .interface = "moe_mlp",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING | HK_MODE_CAPTURE,
    .device = "cuda",
    .dtypes = HK_DTYPE_BIT(HK_DTYPE_BF16) | HK_DTYPE_BIT(HK_DTYPE_F16),
    .forward = hk::sdk::entry_point<megablocks::cuda::forward>,
    .backward = hk::sdk::entry_point<megablocks::cuda::backward>,
    .workspace_size = hk::sdk::workspace_point<megablocks::cuda::workspace>,
})};

HK_KERNEL_LIBRARY(kEntries)
