// Safetensors writer: one header, one data buffer, written atomically.
//
// Atomic means: the bytes go to a temporary file in the destination directory (same file system,
// so rename is atomic; created by hk's one temp-file primitive, core/file_io.h, so a planted file
// or symlink is never written through), which is fsync'd, renamed over the destination and the
// directory fsync'd so the rename itself survives a crash. Readers therefore see the old file or
// the complete new one. Deliberately not here: streaming writes of tensors larger than memory from
// a generator, or preserving the permissions/ownership of a file being replaced (the new file gets
// 0644 minus the umask, like any newly created file).
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

#include "core/file_io.h"
#include "hk/error.h"
#include "hk/safetensors.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; hk supports little-endian hosts only");

namespace hk {
namespace {

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

  // hk's one temporary-file primitive: a new random name in the target's directory.
  const std::filesystem::path target(path);
  files::TempFile file(target.has_parent_path() ? target.parent_path()
                                                : std::filesystem::path("."));
  file.write(&header_len, 8, path);
  file.write(text.data(), text.size(), path);
  for (const auto& e : entries)
    if (e.host.nbytes()) file.write(e.host.view().ptr(), e.host.nbytes(), path);
  file.commit(target);
}

}  // namespace hk
