// Helpers shared by the training tests: fixture paths, JSON fixtures, temporary directories, and
// running the built `hk` binary.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

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
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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

// The JSON objects of `hk ... --json` output, one a line (other lines skipped).
inline std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// Starts `/bin/sh -c "exec <command>"` (redirections included) in the background with this
// process' environment plus `extra_env` (NAME=value); returns its pid (-1 on failure).
inline pid_t spawn_shell(const std::string& command, const std::vector<std::string>& extra_env) {
  const std::string cmd = "exec " + command;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  for (const auto& e : extra_env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), envp.data()) != 0)
    return -1;
  return pid;
}

}  // namespace hk::test
