// The local kernel cache (layout and guarantees in cache.h).
#include "hub/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "core/file_io.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/hub_signing.h"
#include "hk/hub_spec.h"
#include "hub/hub_source.h"

namespace fs = std::filesystem;

namespace hk::hub {
namespace {

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    throw RuntimeFailure("cannot create cache directory " + dir.string() + ": " + ec.message() +
                         " (set HK_KERNELS_CACHE to a writable directory)");
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Hard link when possible (one copy on disk), a copy otherwise (other file system, no
// permission), through a temp file so `dest` is never half-written.
void link_or_copy(const fs::path& blob, const fs::path& dest) {
  std::error_code ec;
  fs::remove(dest, ec);
  fs::create_hard_link(blob, dest, ec);
  if (!ec) return;
  files::Fd in = files::open_regular(blob, "cached kernel file");
  files::TempFile tmp(dest.parent_path(), ".part");
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(in.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeFailure("cannot read " + blob.string() + " to place " + dest.string());
    if (n == 0) break;
    tmp.write(buffer, static_cast<size_t>(n), dest.string());
  }
  tmp.commit(dest);
}

}  // namespace

KernelCache::KernelCache(fs::path root, long lock_timeout_s)
    : root_(std::move(root)), lock_timeout_s_(lock_timeout_s) {}

KernelCache::RepoLock::~RepoLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

fs::path KernelCache::repo_dir(const std::string& repo) const {
  auto [org, name] = parse_repo_name(repo);  // validated: safe path components
  return root_ / org / name;
}

KernelCache::RepoLock KernelCache::lock_repo(const std::string& repo) const {
  fs::path dir = repo_dir(repo);
  make_dirs(dir);
  fs::path lock_path = dir / ".lock";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    throw RuntimeFailure("cannot open cache lock " + lock_path.string() +
                         " (set HK_KERNELS_CACHE to a writable directory)");
  // Poll instead of a blocking flock: a process stuck behind a hub that trickles bytes must not
  // make every other process wait forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(lock_timeout_s_);
  auto pause = std::chrono::milliseconds(5);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      ::close(fd);
      throw RuntimeFailure("cannot lock " + lock_path.string());
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      throw RuntimeFailure("another hk process has held the kernel cache lock " +
                           lock_path.string() + " of " + repo + " for more than " +
                           std::to_string(lock_timeout_s_) +
                           " s (HK_HUB_LOCK_TIMEOUT) while fetching it; try again later, or stop "
                           "that process");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  RepoLock lock(fd);
  // We hold the lock, so every .part file left in tmp/ belongs to a process that died.
  std::error_code ec;
  fs::remove_all(dir / "tmp", ec);
  return lock;
}

fs::path KernelCache::variant_dir(const std::string& repo, const std::string& commit,
                                  const std::string& variant) const {
  if (!is_commit_id(commit) || !is_safe_file_name(variant))
    throw InvalidArgument("bad cache key " + repo + "@" + commit + "/" + variant);
  return repo_dir(repo) / "snapshots" / commit / "build" / variant;
}

bool KernelCache::has_variant(const std::string& repo, const std::string& commit,
                              const std::string& variant) const {
  return fs::is_regular_file(variant_dir(repo, commit, variant) / "metadata.json");
}

std::vector<std::string> KernelCache::repos() const {
  // A cache repo dir has refs.json or snapshots/, not refs/: list_repo_dirs accepts both.
  return list_repo_dirs(root_);
}

std::vector<std::string> KernelCache::variants(const std::string& repo,
                                               const std::string& commit) const {
  if (!is_commit_id(commit)) return {};
  return list_variant_dirs(repo_dir(repo) / "snapshots" / commit);
}

void KernelCache::save_refs(const std::string& repo, const RefTable& refs) const {
  make_dirs(repo_dir(repo));
  files::write_file_atomically(repo_dir(repo) / "refs.json", serialize_refs_json(refs));
}

std::optional<RefTable> KernelCache::load_refs(const std::string& repo) const {
  fs::path path = repo_dir(repo) / "refs.json";
  auto text = read_optional_text_file(path);
  if (!text) return std::nullopt;
  return parse_refs_json(*text, path.string());
}

fs::path KernelCache::install_variant(const std::string& repo, const VariantMetadata& metadata,
                                      const std::string& metadata_text,
                                      const std::optional<std::string>& signature_text,
                                      uint64_t max_file_bytes, const Fetch& fetch) const {
  fs::path dir = variant_dir(repo, metadata.id, metadata.variant);
  RepoLock lock = lock_repo(repo);
  if (fs::is_regular_file(dir / "metadata.json")) return dir;  // another process finished it
  fs::path blobs = repo_dir(repo) / "blobs", tmp_dir = repo_dir(repo) / "tmp";
  make_dirs(blobs);
  make_dirs(tmp_dir);
  make_dirs(dir);
  const std::string what =
      repo + " (commit " + metadata.id.substr(0, 12) + ", variant " + metadata.variant + ")";
  for (const auto& [file, sha] : metadata.sha256) {
    auto declared = metadata.size.find(file);
    if (declared != metadata.size.end() && declared->second > max_file_bytes)
      throw IntegrityError("metadata.json of " + what + " declares " + file + " as " +
                           std::to_string(declared->second) + " bytes, more than the " +
                           std::to_string(max_file_bytes) +
                           "-byte limit (HK_HUB_MAX_FILE); nothing was downloaded");
    const uint64_t limit = declared != metadata.size.end() ? declared->second : max_file_bytes;
    fs::path blob = blobs / sha;
    bool have = false;
    try {
      have = fs::is_regular_file(blob) && sha256_file(blob) == sha;
    } catch (const Error&) {
      have = false;  // something odd in blobs/: fetch again and replace it
    }
    if (!have) {
      files::TempFile part(tmp_dir, ".part");
      fetch(file, part.fd(), limit);
      const uint64_t got = files::file_size(part.fd(), part.path());
      if (declared != metadata.size.end() && got != declared->second)
        throw IntegrityError("downloaded " + file + " of " + what + " has " + std::to_string(got) +
                             " bytes but metadata.json declares " +
                             std::to_string(declared->second) +
                             "; the hub serves a truncated file — nothing was cached");
      std::string actual = sha256_fd(part.fd(), part.path());
      if (actual != sha)
        throw IntegrityError("downloaded " + file + " of " + what + " has sha256 " + actual +
                             " but metadata.json expects " + sha +
                             "; the hub serves a corrupt file — nothing was cached");
      part.commit(blob);
    }
    link_or_copy(blob, dir / file);
  }
  fsync_path(dir);
  fs::path sig_path = dir / kSignatureFileName;
  if (signature_text) {
    files::write_file_atomically(sig_path, *signature_text);
  } else {
    std::error_code ec;
    fs::remove(sig_path, ec);
  }
  // Last: marks the variant complete.
  files::write_file_atomically(dir / "metadata.json", metadata_text);
  return dir;
}

}  // namespace hk::hub
