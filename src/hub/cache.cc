// The local kernel cache (layout and guarantees in cache.h).
#include "hub/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/hub_spec.h"
#include "hub/hub_source.h"

namespace fs = std::filesystem;

namespace hk::hub {
namespace {

std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  return std::to_string(::getpid()) + "." + std::to_string(counter++) + "." + std::to_string(rd());
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    throw RuntimeFailure("cannot create cache directory " + dir.string() + ": " + ec.message() +
                         " (set HK_KERNELS_CACHE to a writable directory)");
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Hard link when possible (one copy on disk), copy otherwise (other file system, no permission).
void link_or_copy(const fs::path& blob, const fs::path& dest) {
  std::error_code ec;
  fs::remove(dest, ec);
  fs::create_hard_link(blob, dest, ec);
  if (!ec) return;
  fs::path tmp = dest.string() + "." + unique_suffix() + ".part";
  fs::copy_file(blob, tmp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::rename(tmp, dest, ec);
  if (ec) {
    fs::remove(tmp);
    throw RuntimeFailure("cannot place " + dest.string() + " in the kernel cache: " + ec.message());
  }
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::string& text) {
  make_dirs(path.parent_path());
  fs::path tmp = path.string() + "." + unique_suffix() + ".part";
  {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw RuntimeFailure("cannot write " + tmp.string());
    bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = std::fflush(f) == 0 && ok;
    ok = ::fsync(fileno(f)) == 0 && ok;
    ok = std::fclose(f) == 0 && ok;
    if (!ok) {
      fs::remove(tmp);
      throw RuntimeFailure("cannot write " + tmp.string() + " (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw RuntimeFailure("cannot rename into " + path.string() + ": " + ec.message());
  }
}

KernelCache::KernelCache(fs::path root) : root_(std::move(root)) {}

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
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw RuntimeFailure("cannot open cache lock " + lock_path.string() +
                         " (set HK_KERNELS_CACHE to a writable directory)");
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    ::close(fd);
    throw RuntimeFailure("cannot lock " + lock_path.string());
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
  std::vector<std::string> out;
  for (const auto& repo : list_repo_dirs(root_)) out.push_back(repo);
  // A cache repo dir has refs.json or snapshots/, not refs/: list_repo_dirs accepts both.
  return out;
}

std::vector<std::string> KernelCache::variants(const std::string& repo,
                                               const std::string& commit) const {
  if (!is_commit_id(commit)) return {};
  return list_variant_dirs(repo_dir(repo) / "snapshots" / commit);
}

void KernelCache::save_refs(const std::string& repo, const RefTable& refs) const {
  write_file_atomically(repo_dir(repo) / "refs.json", serialize_refs_json(refs));
}

std::optional<RefTable> KernelCache::load_refs(const std::string& repo) const {
  fs::path path = repo_dir(repo) / "refs.json";
  if (!fs::exists(path)) return std::nullopt;
  return parse_refs_json(read_text_file(path), path.string());
}

fs::path KernelCache::install_variant(const std::string& repo, const VariantMetadata& metadata,
                                      const std::string& metadata_text, const Fetch& fetch) const {
  fs::path dir = variant_dir(repo, metadata.id, metadata.variant);
  RepoLock lock = lock_repo(repo);
  if (fs::is_regular_file(dir / "metadata.json")) return dir;  // another process finished it
  fs::path blobs = repo_dir(repo) / "blobs", tmp_dir = repo_dir(repo) / "tmp";
  make_dirs(blobs);
  make_dirs(tmp_dir);
  make_dirs(dir);
  for (const auto& [file, sha] : metadata.sha256) {
    fs::path blob = blobs / sha;
    bool have = fs::is_regular_file(blob) && sha256_file(blob) == sha;
    if (!have) {
      fs::path part = tmp_dir / (file + "." + unique_suffix() + ".part");
      FILE* out = std::fopen(part.c_str(), "wb");
      if (!out) throw RuntimeFailure("cannot write " + part.string() + " in the kernel cache");
      try {
        fetch(file, out);
        if (::fsync(fileno(out)) != 0) throw RuntimeFailure("cannot sync " + part.string());
      } catch (...) {
        std::fclose(out);
        fs::remove(part);
        throw;
      }
      std::fclose(out);
      std::string actual = sha256_file(part);
      if (actual != sha) {
        fs::remove(part);
        throw IntegrityError("downloaded " + file + " of " + repo + " (commit " +
                             metadata.id.substr(0, 12) + ", variant " + metadata.variant +
                             ") has sha256 " + actual + " but metadata.json expects " + sha +
                             "; the hub serves a corrupt file — nothing was cached");
      }
      fs::rename(part, blob);
    }
    link_or_copy(blob, dir / file);
  }
  fsync_path(dir);
  write_file_atomically(dir / "metadata.json", metadata_text);  // last: marks the variant complete
  return dir;
}

}  // namespace hk::hub
