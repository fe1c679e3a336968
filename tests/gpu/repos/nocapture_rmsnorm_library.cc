// Test repo kernels-community/test-nocapture-rmsnorm (published into <build>/decode-test-hub, never
// into the embedded hub): kernels/rmsnorm's CUDA RMSNorm under an entry table that declares
// inference only — no HK_MODE_CAPTURE — so kernelize for Inference | Capture must fall back from
// it, and a CUDA generate with it bound must not capture its decode step.
#include "hk/kernel_sdk.h"

namespace rmsnorm {
hk_status cuda_forward(const hk_call* call);
}  // namespace rmsnorm

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "RMSNorm",
    .interface = "rms_norm",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE,
    .device = "cuda",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = rmsnorm::cuda_forward,
})};

HK_KERNEL_LIBRARY(kEntries)
