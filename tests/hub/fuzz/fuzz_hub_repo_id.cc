// Fuzz target: kernel specs (org/repo@rev:Entry, ranges, local paths), version ranges and
// LOCAL_KERNELS. Parses or throws InvalidArgument; a parsed spec re-parses from its canonical form
// to the same thing, and hub names never contain path tricks.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/hub_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    hk::hub::KernelSpec spec = hk::hub::KernelSpec::parse(text);
    hk::hub::KernelSpec again = hk::hub::KernelSpec::parse(spec.str());
    if (again.str() != spec.str()) std::abort();
    if (spec.kind == hk::hub::KernelSpec::Kind::Hub) {
      for (const std::string& part : {spec.org, spec.name})
        if (part.empty() || part == "." || part == ".." || part.find('/') != std::string::npos)
          std::abort();
      if (spec.revision && spec.revision->find("..") != std::string::npos) std::abort();
    }
  } catch (const hk::InvalidArgument&) {
  }
  try {
    hk::hub::VersionRange range = hk::hub::VersionRange::parse(text);
    range.matches(hk::hub::SemVer{1, 2, 3});
  } catch (const hk::InvalidArgument&) {
  }
  try {
    for (const auto& [repo, path] : hk::hub::parse_local_kernels(text))
      if (path.empty() || path.front() != '/') std::abort();
  } catch (const hk::InvalidArgument&) {
  }
  return 0;
}
