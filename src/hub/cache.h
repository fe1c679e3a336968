// The local kernel cache: blobs by sha256, snapshots by commit, refs for offline use, a lock per
// repo shared across processes.
//
//   <cache>/<org>/<repo>/blobs/<sha256>                               each file's bytes, once
//   <cache>/<org>/<repo>/snapshots/<commit>/build/<variant>/<file>    hard link (or copy) of a blob
//   <cache>/<org>/<repo>/snapshots/<commit>/build/<variant>/metadata.json   written last = complete
//   <cache>/<org>/<repo>/refs.json                                    refs last seen online
//   <cache>/<org>/<repo>/tmp/*.part                                   downloads in progress
//   <cache>/<org>/<repo>/.lock                                        flock(2) per repo
//
// Downloads go to tmp/, are hashed, and only then renamed to blobs/<sha256>; a process killed
// half-way leaves only a .part file, removed by the next process that takes the lock. The cache
// does not choose variants or decide trust.
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hk/hub_metadata.h"

namespace hk::hub {

class KernelCache {
 public:
  explicit KernelCache(std::filesystem::path root);
  const std::filesystem::path& root() const { return root_; }

  // Exclusive per-repo lock across processes (flock), released on destruction.
  class RepoLock {
   public:
    explicit RepoLock(int fd) : fd_(fd) {}
    RepoLock(RepoLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
    RepoLock(const RepoLock&) = delete;
    ~RepoLock();

   private:
    int fd_;
  };
  RepoLock lock_repo(const std::string& repo) const;

  std::filesystem::path repo_dir(const std::string& repo) const;
  std::filesystem::path variant_dir(const std::string& repo, const std::string& commit,
                                    const std::string& variant) const;
  bool has_variant(const std::string& repo, const std::string& commit,
                   const std::string& variant) const;
  std::vector<std::string> repos() const;
  std::vector<std::string> variants(const std::string& repo, const std::string& commit) const;

  void save_refs(const std::string& repo, const RefTable& refs) const;
  std::optional<RefTable> load_refs(const std::string& repo) const;

  // Makes the variant complete in the snapshot (under the repo lock): every file of `metadata` is
  // linked from its blob, downloading missing blobs with `fetch(file, out)` and checking their
  // digest before they get their final name; metadata.json (`metadata_text`) is written last.
  using Fetch = std::function<void(const std::string& file, FILE* out)>;
  std::filesystem::path install_variant(const std::string& repo, const VariantMetadata& metadata,
                                        const std::string& metadata_text, const Fetch& fetch) const;

 private:
  std::filesystem::path root_;
};

// Writes `text` to `path` atomically (temp file in the same directory, fsync, rename).
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace hk::hub
