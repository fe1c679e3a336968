// Safetensors writer: one header, one data buffer, written atomically.
//
// Atomic means: the bytes go to a temporary file in the destination directory (same file system,
// so rename is atomic), which is fsync'd, renamed over the destination and the directory fsync'd
// so the rename itself survives a crash. Readers therefore see the old file or the complete new
// one. Deliberately not here: streaming writes of tensors larger than memory from a generator,
// or preserving the permissions/ownership of a file being replaced (the new file gets 0644 minus
// the umask, like any newly created file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "hk/error.h"
#include "hk/safetensors.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; hk supports little-endian hosts only");

namespace hk {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// A temporary file that is removed unless committed.
class TempFile {
 public:
  explicit TempFile(const std::string& final_path) {
    namespace fs = std::filesystem;
    const fs::path target(final_path);
    dir_ = target.has_parent_path() ? target.parent_path().string() : ".";
    // Hidden, next to the target (same file system, so the rename is atomic).
    std::string name = ".";
    name += target.filename().string();
    name += ".tmp.XXXXXX";
    std::string pattern = (fs::path(dir_) / name).string();
    fd_ = ::mkostemp(pattern.data(), O_CLOEXEC);
    if (fd_ < 0)
      throw RuntimeFailure("cannot create a temporary file in '" + dir_ + "' to write '" +
                           final_path + "': " + errno_text());
    path_ = pattern;
    ::fchmod(fd_, 0644 & ~current_umask());
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, size_t size, const std::string& final_path) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw RuntimeFailure("cannot write '" + final_path + "': " + errno_text() +
                             " (is the disk full?)");
      p += n;
      size -= static_cast<size_t>(n);
    }
  }

  void commit(const std::string& final_path) {
    if (::fsync(fd_) != 0)
      throw RuntimeFailure("cannot flush '" + final_path + "' to disk: " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0)
      throw RuntimeFailure("cannot close '" + final_path + "': " + errno_text());
    if (::rename(path_.c_str(), final_path.c_str()) != 0)
      throw RuntimeFailure("cannot rename the temporary file to '" + final_path +
                           "': " + errno_text());
    committed_ = true;
    // Make the rename durable; a failure here is reported since the file may not survive a crash.
    const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
      const std::string why = errno_text();
      if (dir_fd >= 0) ::close(dir_fd);
      throw RuntimeFailure("wrote '" + final_path + "' but cannot flush its directory '" + dir_ +
                           "': " + why);
    }
    ::close(dir_fd);
  }

 private:
  static mode_t current_umask() {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    return mask;
  }
  std::string dir_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

struct Entry {
  std::string name;
  Tensor host;  // contiguous, on the CPU
};

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, TensorView>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::vector<Entry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, view] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw InvalidArgument("cannot save '" + path + "': tensor name '" + name +
                            "' is reserved or empty");
    if (!names.insert(name).second)
      throw InvalidArgument("cannot save '" + path + "': tensor name '" + name + "' appears twice");
    if (!view.defined())
      throw InvalidArgument("cannot save '" + path + "': tensor '" + name + "' is undefined");
    safetensors_dtype_name(view.dtype);  // throws for dtypes without a safetensors name
    Tensor t = Tensor::wrap(view);
    if (!t.device().is_cpu()) t = t.to(Device::cpu());  // synchronises the default stream
    t = t.contiguous();
    entries.push_back({name, std::move(t)});
  }
  // Largest elements first keeps every tensor aligned to its element size (the header is padded
  // to 8 bytes), so readers can view tensors in place; ties in name order for reproducible files.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    const size_t sa = dtype_size(a.host.dtype()), sb = dtype_size(b.host.dtype());
    return sa != sb ? sa > sb : a.name < b.name;
  });

  nlohmann::json header = nlohmann::json::object();  // std::map: keys come out sorted
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    const uint64_t size = e.host.nbytes();
    header[e.name] = {{"dtype", safetensors_dtype_name(e.host.dtype())},
                      {"shape", e.host.sizes()},
                      {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgument("cannot save '" + path +
                          "': tensor names and metadata must be valid UTF-8 text");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  TempFile file(path);
  file.write(&header_len, 8, path);
  file.write(text.data(), text.size(), path);
  for (const auto& e : entries)
    if (e.host.nbytes()) file.write(e.host.view().ptr(), e.host.nbytes(), path);
  file.commit(path);
}

}  // namespace hk
