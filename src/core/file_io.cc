// Regular-file reads and the one temporary-file primitive (see core/file_io.h).
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "hk/error.h"

namespace fs = std::filesystem;

namespace hk::files {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string random_name(std::string_view suffix) {
  unsigned char bytes[8];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw RuntimeFailure("cannot read random bytes for a temporary file name");
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string name = ".hk-";
  for (unsigned char b : bytes) {
    name += hex[b >> 4];
    name += hex[b & 15];
  }
  return name + std::string(suffix);
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd open_regular(const fs::path& path, std::string_view what, bool follow_symlinks) {
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  if (!follow_symlinks) flags |= O_NOFOLLOW;
  Fd fd(::open(path.c_str(), flags));
  if (!fd) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      throw NotFound(std::string(what) + " " + path.string() + " does not exist");
    if (err == ELOOP && !follow_symlinks)
      throw InvalidArgument(std::string(what) + " " + path.string() +
                            " is a symbolic link, which hk does not follow here");
    throw NotFound("cannot open " + std::string(what) + " " + path.string() + ": " +
                   errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    throw InvalidArgument(std::string(what) + " " + path.string() +
                          " is not a regular file (a FIFO, device or directory); hk reads only "
                          "regular files");
  // Reads of a regular file never block; clear O_NONBLOCK anyway so later reads behave normally.
  const int status = ::fcntl(fd.get(), F_GETFL);
  if (status >= 0) ::fcntl(fd.get(), F_SETFL, status & ~O_NONBLOCK);
  return fd;
}

size_t file_size(int fd, const fs::path& path_for_messages) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw RuntimeFailure("cannot stat " + path_for_messages.string() + ": " + errno_text(errno));
  return static_cast<size_t>(st.st_size);
}

std::string read_all(int fd, size_t max_bytes, const fs::path& path_for_messages) {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw RuntimeFailure("cannot read " + path_for_messages.string() + ": " + errno_text(errno));
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes)
      throw InvalidArgument(path_for_messages.string() + " is larger than " +
                            std::to_string(max_bytes) + " bytes, more than hk reads for it");
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

std::string read_regular_file(const fs::path& path, size_t max_bytes, std::string_view what,
                              bool follow_symlinks) {
  Fd fd = open_regular(path, what, follow_symlinks);
  return read_all(fd.get(), max_bytes, path);
}

TempFile::TempFile(const fs::path& dir, std::string_view suffix, mode_t mode)
    : dir_(dir.empty() ? fs::path(".") : dir) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    fs::path candidate = dir_ / random_name(suffix);
    int fd = ::open(candidate.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) {
      fd_ = fd;
      path_ = std::move(candidate);
      return;
    }
    if (errno != EEXIST)
      throw RuntimeFailure("cannot create a temporary file in " + dir_.string() + ": " +
                           errno_text(errno) + " (is the directory writable?)");
  }
  throw RuntimeFailure("cannot create a temporary file in " + dir_.string() +
                       ": every random name was taken");
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !path_.empty()) ::unlink(path_.c_str());
}

void TempFile::write(const void* data, size_t size, std::string_view label) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw RuntimeFailure("cannot write " + std::string(label) + " (" + path_.string() +
                           "): " + errno_text(errno) + " (is the disk full?)");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void TempFile::commit(const fs::path& target) {
  if (::fsync(fd_) != 0)
    throw RuntimeFailure("cannot flush " + target.string() + " to disk: " + errno_text(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    throw RuntimeFailure("cannot close " + target.string() + ": " + errno_text(errno));
  if (::rename(path_.c_str(), target.c_str()) != 0)
    throw RuntimeFailure("cannot rename " + path_.string() + " to " + target.string() + ": " +
                         errno_text(errno));
  committed_ = true;
  fsync_dir(target.has_parent_path() ? target.parent_path() : fs::path("."));
}

void write_file_atomically(const fs::path& target, std::string_view data, mode_t mode) {
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && !fs::is_directory(dir))
    throw RuntimeFailure("cannot create directory " + dir.string() + ": " + ec.message());
  TempFile tmp(dir, {}, mode);
  tmp.write(data.data(), data.size(), target.string());
  tmp.commit(target);
}

}  // namespace hk::files
