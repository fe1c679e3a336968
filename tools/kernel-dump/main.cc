// hk-kernel-dump — prints the entry table of a built kernel library as JSON.
//
// Used by the publish step (cmake/hk_publish_repo.cmake) so that the `entries` written into a
// hub's metadata.json come from the very table the .so exports, never from a second list that
// could drift. Installed with hk (<prefix>/bin/hk-kernel-dump, the imported target
// hk::kernel_dump) so out-of-tree kernel repos publish the same way (docs/writing-kernels.md).
// It deliberately does not validate (the loader does that, and test repos that must
// be refused still have to be published): it reports what the table says. It does not link libhk.
//
//   hk-kernel-dump LIB.so      → {"abi": {"major", "minor"}, "repo", "version", "build_id",
//                                 "entries": [{"name", "interface", "interface_version", "modes",
//                                 "device", "min_capability", "max_capability", "dtypes",
//                                 "backward", ["layout"]}]}   (exactly metadata.json's entries)
// A path without '/' is a file in the current directory (dlopen would search the library path).
// `--help` / `-h` print the usage. Exit status: 0 on success, 1 on bad arguments, 2 when the
// library cannot be opened, 3 when it exports no table.
#include <dlfcn.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "hk/kernel_sdk.h"

namespace {

std::string str(const char* s) {
  return s != nullptr ? s : "";
}

nlohmann::json layout_json(const hk_layout& layout) {
  nlohmann::json out = {{"name", str(layout.name)},
                        {"parameters", nlohmann::json::array()},
                        {"conversions", nlohmann::json::array()}};
  for (uint32_t i = 0; i < layout.num_parameters; ++i)
    out["parameters"].push_back(str(layout.parameters[i]));
  static const char* const kOps[] = {"rename", "concat", "transpose"};
  for (uint32_t i = 0; i < layout.num_conversions; ++i) {
    const hk_conversion& c = layout.conversions[i];
    nlohmann::json conv = {{"target", str(c.target)},
                           {"sources", nlohmann::json::array()},
                           {"op", c.op < 3 ? kOps[c.op] : "unknown"},
                           {"dim", c.dim}};
    for (uint32_t s = 0; s < c.num_sources; ++s) conv["sources"].push_back(str(c.sources[s]));
    out["conversions"].push_back(conv);
  }
  return out;
}

}  // namespace

constexpr const char* kUsage =
    "usage: hk-kernel-dump LIB.so\n"
    "Prints the entry table of a built hk kernel library as JSON (the entries of metadata.json).\n";

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-') {
    std::fputs(kUsage, stderr);
    return 1;
  }
  const std::string path =
      std::string(argv[1]).find('/') == std::string::npos ? "./" + std::string(argv[1]) : argv[1];
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "hk-kernel-dump: cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto fn = reinterpret_cast<hk_kernel_library_fn>(dlsym(handle, HK_KERNEL_LIBRARY_SYMBOL));
  const hk_kernel_library* table = fn != nullptr ? fn() : nullptr;
  if (table == nullptr) {
    std::fprintf(stderr, "hk-kernel-dump: %s exports no %s table\n", argv[1],
                 HK_KERNEL_LIBRARY_SYMBOL);
    return 3;
  }
  nlohmann::json out = {{"abi", {{"major", table->abi_major}, {"minor", table->abi_minor}}},
                        {"repo", str(table->repo)},
                        {"version", str(table->version)},
                        {"build_id", str(table->build_id)},
                        {"entries", nlohmann::json::array()}};
  // Entries are laid out as this ABI says only when the major matches.
  if (table->abi_major == HK_KERNEL_ABI_MAJOR && table->entries != nullptr) {
    const char* base = reinterpret_cast<const char*>(table->entries);
    for (uint32_t i = 0; i < table->num_entries; ++i) {
      const auto& e =
          *reinterpret_cast<const hk_kernel_entry*>(base + size_t{i} * table->entry_size);
      nlohmann::json modes = nlohmann::json::array(), dtypes = nlohmann::json::array();
      for (uint32_t bit : {HK_MODE_INFERENCE, HK_MODE_TRAINING, HK_MODE_CAPTURE})
        if (e.modes & bit) modes.push_back(hk::sdk::mode_bit_name(bit));
      for (int32_t code = 0; code < hk::sdk::kNumDtypeCodes; ++code)
        if (e.dtypes & HK_DTYPE_BIT(code)) dtypes.push_back(hk::sdk::dtype_code_name(code));
      nlohmann::json entry = {{"name", str(e.name)},
                              {"interface", str(e.interface)},
                              {"interface_version", e.interface_version},
                              {"modes", modes},
                              {"device", str(e.device)},
                              {"min_capability", e.min_capability},
                              {"max_capability", e.max_capability},
                              {"dtypes", dtypes},
                              {"backward", e.backward != nullptr}};
      if (e.layout != nullptr) entry["layout"] = layout_json(*e.layout);
      out["entries"].push_back(entry);
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
  // The handle is left open: the process ends here, and some libraries dislike being unloaded.
  return 0;
}
