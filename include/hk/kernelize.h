// hk/kernelize.h — swap a model's layers for hub kernels, per device and mode, with a record of
// every decision.
//
//   auto report = hk::kernelize(model.module(), hk::Mode::Inference,
//                               {.device = model.device(), .dtype = model.dtype(),
//                                .config = hk::KernelConfig{{{"RMSNorm", "org/repo:Entry"}}}});
//   std::cout << report.to_text();   // one line per layer: kernel or built-in, and why
//
// For every module that carries a layer-interface name (hk/module.h), kernelize looks up the
// mapping (KernelConfig over hk's default table: layer → device → capability → mode chain),
// resolves the spec on the hub (trust, version, variant for this device), loads the library
// (digests verified), picks the entry serving that layer and checks it (interface, device,
// capability, dtype, mode; Training needs backward, Capture needs the capture flag), then binds
// an adapter to the module with `set_impl`. Anything that does not fit falls back to the built-in
// implementation and the report says why; an explicit request that cannot be met (a pinned
// version that does not exist, an untrusted attention repo without allow_all_kernels, a config
// naming a layer the model does not have) throws with a sentence instead.
// `USE_HUB_KERNELS=0|OFF|NO` turns hub kernels off without code changes (local kernels stay).
// This header does not define layers or talk HTTP itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hk/device.h"
#include "hk/dtype.h"
#include "hk/kernel_config.h"
#include "hk/mode.h"

namespace hk {
namespace nn {
class Module;
}
namespace hub {
class Hub;
}

struct KernelizeOptions {
  Device device;                    // where the model lives (its capability selects variants)
  DType dtype = DType::F32;         // the model's compute dtype (entries must support it)
  bool use_kernels = true;          // false: everything built-in (decisions still recorded)
  KernelConfig config;              // mapping over the default table
  std::string attn_implementation;  // "", "eager", "sdpa", "flash_attention_2|3|4" or a hub id
  bool allow_all_kernels = false;   // trust repos outside the trusted orgs (attention and mapping)
  std::shared_ptr<hub::Hub> hub;    // null: a Hub configured from the environment
  // Simulated selection for `device` — which may be one this machine does not have (cuda with a
  // capability, rocm, xpu, ...): the mapping, versions and variants are resolved as for a real
  // run, but nothing is fetched or loaded and no module changes; the report says so.
  bool simulate = false;
  int simulated_cuda_runtime = 0;  // with simulate: CUDA runtime as 13000 for 13.0 (0 = this hk's)
  // An explicit request (a kernel_config value or fusion) that falls back prints one line per
  // reason on stderr ("hk: warning: ..."); the report has every decision either way.
  bool warn_on_fallback = true;
};

// One module's decision.
struct LayerDecision {
  std::string path;      // "model.layers.0.input_layernorm"
  std::string layer;     // "RMSNorm"
  std::string kernel;    // "org/repo:Entry", empty = built-in
  std::string revision;  // commit id of the kernel, empty for built-in
  std::string variant;   // "hk1-cpu-x86_64-linux", empty for built-in
  std::string reason;    // why this choice, or why built-in
};

struct KernelizeReport {
  std::string device;  // "cpu", "cuda:0", "rocm:0"
  Mode mode = Mode::Inference;
  std::vector<LayerDecision> layers;
  // Non-empty for a simulated selection: the target it was made for ("cuda sm_90, CUDA 13.0, ...").
  std::string simulated_target;

  const LayerDecision* find(const std::string& path) const;
  size_t num_kernels() const;  // layers bound to a kernel
  // {"device", "mode", "layers": [{"path","layer","kernel"|null,"revision","variant","reason"}]},
  // plus "simulated": true and "target" for a simulated selection
  std::string to_json() const;
  std::string to_text() const;
};

// Binds kernels into the module tree rooted at `root` for `mode` (see above). Re-running
// re-decides every layer (train()/eval() call it again with the new mode).
KernelizeReport kernelize(nn::Module& root, Mode mode, const KernelizeOptions& options);

// True unless USE_HUB_KERNELS is 0/OFF/NO/FALSE (case-insensitive).
bool hub_kernels_enabled();
// The device type name kernel mappings use for `device`: "cuda" devices backed by ROCm report
// "rocm" (detected at run time; HK_DEVICE_BACKEND=rocm simulates it in tests).
std::string mapping_device_type(const Device& device);

}  // namespace hk
