// Where a hub's refs, variant lists, metadata and files come from: a local hub directory, an HTTP
// hub, or (offline) the cache. One interface so resolution is the same everywhere.
//
// Sources only read; they neither verify digests nor choose variants.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hk/hub_metadata.h"
#include "hub/http_client.h"

namespace hk::hub {

class KernelCache;

class HubSource {
 public:
  virtual ~HubSource() = default;
  virtual std::string describe()
      const = 0;  // "hub directory /x", "hub http://..", "cache /x (offline)"
  virtual std::vector<std::string> list_repos() = 0;
  virtual RefTable refs(const std::string& repo) = 0;  // NotFound for an unknown repo
  virtual std::vector<std::string> variant_names(const std::string& repo,
                                                 const std::string& commit) = 0;
  virtual std::string read_metadata(const std::string& repo, const std::string& commit,
                                    const std::string& variant) = 0;
  // Local sources: the variant's directory. Remote sources: empty (files must be downloaded).
  virtual std::filesystem::path variant_dir(const std::string& repo, const std::string& commit,
                                            const std::string& variant) = 0;
  // Remote sources: streams one file of a variant into `out`.
  virtual void download(const std::string& repo, const std::string& commit,
                        const std::string& variant, const std::string& file, FILE* out) = 0;
  virtual bool is_remote() const = 0;
};

// The hub tree layout read from a directory (the embedded hub, or what `hk hub serve` serves).
std::unique_ptr<HubSource> make_directory_source(const std::filesystem::path& root);
// Several hub directories searched in order: each repo comes from the first that has it.
std::unique_ptr<HubSource> make_directory_source(const std::vector<std::filesystem::path>& roots);
std::unique_ptr<HubSource> make_http_source(const std::string& endpoint,
                                            const HttpOptions& options);
std::unique_ptr<HubSource> make_cache_source(const KernelCache& cache);

// Shared with the server: the refs of a repo directory and its variant names for a commit.
RefTable read_refs_dir(const std::filesystem::path& repo_dir);
std::vector<std::string> list_repo_dirs(const std::filesystem::path& root);  // "org/repo", sorted
std::vector<std::string> list_variant_dirs(const std::filesystem::path& commit_dir);  // sorted

// Reads a whole (small) file; throws NotFound.
std::string read_text_file(const std::filesystem::path& path, size_t max_bytes = 16u << 20);

}  // namespace hk::hub
