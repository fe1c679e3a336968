// Fuzz target: metadata.json. Any input either parses or is an InvalidArgument; what parses must
// survive serialize → parse unchanged, and never name a file outside the variant directory.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/hub_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  hk::hub::VariantMetadata m;
  try {
    m = hk::hub::parse_variant_metadata(text, "fuzz");
  } catch (const hk::InvalidArgument&) {
    return 0;
  }
  for (const auto& [file, sha] : m.sha256)
    if (!hk::hub::is_safe_file_name(file) || sha.size() != 64) std::abort();
  if (!hk::hub::is_safe_file_name(m.library) || !m.sha256.count(m.library)) std::abort();
  hk::hub::VariantMetadata again =
      hk::hub::parse_variant_metadata(hk::hub::serialize_variant_metadata(m), "fuzz round trip");
  if (again.sha256 != m.sha256 || again.entry_names() != m.entry_names() ||
      again.backend.archs != m.backend.archs || again.id != m.id || again.variant != m.variant ||
      again.size != m.size)
    std::abort();
  return 0;
}
