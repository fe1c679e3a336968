// tests/common/cli_testing.h — running the built `hk` (HK_BINARY_DIR/bin/hk) from a test: its exit
// status, stdout and stderr apart, with extra environment settings. Header-only, POSIX popen.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hk::test {

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

inline std::string source_dir() {
  return env_or("HK_SOURCE_DIR", ".");
}
inline std::string binary_dir() {
  return env_or("HK_BINARY_DIR", ".");
}

// Single-quoted for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CliResult {
  int status = -1;
  std::string out, err;
};

// Runs `<tool> args` (args already quoted as needed) with `env` prepended as NAME=value (an empty
// value unsets NAME), in `cwd` when given. `tool` defaults to the built hk.
inline CliResult run_cli(const std::string& args,
                         const std::vector<std::pair<std::string, std::string>>& env = {},
                         const std::string& tool = "", const std::string& cwd = "") {
  static int counter = 0;
  const std::string err_path = "/tmp/hk_cli_test_stderr_" + std::to_string(getpid()) + "_" +
                               std::to_string(counter++) + ".txt";
  std::string assigns, unsets;
  for (const auto& [name, value] : env) {
    if (value.empty())
      unsets += "unset " + name + "; ";
    else
      assigns += name + "=" + shell_quote(value) + " ";
  }
  const std::string binary = tool.empty() ? binary_dir() + "/bin/hk" : tool;
  const std::string cd = cwd.empty() ? "" : "cd " + shell_quote(cwd) + " && ";
  const std::string cmd =
      cd + unsets + assigns + shell_quote(binary) + " " + args + " 2>" + shell_quote(err_path);
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.out.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(err_path);
  std::ostringstream s;
  s << in.rdbuf();
  r.err = s.str();
  std::remove(err_path.c_str());
  return r;
}

}  // namespace hk::test
