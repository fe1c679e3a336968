// Fuzz target: refs (a refs/heads|tags file and the refs JSON listing). Parses or throws
// InvalidArgument; a parsed table round-trips through its JSON form.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/hub_metadata.h"
#include "hk/hub_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    std::string commit = hk::hub::parse_ref_file(text, "fuzz");
    if (!hk::hub::is_commit_id(commit)) std::abort();
  } catch (const hk::InvalidArgument&) {
  }
  hk::hub::RefTable refs;
  try {
    refs = hk::hub::parse_refs_json(text, "fuzz");
  } catch (const hk::InvalidArgument&) {
    return 0;
  }
  hk::hub::RefTable again = hk::hub::parse_refs_json(hk::hub::serialize_refs_json(refs), "again");
  if (again.branches != refs.branches || again.tags != refs.tags) std::abort();
  return 0;
}
