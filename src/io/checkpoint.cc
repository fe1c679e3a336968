// Checkpoint: resolves a directory / index / file to opened safetensors files and a name table.
//
// A sharded index is trusted only as far as it checks out: shard names must be plain relative
// paths inside the checkpoint directory (no absolute paths, no ".."), each shard must open and
// validate, and each listed tensor must be in its shard. The index is read as a regular file (a
// FIFO is refused, not waited on) through the strict JSON reader (nesting bounded; a repeated key
// keeps the last value, as Python's json does). Deliberately not here: downloading missing
// shards, or merging several indexes.
#include "hk/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/strict_json.h"
#include "hk/error.h"

namespace hk {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool is_index_file(const fs::path& p) {
  const std::string name = p.filename().string();
  const std::string suffix = ".index.json";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json read_index(const fs::path& index_path) {
  std::string text;
  try {
    text = files::read_regular_file(index_path, 256u << 20, "checkpoint index");
  } catch (const NotFound&) {
    throw NotFound("cannot open checkpoint index '" + index_path.string() + "'");
  }
  JsonLimits limits;
  limits.allow_duplicate_keys = true;
  return parse_json_strict(text, "checkpoint index '" + index_path.string() + "' ", limits);
}

// A shard name from the index, checked to stay inside the checkpoint directory.
fs::path shard_path(const fs::path& index_path, const std::string& shard) {
  const fs::path rel(shard);
  bool escapes = shard.empty() || rel.is_absolute();
  for (const auto& part : rel)
    if (part == "..") escapes = true;
  if (escapes)
    throw InvalidArgument("checkpoint index '" + index_path.string() + "' names shard '" + shard +
                          "', which is not a file inside the checkpoint directory");
  return index_path.parent_path() / rel;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  const fs::path p(path);
  std::error_code ec;
  fs::path index_path, single_path;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / kIndexFile, ec))
      index_path = p / kIndexFile;
    else if (fs::exists(p / kSingleFile, ec))
      single_path = p / kSingleFile;
    else
      throw NotFound("checkpoint directory '" + path + "' has neither " + kIndexFile + " nor " +
                     kSingleFile);
  } else if (is_index_file(p)) {
    index_path = p;
  } else {
    single_path = p;
  }

  if (!single_path.empty()) {
    ckpt.files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& t : ckpt.files_[0].tensors()) {
      ckpt.names_.push_back(t.name);
      ckpt.file_index_[t.name] = 0;
    }
    return ckpt;
  }

  ckpt.sharded_ = true;
  const json index = read_index(index_path);
  const std::string where = "checkpoint index '" + index_path.string() + "'";
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw InvalidArgument(where + " has no \"weight_map\" object; re-download it");
  std::map<std::string, size_t> shard_numbers;  // shard name → index into files_
  for (const auto& [name, shard] : index["weight_map"].items())
    if (!shard.is_string())
      throw InvalidArgument(where + " maps tensor '" + escape_control_bytes(name) + "' to a " +
                            shard.type_name() + ", not to a shard file name");
    else
      shard_numbers.emplace(shard.get<std::string>(), 0);
  size_t number = 0;
  for (auto& [shard, slot] : shard_numbers) {
    const fs::path file = shard_path(index_path, shard);
    if (!fs::is_regular_file(file, ec))
      throw NotFound(where + " lists shard '" + shard + "', but '" + file.string() +
                     "' does not exist; the checkpoint is incomplete, download the missing shard");
    ckpt.files_.push_back(SafetensorsFile::open(file.string()));
    slot = number++;
  }
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const size_t i = shard_numbers.at(shard.get<std::string>());
    if (!ckpt.files_[i].find(name))
      throw InvalidArgument(where + " puts tensor '" + name + "' in shard '" +
                            shard.get<std::string>() +
                            "', but that file has no such tensor; the shards do not match the "
                            "index, re-download the checkpoint");
    ckpt.names_.push_back(name);
    ckpt.file_index_[name] = i;
  }
  return ckpt;
}

bool Checkpoint::contains(std::string_view name) const {
  return file_index_.find(name) != file_index_.end();
}

const SafetensorsFile& Checkpoint::file_of(std::string_view name) const {
  const auto it = file_index_.find(name);
  if (it == file_index_.end())
    throw NotFound("checkpoint '" + path_ + "' has no tensor '" + std::string(name) +
                   "' (`hk inspect " + path_ + "` lists its tensors)");
  return files_[it->second];
}

const TensorInfo& Checkpoint::info(std::string_view name) const {
  return file_of(name).info(name);
}

const std::map<std::string, std::string>& Checkpoint::metadata() const {
  static const std::map<std::string, std::string> empty;
  return files_.empty() ? empty : files_.front().metadata();
}

Tensor Checkpoint::load(std::string_view name, Device device, std::optional<DType> dtype,
                        Stream stream) const {
  return file_of(name).load(name, device, dtype, stream);
}

}  // namespace hk
