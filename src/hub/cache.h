// The local kernel cache: blobs by sha256, snapshots by commit, refs for offline use, a lock per
// repo shared across processes.
//
//   <cache>/<org>/<repo>/blobs/<sha256>                               each file's bytes, once
//   <cache>/<org>/<repo>/snapshots/<commit>/build/<variant>/<file>    hard link (or copy) of a blob
//   <cache>/<org>/<repo>/snapshots/<commit>/build/<variant>/metadata.json.sig   when signed
//   <cache>/<org>/<repo>/snapshots/<commit>/build/<variant>/metadata.json   written last = complete
//   <cache>/<org>/<repo>/refs.json                                    refs last seen online
//   <cache>/<org>/<repo>/tmp/.hk-<random>.part                        downloads in progress
//   <cache>/<org>/<repo>/.lock                                        flock(2) per repo
//
// Downloads go to tmp/ (hk's one temp-file primitive: a new random name, O_EXCL | O_NOFOLLOW),
// stop at the size metadata.json declares (or the file limit), are hashed, and only then renamed
// to blobs/<sha256>; a process killed half-way leaves only a .part file, removed by the next
// process that takes the lock. Waiting for another process's lock is bounded (lock_timeout_s).
// The cache does not choose variants, decide trust or check signatures.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hk/hub_metadata.h"

namespace hk::hub {

class KernelCache {
 public:
  explicit KernelCache(std::filesystem::path root, long lock_timeout_s = 900);
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
  // Waits at most lock_timeout_s for another process holding it; then RuntimeFailure.
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
  // linked from its blob, downloading missing blobs with `fetch(file, fd, max_bytes)` (max_bytes:
  // the size metadata.json declares, else `max_file_bytes`) and checking size and digest before
  // they get their final name; the signature (when given) and then metadata.json
  // (`metadata_text`) are written last.
  using Fetch = std::function<void(const std::string& file, int fd, uint64_t max_bytes)>;
  std::filesystem::path install_variant(const std::string& repo, const VariantMetadata& metadata,
                                        const std::string& metadata_text,
                                        const std::optional<std::string>& signature_text,
                                        uint64_t max_file_bytes, const Fetch& fetch) const;

 private:
  std::filesystem::path root_;
  long lock_timeout_s_;
};

}  // namespace hk::hub
