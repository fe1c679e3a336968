// hk/checkpoint.h — the weights of a model: one safetensors file or a sharded set.
//
// `Checkpoint::open` accepts a directory holding `model.safetensors.index.json` (sharded, the
// Hugging Face layout: {"weight_map": {tensor name: shard file}}) or `model.safetensors`, the
// index file itself, or a single .safetensors file. Opening validates everything up front: every
// shard exists and is a valid safetensors file, and every tensor the index lists is in the shard
// it names; errors name the missing shard or tensor and the index. Tensors present in a shard but
// not in the index are ignored, as Transformers does.
// Deliberately not here: config.json, key renaming for models, or other weight formats.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hk/safetensors.h"

namespace hk {

class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  // The directory or file given to open().
  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  // Tensor names in name order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(std::string_view name) const;
  // Throws NotFound naming the checkpoint.
  const TensorInfo& info(std::string_view name) const;
  // The file (shard) holding `name`.
  const SafetensorsFile& file_of(std::string_view name) const;
  // The opened files, in the order of their file names.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // The "__metadata__" of a single file, or of the first shard.
  const std::map<std::string, std::string>& metadata() const;

  // See SafetensorsFile::load.
  Tensor load(std::string_view name, Device device = Device::cpu(),
              std::optional<DType> dtype = std::nullopt, Stream stream = {}) const;

 private:
  std::string path_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> names_;
  std::map<std::string, size_t, std::less<>> file_index_;  // name → index into files_
};

}  // namespace hk
