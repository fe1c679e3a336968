// Test library (not published): a stateful entry with a layout descriptor (a fused gate/up
// projection built by concatenating two checkpoint tensors), to check that layouts cross the
// ABI intact — through the loader and through hk-kernel-dump.
#include "hk/kernel_sdk.h"

namespace {
void forward(const hk_call&) {
  hk::sdk::fail(HK_STATUS_UNSUPPORTED, "layout test kernel");
}

const char* const kParameters[] = {"gate_up_proj.weight", "down_proj.weight"};
const char* const kGateUpSources[] = {"gate_proj.weight", "up_proj.weight"};
const char* const kDownSources[] = {"down_proj.weight"};
const hk_conversion kConversions[] = {
    {"gate_up_proj.weight", kGateUpSources, 2, HK_CONVERT_CONCAT, 0},
    {"down_proj.weight", kDownSources, 1, HK_CONVERT_RENAME, 0},
};
const hk_layout kLayout = {"FusedMLPLayout", kParameters, 2, kConversions, 2};
}  // namespace

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "FusedMLP",
    .interface = "mlp",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE,
    .device = "cpu",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<forward>,
    .layout = &kLayout,
})};

HK_KERNEL_LIBRARY_EXPLICIT("test/layout", "0.1.0", "layout-test", kEntries)
