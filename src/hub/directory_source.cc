// A hub tree read from a local directory: the embedded hub, or the root `hk hub serve` serves.
//
// Also holds the small tree-walking helpers the server and the cache share. Every name read from
// disk is checked to be a plain path component before use, so a strange tree cannot redirect
// reads outside the root.
#include <algorithm>

#include "core/file_io.h"
#include "hk/error.h"
#include "hk/hub_signing.h"
#include "hk/hub_spec.h"
#include "hub/hub_source.h"

namespace fs = std::filesystem;

namespace hk::hub {

std::string read_text_file(const fs::path& path, size_t max_bytes) {
  return files::read_regular_file(path, max_bytes, "hub file");
}

std::optional<std::string> read_optional_text_file(const fs::path& path, size_t max_bytes) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  return read_text_file(path, max_bytes);
}

bool is_within(const fs::path& root, const fs::path& path) {
  std::error_code ec;
  fs::path real = fs::canonical(path, ec);
  if (ec) return false;
  auto rel = real.lexically_relative(root);
  return !rel.empty() && *rel.begin() != "..";
}

RefTable read_refs_dir(const fs::path& repo_dir, const fs::path* confine_to) {
  RefTable refs;
  for (auto [kind, table] : {std::pair{"heads", &refs.branches}, std::pair{"tags", &refs.tags}}) {
    fs::path dir = repo_dir / "refs" / kind;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& item : fs::directory_iterator(dir, ec)) {
      std::string name = item.path().filename().string();
      if (!item.is_regular_file() || name.empty() || name.front() == '.') continue;
      if (confine_to && !is_within(*confine_to, item.path())) continue;
      try {
        check_revision_name(name);
        (*table)[name] = parse_ref_file(read_text_file(item.path(), 4096), item.path().string());
      } catch (const InvalidArgument&) {
        // A malformed ref is not a version; skip it rather than break the whole repo.
      }
    }
  }
  return refs;
}

std::vector<std::string> list_repo_dirs(const fs::path& root, bool confine) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& org : fs::directory_iterator(root, ec)) {
    if (!org.is_directory()) continue;
    for (const auto& repo : fs::directory_iterator(org.path(), ec)) {
      if (!repo.is_directory()) continue;
      std::string id = org.path().filename().string() + "/" + repo.path().filename().string();
      try {
        parse_repo_name(id);
      } catch (const InvalidArgument&) {
        continue;
      }
      if (confine && !is_within(root, repo.path())) continue;
      if (fs::is_directory(repo.path() / "refs") || fs::exists(repo.path() / "refs.json") ||
          fs::is_directory(repo.path() / "snapshots"))
        out.push_back(id);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> list_variant_dirs(const fs::path& commit_dir, const fs::path* confine_to) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::path build = commit_dir / "build";
  if (!fs::is_directory(build, ec)) return out;
  for (const auto& v : fs::directory_iterator(build, ec)) {
    std::string name = v.path().filename().string();
    if (confine_to && !is_within(*confine_to, v.path() / "metadata.json")) continue;
    if (v.is_directory() && name.front() != '.' && fs::is_regular_file(v.path() / "metadata.json"))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

class DirectorySource : public HubSource {
 public:
  explicit DirectorySource(std::vector<fs::path> roots) : roots_(std::move(roots)) {}
  std::string describe() const override {
    if (roots_.size() == 1) return "hub directory " + roots_[0].string();
    std::string s = "hub directories ";
    for (size_t i = 0; i < roots_.size(); ++i) s += (i ? ":" : "") + roots_[i].string();
    return s;
  }
  bool is_remote() const override { return false; }

  std::vector<std::string> list_repos() override {
    std::vector<std::string> all;
    bool any = false;
    for (const fs::path& root : roots_) {
      if (!fs::is_directory(root)) continue;
      any = true;
      for (std::string& r : list_repo_dirs(root)) all.push_back(std::move(r));
    }
    if (!any)
      throw NotFound("the " + describe() +
                     " does not exist; build hk (it writes <build>/hub), set HK_HUB_DIR, or set "
                     "HK_ENDPOINT to a remote hub");
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }

  RefTable refs(const std::string& repo) override {
    fs::path dir = repo_dir(repo);
    if (!fs::is_directory(dir / "refs"))
      throw NotFound("kernel repo " + repo + " is not in the " + describe() + existing());
    return read_refs_dir(dir);
  }

  std::vector<std::string> variant_names(const std::string& repo,
                                         const std::string& commit) override {
    if (!is_commit_id(commit)) throw InvalidArgument("'" + commit + "' is not a commit id");
    fs::path dir = repo_dir(repo) / commit;
    if (!fs::is_directory(dir))
      throw NotFound("kernel repo " + repo + " has no commit " + commit + " in the " + describe());
    return list_variant_dirs(dir);
  }

  std::string read_metadata(const std::string& repo, const std::string& commit,
                            const std::string& variant) override {
    return read_text_file(variant_dir(repo, commit, variant) / "metadata.json", 1 << 20);
  }

  std::optional<std::string> read_signature(const std::string& repo, const std::string& commit,
                                            const std::string& variant) override {
    return read_optional_text_file(variant_dir(repo, commit, variant) / kSignatureFileName,
                                   1 << 16);
  }

  fs::path variant_dir(const std::string& repo, const std::string& commit,
                       const std::string& variant) override {
    if (!is_commit_id(commit) || !is_safe_file_name(variant))
      throw InvalidArgument("bad variant " + repo + "@" + commit + "/" + variant);
    return repo_dir(repo) / commit / "build" / variant;
  }

  void download(const std::string&, const std::string&, const std::string&, const std::string&, int,
                uint64_t, Deadline) override {
    throw Unsupported("a hub directory is read in place, not downloaded");
  }

 private:
  // The repo's directory in the first root that has it (first match wins), else in the first.
  fs::path repo_dir(const std::string& repo) const {
    auto [org, name] = parse_repo_name(repo);
    for (const fs::path& root : roots_)
      if (fs::is_directory(root / org / name / "refs")) return root / org / name;
    return roots_.front() / org / name;
  }
  std::string existing() const {
    std::vector<std::string> repos;
    for (const fs::path& root : roots_)
      for (std::string& r : list_repo_dirs(root)) repos.push_back(std::move(r));
    std::sort(repos.begin(), repos.end());
    repos.erase(std::unique(repos.begin(), repos.end()), repos.end());
    std::string s;
    for (const auto& r : repos) s += (s.empty() ? "" : ", ") + r;
    return repos.empty() ? " (it holds no repos)" : " (it has: " + s + ")";
  }
  std::vector<fs::path> roots_;
};

}  // namespace

std::unique_ptr<HubSource> make_directory_source(const fs::path& root) {
  return std::make_unique<DirectorySource>(std::vector<fs::path>{root});
}

std::unique_ptr<HubSource> make_directory_source(const std::vector<fs::path>& roots) {
  if (roots.empty()) throw InvalidArgument("no hub directory given");
  return std::make_unique<DirectorySource>(roots);
}

}  // namespace hk::hub
