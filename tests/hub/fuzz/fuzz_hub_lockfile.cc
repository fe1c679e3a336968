// Fuzz target: hk.lock and hk-kernels.json. Parses or throws InvalidArgument; a parsed lock
// round-trips through serialize_lockfile.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/hub_lockfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    hk::hub::parse_project_kernels(text, "fuzz");
  } catch (const hk::InvalidArgument&) {
  }
  hk::hub::Lockfile lock;
  try {
    lock = hk::hub::parse_lockfile(text, "fuzz");
  } catch (const hk::InvalidArgument&) {
    return 0;
  }
  hk::hub::Lockfile again = hk::hub::parse_lockfile(hk::hub::serialize_lockfile(lock), "again");
  if (again.repos.size() != lock.repos.size()) std::abort();
  for (size_t i = 0; i < lock.repos.size(); ++i)
    if (again.repos[i].repo != lock.repos[i].repo ||
        again.repos[i].commit != lock.repos[i].commit ||
        again.repos[i].variants != lock.repos[i].variants)
      std::abort();
  return 0;
}
