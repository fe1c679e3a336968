// Parsing and writing of hk.lock and hk-kernels.json (formats in hk/hub_lockfile.h).
//
// Strict: repo names, commit ids, variant and file names and digests are validated exactly as the
// hub validates them, so a lock can never name a path outside the cache. Writing is deterministic
// (sorted keys) so locks diff cleanly. Resolution and enforcement live in hub.cc.
#include <nlohmann/json.hpp>
#include <set>

#include "core/file_io.h"
#include "core/strict_json.h"
#include "hk/error.h"
#include "hk/hub_lockfile.h"
#include "hk/hub_metadata.h"
#include "hk/hub_spec.h"

namespace hk::hub {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& why) {
  throw InvalidArgument("bad lockfile " + origin + ": " + why);
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

const LockedRepo* Lockfile::find(const std::string& repo) const {
  for (const auto& r : repos)
    if (r.repo == repo) return &r;
  return nullptr;
}

Lockfile parse_lockfile(std::string_view text, const std::string& origin) {
  json j = parse_json_strict(text, "bad lockfile " + origin + ": it ");
  if (!j.is_array()) fail(origin, "the top level is not a list");
  Lockfile lock;
  std::set<std::string> seen;
  for (const json& item : j) {
    if (!item.is_object()) fail(origin, "an item is not an object");
    LockedRepo r;
    auto repo = item.find("repo");
    if (repo == item.end() || !repo->is_string()) fail(origin, "an item has no string \"repo\"");
    r.repo = repo->get<std::string>();
    try {
      parse_repo_name(r.repo);
    } catch (const InvalidArgument& e) {
      fail(origin, e.what());
    }
    if (!seen.insert(r.repo).second) fail(origin, r.repo + " is locked twice");
    auto version = item.find("version");
    if (version != item.end()) {
      if (!version->is_number_integer() || version->get<int64_t>() < 0 ||
          version->get<int64_t>() > 1000000)
        fail(origin, r.repo + " \"version\" is not a non-negative integer");
      r.version = version->get<int>();
    }
    auto commit = item.find("commit");
    if (commit == item.end() || !commit->is_string() || !is_commit_id(commit->get<std::string>()))
      fail(origin, r.repo + " has no 40-hex \"commit\"");
    r.commit = commit->get<std::string>();
    auto variants = item.find("variants");
    if (variants == item.end() || !variants->is_object())
      fail(origin, r.repo + " has no \"variants\" object");
    for (auto v = variants->begin(); v != variants->end(); ++v) {
      if (!is_safe_file_name(v.key()))
        fail(origin, r.repo + " names a bad variant \"" + v.key() + "\"");
      if (!v->is_object()) fail(origin, r.repo + " variant " + v.key() + " is not an object");
      auto& files = r.variants[v.key()];
      for (auto f = v->begin(); f != v->end(); ++f) {
        if (!is_safe_file_name(f.key()))
          fail(origin, r.repo + " variant " + v.key() + " names a bad file \"" + f.key() + "\"");
        if (!f->is_string() || !is_hex64(f->get<std::string>()))
          fail(origin, r.repo + " digest of " + f.key() + " is not 64 lower-case hex characters");
        files[f.key()] = f->get<std::string>();
      }
    }
    lock.repos.push_back(std::move(r));
  }
  return lock;
}

std::string serialize_lockfile(const Lockfile& lock) {
  json j = json::array();
  for (const auto& r : lock.repos) {
    json variants = json::object();
    for (const auto& [variant, files] : r.variants) variants[variant] = files;
    j.push_back(
        {{"repo", r.repo}, {"version", r.version}, {"commit", r.commit}, {"variants", variants}});
  }
  return j.dump(2) + "\n";
}

Lockfile load_lockfile(const std::filesystem::path& path) {
  std::string text;
  try {
    text = files::read_regular_file(path, 16u << 20, "lockfile");
  } catch (const NotFound&) {
    throw NotFound("lockfile " + path.string() + " does not exist; run `hk kernels lock DIR`");
  }
  return parse_lockfile(text, path.string());
}

void save_lockfile(const std::filesystem::path& path, const Lockfile& lock) {
  files::write_file_atomically(path, serialize_lockfile(lock));
}

std::vector<std::pair<std::string, int>> parse_project_kernels(std::string_view text,
                                                               const std::string& origin) {
  json j = parse_json_strict(text, "bad kernel list " + origin + ": it ");
  if (!j.is_object())
    throw InvalidArgument("bad kernel list " + origin +
                          ": expected an object {\"org/repo\": <major version>, ...}");
  std::vector<std::pair<std::string, int>> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    try {
      parse_repo_name(it.key());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("bad kernel list " + origin + ": " + e.what());
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1000000)
      throw InvalidArgument("bad kernel list " + origin + ": the version of " + it.key() +
                            " must be a major version number such as 1");
    out.emplace_back(it.key(), it->get<int>());
  }
  return out;
}

}  // namespace hk::hub
