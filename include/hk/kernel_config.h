// hk/kernel_config.h — KernelConfig: which hub (or local) kernel replaces which layer.
//
// Mirrors Transformers' KernelConfig. Keys are layer interface names registered by the model
// ("RMSNorm", "MLP", "rotary_pos_emb", ...). Values take every form of the loading guide:
//   "org/repo"                       the repo's entry implementing the layer's interface
//   "org/repo:Entry"                 a named entry ("org/repo@v2.1.0:Entry" pins a revision)
//   KernelMappingValue::devices({{"cuda", "..."}, {"xpu", "..."}})   per device type
//   {"org/repo:Entry", {.version = 3}}  with options (version N = branch vN, revision,
//                                        trust_remote_code)
//   ""                               disables that layer's kernel (built-in implementation)
// With use_local_kernel, values are "/abs/path:Entry". Fusions map several modules (class name +
// dotted path pattern, `*` = one path segment) to one kernel that ships a <Kernel>Layout.
// This header holds the data and its JSON form (`hk ... --kernel-config FILE.json`); resolving
// values against devices, modes and the hub is kernelize's job.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hk {

struct KernelOptions {
  std::optional<int> version;           // major version N → branch vN (default 1)
  std::optional<std::string> revision;  // tag, branch or commit; exclusive with version
  bool trust_remote_code = false;       // allow repos outside the trusted orgs
};

struct MappedKernel {
  std::string spec;  // "org/repo[@rev][:Entry]" or "/abs/path:Entry"; "" = disabled
  KernelOptions options;
  bool disabled() const { return spec.empty(); }
};

class KernelMappingValue {
 public:
  KernelMappingValue() = default;
  KernelMappingValue(const char* spec)
      : all_{MappedKernel{spec, {}}} {}  // NOLINT: implicit on purpose
  KernelMappingValue(std::string spec) : all_{MappedKernel{std::move(spec), {}}} {}  // NOLINT
  KernelMappingValue(std::string spec, KernelOptions options)
      : all_{MappedKernel{std::move(spec), std::move(options)}} {}
  // Per device type ("cuda", "rocm", "xpu", "cpu", ...).
  static KernelMappingValue devices(std::map<std::string, MappedKernel> per_device);

  // The spec for a device type: the per-device entry, or the all-device one. nullopt = this
  // value says nothing about that device.
  std::optional<MappedKernel> for_device(const std::string& device_type) const;
  bool is_per_device() const { return !per_device_.empty(); }
  const std::map<std::string, MappedKernel>& per_device() const { return per_device_; }

 private:
  std::optional<MappedKernel> all_;
  std::map<std::string, MappedKernel> per_device_;
};

// One fusion: modules (class name, path pattern) under one parent replaced by one kernel.
struct FusionRule {
  std::vector<std::pair<std::string, std::string>> modules;
  MappedKernel kernel;
};

struct KernelConfig {
  std::map<std::string, KernelMappingValue> kernel_mapping;
  bool inherit_mapping = true;    // start from hk's device-aware default table
  bool use_local_kernel = false;  // values are local paths "/abs/path:Entry"
  std::vector<FusionRule> fusions;

  // Parses the --kernel-config JSON form (see ARCHITECTURE.md). Errors name `source` and the key.
  static KernelConfig from_json(const std::string& text, const std::string& source = "<json>");
  static KernelConfig from_file(const std::filesystem::path& path);
};

}  // namespace hk
