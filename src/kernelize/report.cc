// KernelizeReport: lookups and the JSON / text forms printed by `hk kernelize --report`.
#include <nlohmann/json.hpp>
#include <sstream>

#include "hk/kernelize.h"

namespace hk {

const LayerDecision* KernelizeReport::find(const std::string& path) const {
  for (const auto& d : layers)
    if (d.path == path) return &d;
  return nullptr;
}

size_t KernelizeReport::num_kernels() const {
  size_t n = 0;
  for (const auto& d : layers) n += !d.kernel.empty();
  return n;
}

std::string KernelizeReport::to_json() const {
  nlohmann::ordered_json j;
  j["device"] = device;
  j["mode"] = mode_name(mode);
  if (!simulated_target.empty()) {
    j["simulated"] = true;
    j["target"] = simulated_target;
  }
  j["layers"] = nlohmann::ordered_json::array();
  for (const auto& d : layers) {
    nlohmann::ordered_json l;
    l["path"] = d.path;
    l["layer"] = d.layer;
    l["kernel"] =
        d.kernel.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(d.kernel);
    l["revision"] = d.revision;
    l["variant"] = d.variant;
    l["reason"] = d.reason;
    j["layers"].push_back(std::move(l));
  }
  return j.dump(2);
}

std::string KernelizeReport::to_text() const {
  std::ostringstream os;
  if (!simulated_target.empty())
    os << "kernelize: simulated selection for " << simulated_target << ", mode " << mode_name(mode)
       << " — nothing was fetched or loaded; " << num_kernels() << " of " << layers.size()
       << " layers would get a kernel\n";
  else
    os << "kernelize: device " << device << ", mode " << mode_name(mode) << ", " << num_kernels()
       << " of " << layers.size() << " layers on kernels\n";
  for (const auto& d : layers) {
    os << "  " << d.path << " [" << d.layer << "] → " << (d.kernel.empty() ? "built-in" : d.kernel);
    if (!d.variant.empty()) os << " (" << d.variant << ", " << d.revision.substr(0, 12) << ")";
    os << "\n      " << d.reason << "\n";
  }
  return os.str();
}

}  // namespace hk
