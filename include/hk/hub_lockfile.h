// hk/hub_lockfile.h — a project's kernel dependencies (hk-kernels.json) and their lock (hk.lock).
//
//   hk-kernels.json   {"kernels-community/rmsnorm": 1, "org/other": 2}      (repo → major version)
//   hk.lock           [{"repo": "kernels-community/rmsnorm", "version": 1, "commit": "<40 hex>",
//                       "variants": {"hk1-cpu-x86_64-linux": {"librmsnorm.so": "<sha256>"}}}]
//
// A lock pins each repo to a commit and every variant's files to digests; Hub honours the pin when
// resolving and refuses a variant whose digests differ. Parsers are strict (hk::InvalidArgument
// naming the file and field); this header does no I/O except the load/save helpers.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hk::hub {

struct LockedRepo {
  std::string repo;    // "org/repo"
  int version = 1;     // major version (branch vN) it was locked from
  std::string commit;  // 40 hex
  std::map<std::string, std::map<std::string, std::string>> variants;  // variant → file → sha256
};

struct Lockfile {
  std::vector<LockedRepo> repos;
  const LockedRepo* find(const std::string& repo) const;
};

Lockfile parse_lockfile(std::string_view text, const std::string& origin);
std::string serialize_lockfile(const Lockfile& lock);
Lockfile load_lockfile(const std::filesystem::path& path);  // throws NotFound / InvalidArgument
// Writes atomically through hk's one temp-file primitive (a planted hk.lock.tmp or a symlink at
// `path` is never written through).
void save_lockfile(const std::filesystem::path& path, const Lockfile& lock);

// hk-kernels.json: repo → major version, in file order.
std::vector<std::pair<std::string, int>> parse_project_kernels(std::string_view text,
                                                               const std::string& origin);

}  // namespace hk::hub
