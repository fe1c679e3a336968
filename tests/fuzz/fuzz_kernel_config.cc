// Fuzz target for the KernelConfig JSON parser (hk/kernel_config.h, `--kernel-config FILE`).
//
// Valid outcomes: an hk::Error with a non-empty message, or a config whose every mapping names a
// non-empty layer, every per-device value a known device type, and every fusion at least two
// modules and a kernel. A key given twice must never be accepted (a second "RMSNorm" silently
// replacing the first is what the strict reader refuses); deep nesting must be a sentence, not a
// crash. Seeds and every crash input: tests/fuzz/corpus/kernel_config/.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/kernel_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const hk::KernelConfig c = hk::KernelConfig::from_json(text, "fuzz.json");
    for (const auto& [layer, value] : c.kernel_mapping) {
      if (layer.empty()) std::abort();
      for (const char* device : {"cpu", "cuda", "rocm", "xpu", "mps", "npu"}) {
        auto spec = value.for_device(device);
        if (spec && spec->options.version && spec->options.revision) std::abort();
      }
    }
    for (const auto& f : c.fusions)
      if (f.modules.size() < 2 || f.kernel.disabled()) std::abort();
  } catch (const hk::Error& e) {
    if (e.what()[0] == '\0') std::abort();
  }
  return 0;
}
