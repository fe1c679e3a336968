// Where a hub's refs, variant lists, metadata and files come from: a local hub directory, an HTTP
// hub, or (offline) the cache. One interface so resolution is the same everywhere.
//
// Sources only read; they neither verify digests nor choose variants.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
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
  // metadata.json.sig beside it (hk/hub_signing.h), or nullopt when there is none.
  virtual std::optional<std::string> read_signature(const std::string& repo,
                                                    const std::string& commit,
                                                    const std::string& variant) = 0;
  // Local sources: the variant's directory. Remote sources: empty (files must be downloaded).
  virtual std::filesystem::path variant_dir(const std::string& repo, const std::string& commit,
                                            const std::string& variant) = 0;
  // Remote sources: streams one file of a variant into the descriptor `fd`, at most `max_bytes`
  // (more is an IntegrityError), finishing by `deadline`.
  virtual void download(const std::string& repo, const std::string& commit,
                        const std::string& variant, const std::string& file, int fd,
                        uint64_t max_bytes, Deadline deadline) = 0;
  virtual bool is_remote() const = 0;
};

// The hub tree layout read from a directory (the embedded hub, or what `hk hub serve` serves).
std::unique_ptr<HubSource> make_directory_source(const std::filesystem::path& root);
// Several hub directories searched in order: each repo comes from the first that has it.
std::unique_ptr<HubSource> make_directory_source(const std::vector<std::filesystem::path>& roots);
std::unique_ptr<HubSource> make_http_source(const std::string& endpoint,
                                            const HttpOptions& options);
std::unique_ptr<HubSource> make_cache_source(const KernelCache& cache);

// Shared with the server: the refs of a repo directory and its variant names for a commit. With
// `confine_to` (the server's root), entries whose real path leaves it — a symlink out of the
// served tree — are skipped, so listings cannot disclose names or commit ids from elsewhere.
RefTable read_refs_dir(const std::filesystem::path& repo_dir,
                       const std::filesystem::path* confine_to = nullptr);
std::vector<std::string> list_repo_dirs(const std::filesystem::path& root,
                                        bool confine = false);  // "org/repo", sorted
std::vector<std::string> list_variant_dirs(const std::filesystem::path& commit_dir,
                                           const std::filesystem::path* confine_to = nullptr);
// Whether the real path of `path` is `root` or below it (`root` canonical).
bool is_within(const std::filesystem::path& root, const std::filesystem::path& path);

// Reads a whole (small) regular file; throws NotFound / InvalidArgument (not a regular file, too
// large).
std::string read_text_file(const std::filesystem::path& path, size_t max_bytes = 16u << 20);
// The same for an optional file: nullopt when it does not exist.
std::optional<std::string> read_optional_text_file(const std::filesystem::path& path,
                                                   size_t max_bytes = 16u << 20);

}  // namespace hk::hub
