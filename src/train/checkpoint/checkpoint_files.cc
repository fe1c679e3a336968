// Checkpoint directories on disk (hk/train_checkpoint.h): atomic writes (staging directory, fsync,
// rename), listing, the completeness check resume relies on, rotation, and cleanup.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "hk/error.h"
#include "hk/safetensors.h"
#include "hk/train_checkpoint.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw RuntimeFailure(what + " " + path + " failed: " + std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) io_error("opening", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_error("fsync of", path);
}

void write_and_sync(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_error("creating", path);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      io_error("writing", path);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error("fsync of", path);
  }
  ::close(fd);
}

const std::regex& checkpoint_name() {
  static const std::regex re("^checkpoint-([0-9]+)$");
  return re;
}

// Removes `dir` after renaming it to a hidden name, so that a crash during the removal never
// leaves a partial directory under a checkpoint name.
void remove_checkpoint_dir(const fs::path& dir) {
  fs::path hidden = dir.parent_path() /
                    ("." + dir.filename().string() + ".deleting-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::rename(dir, hidden, ec);
  if (ec) throw RuntimeFailure("cannot remove checkpoint " + dir.string() + ": " + ec.message());
  fsync_path(dir.parent_path().string(), true);
  fs::remove_all(hidden, ec);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const fs::path p(path);
  const fs::path tmp =
      p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()));
  write_and_sync(tmp.string(), text);
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) throw RuntimeFailure("renaming " + tmp.string() + " to " + path + ": " + ec.message());
  fsync_path(p.parent_path().empty() ? "." : p.parent_path().string(), true);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, checkpoint_name()))
      out.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> missing_checkpoint_files(const std::string& dir) {
  static const char* required[] = {
      "model.safetensors",     "config.json",     "trainer_state.json",
      "optimizer.safetensors", "optimizer.json",  "scheduler.json",
      "rng_state.json",        "data_state.json", "hk_checkpoint.json"};
  std::vector<std::string> missing;
  for (const char* f : required)
    if (!fs::is_regular_file(fs::path(dir) / f)) missing.emplace_back(f);
  return missing;
}

std::optional<std::string> last_checkpoint(const std::string& output_dir) {
  auto all = list_checkpoints(output_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (missing_checkpoint_files(it->second).empty()) return it->second;
  return std::nullopt;
}

void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep) {
  if (limit <= 0) return;
  auto all = list_checkpoints(output_dir);
  int64_t excess = static_cast<int64_t>(all.size()) - limit;
  for (const auto& [step, path] : all) {
    if (excess <= 0) break;
    if (!keep.empty() && fs::equivalent(path, keep)) continue;
    remove_checkpoint_dir(path);
    --excess;
  }
}

void remove_stale_checkpoint_dirs(const std::string& output_dir) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return;
  static const std::regex stale("^\\.checkpoint-[0-9]+\\.(tmp|deleting)-[0-9]+$");
  std::vector<fs::path> victims;
  for (const auto& entry : fs::directory_iterator(output_dir, ec))
    if (std::regex_match(entry.path().filename().string(), stale)) victims.push_back(entry.path());
  for (const auto& v : victims) fs::remove_all(v, ec);
}

CheckpointWriter::CheckpointWriter(const std::string& output_dir, int64_t step)
    : output_dir_(output_dir) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec)
    throw RuntimeFailure("cannot create output directory " + output_dir + ": " + ec.message());
  const std::string name = "checkpoint-" + std::to_string(step);
  final_ = (fs::path(output_dir) / name).string();
  staging_ = (fs::path(output_dir) / ("." + name + ".tmp-" + std::to_string(::getpid()))).string();
  fs::remove_all(staging_, ec);
  fs::create_directory(staging_, ec);
  if (ec) throw RuntimeFailure("cannot create " + staging_ + ": " + ec.message());
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void CheckpointWriter::write_text(const std::string& name, const std::string& text) {
  write_and_sync((fs::path(staging_) / name).string(), text);
}

void CheckpointWriter::write_tensors(const std::string& name,
                                     const std::vector<std::pair<std::string, TensorView>>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  save_safetensors((fs::path(staging_) / name).string(), tensors, metadata);
}

void CheckpointWriter::copy_file(const std::string& source, const std::string& name) {
  std::error_code ec;
  if (!fs::is_regular_file(source, ec)) return;
  std::ifstream in(source, std::ios::binary);
  if (!in) throw RuntimeFailure("cannot read " + source);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_text(name, text);
}

std::string CheckpointWriter::commit() {
  fsync_path(staging_, true);
  std::error_code ec;
  if (fs::exists(final_, ec)) remove_checkpoint_dir(final_);
  fs::rename(staging_, final_, ec);
  if (ec) throw RuntimeFailure("renaming " + staging_ + " to " + final_ + ": " + ec.message());
  fsync_path(output_dir_, true);
  committed_ = true;
  return final_;
}

}  // namespace hk
