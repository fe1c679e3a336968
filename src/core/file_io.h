// Reading and writing files that hk does not control (checkpoints, configs, kernel caches, lock
// files): internal to libhk.
//
// - Reads accept regular files only. A FIFO, device or directory named like a checkpoint would
//   block the reader forever or feed it garbage, so `open_regular` opens with O_NONBLOCK (which
//   never blocks, even on a FIFO without a writer), checks fstat and only then clears O_NONBLOCK.
//   Reads are bounded by a byte limit that the caller chooses.
// - There is one way to create a temporary file: `TempFile`, O_CREAT | O_EXCL | O_NOFOLLOW with a
//   random short name in the target's own directory. A pre-planted file or symlink is never
//   written through (O_EXCL fails on any existing name, symlinks included), the name never
//   exceeds NAME_MAX whatever the target is called, and the rename onto the target is atomic
//   (same directory, so same file system). rename(2) replaces a symlink at the target itself,
//   never the file it points to.
//
// Deliberately not here: locking (the kernel cache has its own per-repo flock) and anything that
// interprets the bytes.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace hk::files {

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Opens `path` for reading, refusing (without blocking) anything that is not a regular file.
// `follow_symlinks = false` also refuses a symlink as the last component. Throws NotFound when
// it does not exist and InvalidArgument when it is not a regular file, naming `what` ("config
// file", "safetensors file", ...) and the path.
Fd open_regular(const std::filesystem::path& path, std::string_view what,
                bool follow_symlinks = true);

// Size of an open regular file.
size_t file_size(int fd, const std::filesystem::path& path_for_messages);

// Reads everything from `fd` (from its current position); more than `max_bytes` is an
// InvalidArgument naming the path and the limit.
std::string read_all(int fd, size_t max_bytes, const std::filesystem::path& path_for_messages);

// open_regular + read_all.
std::string read_regular_file(const std::filesystem::path& path, size_t max_bytes,
                              std::string_view what, bool follow_symlinks = true);

// A new, empty file with a random name in `dir`, removed on destruction unless committed.
class TempFile {
 public:
  // `suffix` is appended to the random name (".part" for downloads); `mode` is filtered by the
  // umask as for any new file.
  explicit TempFile(const std::filesystem::path& dir, std::string_view suffix = {},
                    mode_t mode = 0644);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }
  // Appends all of `data`; a short write (disk full) is a RuntimeFailure naming `label`.
  void write(const void* data, size_t size, std::string_view label);
  // fsync + close, then rename onto `target` (on the same file system: normally the same
  // directory) and fsync the target's directory so the rename survives a crash.
  void commit(const std::filesystem::path& target);

 private:
  int fd_ = -1;
  std::filesystem::path dir_, path_;
  bool committed_ = false;
};

// Writes `data` to `target` atomically through a TempFile in its directory (created if needed).
void write_file_atomically(const std::filesystem::path& target, std::string_view data,
                           mode_t mode = 0644);

}  // namespace hk::files
