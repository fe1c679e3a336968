// Variant selection: which builds of a kernel commit can run on a target, in preference order,
// with a reason for every verdict.
//
// Rules (documented in docs/hub.md):
//   - ABI major equal; os and arch equal.
//   - cpu variants run on cpu devices only.
//   - cuda: device is cuda, variant CUDA major == runtime major and variant minor <= runtime minor;
//     the capability must be covered by an arch: "90a" covers exactly sm_90 (arch-specific SASS),
//     a plain "80" covers sm_80 and above (PTX can be JIT-compiled forward).
//   - rocm / xpu / mps / npu: device type equal and, when both are known, runtime version equal.
//   - when an entry is requested the variant must provide it.
// Preference among accepted variants: an exact arch match first, then the newest CUDA minor, then
// the highest arch, then the name (so the choice is deterministic). Nothing is dropped silently.
#include <algorithm>
#include <charconv>
#include <tuple>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk_abi/hk_kernel.h"

#ifdef HK_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hk::hub {
namespace {

struct Scored {
  VariantDecision decision;
  std::tuple<int, int, int> score{0, 0, 0};  // higher is better
};

int arch_number(std::string_view arch) {
  if (!arch.empty() && arch.back() == 'a') arch.remove_suffix(1);
  int n = 0;
  std::from_chars(arch.data(), arch.data() + arch.size(), n);
  return n;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s.empty() ? "none" : s;
}

Scored judge(const VariantMetadata& m, const Target& t, const std::string& entry) {
  Scored s;
  s.decision.variant = m.variant;
  auto reject = [&](std::string why) {
    s.decision.accepted = false;
    s.decision.reason = std::move(why);
    return s;
  };
  if (m.abi_major != t.abi_major)
    return reject("built for kernel ABI " + std::to_string(m.abi_major) + ", this hk speaks ABI " +
                  std::to_string(t.abi_major));
  if (m.os != t.os || m.arch != t.arch)
    return reject("built for " + m.arch + "-" + m.os + ", this machine is " + t.arch + "-" + t.os);
  const std::string device_type = device_type_name(t.device.type);
  std::string why;
  if (m.backend.type == "cpu") {
    if (!t.device.is_cpu()) return reject("a cpu build cannot run on a " + device_type + " device");
    why = "cpu build for a cpu device";
  } else if (m.backend.type == "cuda") {
    if (!t.device.is_cuda())
      return reject("a cuda build cannot run on a " + device_type + " device");
    if (t.cuda_runtime_version <= 0)
      return reject("a cuda build needs the CUDA runtime, and this hk has none");
    int rt_major = t.cuda_runtime_version / 1000, rt_minor = (t.cuda_runtime_version % 1000) / 10;
    SemVer built = SemVer::parse(m.backend.version);
    std::string runtime = std::to_string(rt_major) + "." + std::to_string(rt_minor);
    if (built.major != rt_major)
      return reject("built for CUDA " + m.backend.version + ", the runtime is CUDA " + runtime +
                    " (CUDA majors must match)");
    if (built.minor > rt_minor)
      return reject("built for CUDA " + m.backend.version + ", newer than the runtime's CUDA " +
                    runtime);
    int cap = t.device.capability;
    if (cap <= 0) return reject("the device's compute capability is unknown");
    int best_arch = -1;
    bool exact = false;
    for (const auto& a : m.backend.archs) {
      int n = arch_number(a);
      bool specific = !a.empty() && a.back() == 'a';
      bool covers = specific ? n == cap : n <= cap;
      if (!covers) continue;
      if (n == cap) exact = true;
      best_arch = std::max(best_arch, n);
    }
    if (best_arch < 0)
      return reject("no arch of " + join(m.backend.archs) + " covers sm_" + std::to_string(cap) +
                    " (\"NNa\" covers exactly sm_NN, \"NN\" covers sm_NN and newer)");
    s.score = {exact ? 1 : 0, built.minor, best_arch};
    why = "CUDA " + m.backend.version + " ≤ runtime " + runtime + ", arch " +
          (exact ? "matches" : "covers (via PTX)") + " sm_" + std::to_string(cap);
  } else {
    if (device_type != m.backend.type)
      return reject("a " + m.backend.type + " build cannot run on a " + device_type + " device");
    if (!t.runtime_version.empty() && !m.backend.version.empty() &&
        t.runtime_version != m.backend.version)
      return reject("built for " + m.backend.type + " " + m.backend.version + ", the runtime is " +
                    t.runtime_version + " (must match exactly)");
    why = m.backend.type + " build for a " + device_type + " device";
  }
  if (!entry.empty()) {
    auto names = m.entry_names();
    if (std::find(names.begin(), names.end(), entry) == names.end())
      return reject("has no entry " + entry + " (entries: " + join(names) + ")");
  }
  s.decision.accepted = true;
  s.decision.reason = why;
  return s;
}

}  // namespace

std::string host_arch() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "unknown";
#endif
}

Target Target::for_device(const Device& device) {
  Target t;
  t.device = device;
  t.arch = host_arch();
  t.abi_major = HK_KERNEL_ABI_MAJOR;
#ifdef HK_HAVE_CUDA
  int version = 0;
  if (device.is_cuda() && cudaRuntimeGetVersion(&version) == cudaSuccess)
    t.cuda_runtime_version = version;
#endif
  return t;
}

std::string Target::str() const {
  std::string s = device_type_name(device.type);
  if (device.capability > 0) s += " sm_" + std::to_string(device.capability);
  if (cuda_runtime_version > 0)
    s += ", CUDA " + std::to_string(cuda_runtime_version / 1000) + "." +
         std::to_string((cuda_runtime_version % 1000) / 10);
  if (!runtime_version.empty()) s += ", runtime " + runtime_version;
  return s + ", ABI " + std::to_string(abi_major) + ", " + arch + "-" + os;
}

std::vector<VariantDecision> select_variants(const std::vector<VariantMetadata>& variants,
                                             const Target& target, const std::string& entry) {
  std::vector<Scored> scored;
  for (const auto& m : variants) scored.push_back(judge(m, target, entry));
  std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) {
    if (a.decision.accepted != b.decision.accepted) return a.decision.accepted;
    if (a.score != b.score) return a.score > b.score;
    return a.decision.variant < b.decision.variant;
  });
  std::vector<VariantDecision> out;
  for (auto& s : scored) out.push_back(std::move(s.decision));
  return out;
}

}  // namespace hk::hub
