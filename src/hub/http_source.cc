// A hub served over HTTP (`hk hub serve`, or any server with the same tree and listings):
//   GET /api/repos                              {"repos": ["org/repo", ...]}
//   GET /api/<org>/<repo>/refs                  {"branches": {...}, "tags": {...}}
//   GET /api/<org>/<repo>/<commit>/variants     {"variants": ["hk1-cpu-x86_64-linux", ...]}
//   GET /<org>/<repo>/<commit>/build/<variant>/<file>
// Responses are parsed strictly; names from the wire are validated before they become paths.
#include <nlohmann/json.hpp>

#include "core/strict_json.h"
#include "hk/error.h"
#include "hk/hub_signing.h"
#include "hk/hub_spec.h"
#include "hub/hub_source.h"

namespace hk::hub {
namespace {

using nlohmann::json;

std::vector<std::string> parse_name_list(const std::string& body, const char* key,
                                         const std::string& origin) {
  json j = parse_json_strict(body, "bad hub listing " + origin + ": it ");
  if (!j.is_object() || !j.contains(key) || !j[key].is_array())
    throw InvalidArgument("bad hub listing " + origin + ": expected {\"" + key + "\": [...]}");
  std::vector<std::string> out;
  for (const auto& v : j[key]) {
    if (!v.is_string()) throw InvalidArgument("bad hub listing " + origin + ": a non-string name");
    out.push_back(v.get<std::string>());
  }
  return out;
}

class HttpSource : public HubSource {
 public:
  HttpSource(const std::string& endpoint, const HttpOptions& options) : http_(endpoint, options) {}
  std::string describe() const override { return "hub at " + http_.endpoint(); }
  bool is_remote() const override { return true; }

  std::vector<std::string> list_repos() override {
    auto repos = parse_name_list(http_.get("/api/repos"), "repos", http_.endpoint() + "/api/repos");
    for (const auto& r : repos) parse_repo_name(r);
    return repos;
  }

  RefTable refs(const std::string& repo) override {
    parse_repo_name(repo);
    std::string path = "/api/" + repo + "/refs";
    try {
      return parse_refs_json(http_.get(path), http_.endpoint() + path);
    } catch (const NotFound&) {
      throw NotFound("kernel repo " + repo + " is not on the " + describe());
    }
  }

  std::vector<std::string> variant_names(const std::string& repo,
                                         const std::string& commit) override {
    if (!is_commit_id(commit)) throw InvalidArgument("'" + commit + "' is not a commit id");
    std::string path = "/api/" + repo + "/" + commit + "/variants";
    std::vector<std::string> names;
    try {
      names = parse_name_list(http_.get(path), "variants", http_.endpoint() + path);
    } catch (const NotFound&) {
      throw NotFound("kernel repo " + repo + " has no commit " + commit + " on the " + describe());
    }
    for (const auto& n : names)
      if (!is_safe_file_name(n))
        throw InvalidArgument("the " + describe() + " lists a bad variant name '" + n + "'");
    return names;
  }

  std::string read_metadata(const std::string& repo, const std::string& commit,
                            const std::string& variant) override {
    return http_.get(file_path(repo, commit, variant, "metadata.json"));
  }

  std::optional<std::string> read_signature(const std::string& repo, const std::string& commit,
                                            const std::string& variant) override {
    try {
      return http_.get(file_path(repo, commit, variant, std::string(kSignatureFileName)));
    } catch (const NotFound&) {
      return std::nullopt;
    }
  }

  std::filesystem::path variant_dir(const std::string&, const std::string&,
                                    const std::string&) override {
    return {};
  }

  void download(const std::string& repo, const std::string& commit, const std::string& variant,
                const std::string& file, int fd, uint64_t max_bytes, Deadline deadline) override {
    http_.download(file_path(repo, commit, variant, file), fd, max_bytes, repo + "/" + file,
                   deadline);
  }

 private:
  std::string file_path(const std::string& repo, const std::string& commit,
                        const std::string& variant, const std::string& file) const {
    parse_repo_name(repo);
    if (!is_commit_id(commit) || !is_safe_file_name(variant) || !is_safe_file_name(file))
      throw InvalidArgument("bad kernel file " + repo + "@" + commit + "/" + variant + "/" + file);
    return "/" + repo + "/" + commit + "/build/" + variant + "/" + file;
  }
  HttpClient http_;
};

}  // namespace

std::unique_ptr<HubSource> make_http_source(const std::string& endpoint,
                                            const HttpOptions& options) {
  return std::make_unique<HttpSource>(endpoint, options);
}

}  // namespace hk::hub
