// KernelConfig's JSON form. Strict: unknown keys, wrong types and keys given twice are errors that
// name the file and the key, because a silently ignored typo — or a second "RMSNorm" entry that
// quietly replaces the first — would load a kernel the user did not mean. Read through the strict
// JSON reader (nesting depth bounded), from a regular file of at most 16 MiB.
#include "hk/kernel_config.h"

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/strict_json.h"
#include "hk/error.h"

namespace hk {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& where,
                       const std::string& what) {
  throw InvalidArgument("kernel config " + source + ": " + where + ": " + what);
}

KernelOptions parse_options(const json& j, const std::string& source, const std::string& where) {
  if (!j.is_object()) fail(source, where, "kernel options must be an object like {\"version\": 2}");
  KernelOptions o;
  for (auto& [key, value] : j.items()) {
    if (key == "version") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > 1000000)
        fail(source, where,
             "\"version\" must be a non-negative integer (major version N → branch vN)");
      o.version = value.get<int>();
    } else if (key == "revision") {
      if (!value.is_string() || value.get<std::string>().empty())
        fail(source, where, "\"revision\" must be a non-empty tag, branch or commit string");
      o.revision = value.get<std::string>();
    } else if (key == "trust_remote_code") {
      if (!value.is_boolean()) fail(source, where, "\"trust_remote_code\" must be true or false");
      o.trust_remote_code = value.get<bool>();
    } else {
      fail(source, where,
           "unknown kernel option \"" + key + "\"; use version, revision or trust_remote_code");
    }
  }
  if (o.version && o.revision)
    fail(source, where, "give either \"version\" or \"revision\", not both");
  return o;
}

MappedKernel parse_spec(const json& j, const std::string& source, const std::string& where) {
  if (j.is_string()) return MappedKernel{j.get<std::string>(), {}};
  if (j.is_null()) return MappedKernel{};
  if (j.is_array()) {
    if (j.size() != 2 || !j[0].is_string())
      fail(source, where, "a pair must be [\"org/repo:Entry\", {options}]");
    return MappedKernel{j[0].get<std::string>(), parse_options(j[1], source, where)};
  }
  fail(source, where,
       "expected \"org/repo[:Entry]\", [\"org/repo:Entry\", {options}] or a "
       "per-device object");
}

}  // namespace

KernelMappingValue KernelMappingValue::devices(std::map<std::string, MappedKernel> per_device) {
  KernelMappingValue v;
  v.per_device_ = std::move(per_device);
  return v;
}

std::optional<MappedKernel> KernelMappingValue::for_device(const std::string& device_type) const {
  if (auto it = per_device_.find(device_type); it != per_device_.end()) return it->second;
  return all_;
}

KernelConfig KernelConfig::from_json(const std::string& text, const std::string& source) {
  json j = parse_json_strict(text, "kernel config " + source + " ");
  if (!j.is_object()) fail(source, "top level", "must be an object with \"kernel_mapping\"");
  KernelConfig config;
  static const char* kDevices[] = {"cpu", "cuda", "rocm", "xpu", "mps", "npu"};
  for (auto& [key, value] : j.items()) {
    if (key == "kernel_mapping") {
      if (!value.is_object()) fail(source, key, "must be an object of layer name → kernel");
      for (auto& [layer, v] : value.items()) {
        const std::string where = "kernel_mapping." + layer;
        if (layer.empty()) fail(source, where, "empty layer name");
        if (v.is_object()) {
          std::map<std::string, MappedKernel> per_device;
          for (auto& [device, s] : v.items()) {
            bool known = false;
            for (auto* d : kDevices) known |= device == d;
            if (!known)
              fail(source, where + "." + device,
                   "unknown device type; use cpu, cuda, rocm, xpu, mps or npu");
            per_device[device] = parse_spec(s, source, where + "." + device);
          }
          config.kernel_mapping[layer] = KernelMappingValue::devices(std::move(per_device));
        } else {
          MappedKernel s = parse_spec(v, source, where);
          config.kernel_mapping[layer] = KernelMappingValue(s.spec, s.options);
        }
      }
    } else if (key == "inherit_mapping" || key == "use_local_kernel") {
      if (!value.is_boolean()) fail(source, key, "must be true or false");
      (key == "inherit_mapping" ? config.inherit_mapping : config.use_local_kernel) =
          value.get<bool>();
    } else if (key == "fusions") {
      if (!value.is_array()) fail(source, key, "must be an array of {\"modules\", \"kernel\"}");
      for (size_t i = 0; i < value.size(); ++i) {
        const auto& f = value[i];
        const std::string where = "fusions[" + std::to_string(i) + "]";
        if (!f.is_object() || !f.contains("modules") || !f.contains("kernel"))
          fail(source, where, "each fusion needs \"modules\" and \"kernel\"");
        FusionRule rule;
        for (auto& [fk, fv] : f.items())
          if (fk != "modules" && fk != "kernel")
            fail(source, where, "unknown key \"" + fk + "\"; use modules and kernel");
        if (!f["modules"].is_array() || f["modules"].size() < 2)
          fail(source, where + ".modules", "must list at least two [class, path pattern] pairs");
        for (const auto& m : f["modules"]) {
          if (!m.is_array() || m.size() != 2 || !m[0].is_string() || !m[1].is_string())
            fail(source, where + ".modules", "each module must be [\"Class\", \"path.*.pattern\"]");
          rule.modules.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        }
        rule.kernel = parse_spec(f["kernel"], source, where + ".kernel");
        if (rule.kernel.disabled()) fail(source, where + ".kernel", "a fusion needs a kernel");
        config.fusions.push_back(std::move(rule));
      }
    } else {
      fail(source, key,
           "unknown key; use kernel_mapping, fusions, inherit_mapping or use_local_kernel");
    }
  }
  return config;
}

KernelConfig KernelConfig::from_file(const std::filesystem::path& path) {
  std::string text;
  try {
    text = files::read_regular_file(path, 16u << 20, "kernel config");
  } catch (const NotFound&) {
    throw NotFound("kernel config " + path.string() + " cannot be opened; check the path");
  }
  return from_json(text, path.string());
}

}  // namespace hk
