// Helpers shared by the training tests: fixture paths, JSON fixtures, temporary directories, and
// running the built `hk` binary.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace hk::test {

inline std::string source_dir() {
  const char* dir = std::getenv("HK_SOURCE_DIR");
  return dir ? dir : HK_TEST_SOURCE_DIR;
}
inline std::string model_fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/models/" + name;
}
inline std::string train_fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/train/" + name;
}
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("hk-train-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct CliRun {
  int status;
  std::string out;
};

inline std::string hk_binary() {
  const char* dir = std::getenv("HK_BINARY_DIR");
  return std::string(dir ? dir : ".") + "/bin/hk";
}

// Runs `hk <args>`; stdout (and stderr unless `stderr_to_null`) captured.
inline CliRun run_hk(const std::string& args, bool stderr_to_null = false) {
  const std::string cmd = hk_binary() + " " + args + (stderr_to_null ? " 2>/dev/null" : " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace hk::test
