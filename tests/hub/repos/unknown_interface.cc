// Test repo: a well-formed library whose entry implements `rms_norm@7`, an interface version hk
// does not know. The loader must refuse it at load with a sentence; its forward must never run.
#include <cstdlib>

#include "hk/kernel_sdk.h"

namespace {
void forward(const hk_call&) {
  std::abort();
}  // proves the loader never calls it
}  // namespace

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "RMSNorm",
    .interface = "rms_norm",
    .interface_version = 7,
    .modes = HK_MODE_INFERENCE,
    .device = "cpu",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<forward>,
})};

HK_KERNEL_LIBRARY(kEntries)
