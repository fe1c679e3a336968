// Fuzz target: metadata.json.sig and HK_PUBLISHER_KEYS files (hk/hub_signing.h). Any input either
// parses or is an InvalidArgument; a parsed signature has a 64-hex key and a 128-hex signature,
// survives serialize → parse, and the policy check on it against random metadata bytes is either
// accepted or an IntegrityError — never a crash (the crypto sees only validated hex).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/hub_signing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    hk::hub::MetadataSignature s = hk::hub::parse_signature(text, "fuzz.sig");
    if (s.public_key.size() != 64 || s.signature.size() != 128) std::abort();
    hk::hub::MetadataSignature again =
        hk::hub::parse_signature(hk::hub::serialize_signature(s), "round trip");
    if (again.public_key != s.public_key || again.signature != s.signature) std::abort();
    hk::hub::PublisherKeys keys;
    keys.by_org["org"] = {s.public_key};
    try {
      hk::hub::check_metadata_signature("org/repo", text, text, keys, true);
    } catch (const hk::IntegrityError&) {
    }
  } catch (const hk::InvalidArgument&) {
  }
  try {
    hk::hub::PublisherKeys keys = hk::hub::parse_publisher_keys(text, "fuzz-keys.json");
    for (const auto& [org, list] : keys.by_org)
      for (const auto& k : list)
        if (k.size() != 64) std::abort();
  } catch (const hk::InvalidArgument&) {
  }
  return 0;
}
