// Helpers for the io tests: scratch directories and hand-made safetensors bytes.
//
// Bad files are produced here from a known-good layout (header text + data) so every malformed
// case is one small, readable edit; nothing is read from outside the test's own directory except
// the committed fixtures.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace hk::test {

// A fresh directory under the system temp dir, removed when the object dies.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "hk_io_" + std::string(info ? info->test_suite_name() : "t") + "_" +
                       std::string(info ? info->name() : "x") + "_" + std::to_string(::getpid());
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// 8-byte length + header text + data; `header_len` overrides the length field.
inline std::string safetensors_bytes(const std::string& header, const std::string& data,
                                     int64_t header_len = -1) {
  return le64(header_len < 0 ? header.size() : static_cast<uint64_t>(header_len)) + header + data;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string source_dir() {
  const char* dir = std::getenv("HK_SOURCE_DIR");
  return dir ? dir : ".";
}

inline std::string torch_fixture() {
  return source_dir() + "/tests/fixtures/safetensors/torch_small.safetensors";
}

}  // namespace hk::test
