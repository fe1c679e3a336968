// Helpers for the hub tests: temporary directories, synthetic hub trees with real digests, child
// processes with a timeout, and a `hk hub serve` child on an ephemeral port.
//
// Everything is bounded: every wait has a deadline, and a child still running at the end of a
// test is killed. Header-only so each test file stays self-contained.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hk/hub.h"

extern char** environ;

namespace hk::hub::testing {

namespace fs = std::filesystem;

inline fs::path binary_dir() {
  const char* d = std::getenv("HK_BINARY_DIR");
  return d ? fs::path(d) : fs::current_path();
}
inline fs::path hk_exe() {
  return binary_dir() / "bin" / "hk";
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "hk-hub-test-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    if (!made) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// The message of what `fn` throws, or "(no exception)".
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

inline std::string commit_id(char c) {
  return std::string(40, c);
}

// Describes one synthetic variant: its backend and the files it ships (name → bytes).
struct FakeVariant {
  std::string variant = "hk1-cpu-x86_64-linux";
  std::string backend_json = R"({"type": "cpu"})";
  int abi_major = 1;
  std::vector<std::string> entries{"RMSNorm"};
  std::map<std::string, std::string> files{{"libfake.so", "not really a library"}};
  std::string library = "libfake.so";
  bool declare_sizes = true;  // write "size" (the SDK always does; older hubs did not)
};

// Writes <root>/<repo>/<commit>/build/<variant>/{files, metadata.json with real digests and
// sizes}.
inline fs::path write_variant(const fs::path& root, const std::string& repo,
                              const std::string& commit, const std::string& version,
                              const FakeVariant& v) {
  fs::path dir = root / repo / commit / "build" / v.variant;
  fs::create_directories(dir);
  std::string digests, sizes, entries;
  for (const auto& [name, bytes] : v.files) {
    write_file(dir / name, bytes);
    digests += std::string(digests.empty() ? "" : ", ") + "\"" + name + "\": \"" +
               sha256_file(dir / name) + "\"";
    sizes += std::string(sizes.empty() ? "" : ", ") + "\"" + name +
             "\": " + std::to_string(bytes.size());
  }
  for (const auto& e : v.entries)
    entries += std::string(entries.empty() ? "" : ", ") + R"({"name": ")" + e +
               R"(", "interface": "rms_norm", "interface_version": 1, "modes": ["inference"]})";
  std::string name = repo.substr(repo.find('/') + 1);
  write_file(dir / "metadata.json",
             "{\"name\": \"" + name + "\", \"repo\": \"" + repo + "\", \"version\": \"" + version +
                 "\", \"id\": \"" + commit + "\", \"variant\": \"" + v.variant +
                 "\", \"abi\": {\"major\": " + std::to_string(v.abi_major) +
                 ", \"minor\": 0}, \"backend\": " + v.backend_json +
                 ", \"os\": \"linux\", \"arch\": \"" + host_arch() + "\", \"library\": \"" +
                 v.library + "\", \"entries\": [" + entries + "], \"digest\": {\"sha256\": {" +
                 digests + "}}" + (v.declare_sizes ? ", \"size\": {" + sizes + "}" : "") + "}");
  return dir;
}

inline void write_ref(const fs::path& root, const std::string& repo, const std::string& kind,
                      const std::string& name, const std::string& commit) {
  write_file(root / repo / "refs" / kind / name, commit + "\n");
}

// A process result.
struct ProcessResult {
  int exit_code = -1;  // -signal when killed
  std::string out, err;
  bool timed_out = false;
  long max_rss_kb = 0;      // peak resident memory of the child
  double wall_seconds = 0;  // from start to exit
};

inline std::vector<std::string> make_env(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string item(*e);
    std::string key = item.substr(0, item.find('='));
    if (!overrides.count(key)) env.push_back(item);
  }
  for (const auto& [k, v] : overrides)
    if (v != "<unset>") env.push_back(k + "=" + v);
  return env;
}

// A started child with stdout/stderr pipes.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_strings = make_env(env);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    started_ = std::chrono::steady_clock::now();
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data()) != 0)
      throw std::runtime_error("cannot start " + argv[0]);
    posix_spawn_file_actions_destroy(&actions);
    close(out_pipe[1]);
    close(err_pipe[1]);
    out_fd_ = out_pipe[0];
    err_fd_ = err_pipe[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }
  pid_t pid() const { return pid_; }

  // Reads stdout until it holds a full line or the deadline passes; returns the line or "".
  std::string read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out_.find('\n') == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !pump(static_cast<int>(left.count()))) break;
    }
    size_t nl = out_.find('\n');
    if (nl == std::string::npos) return {};
    std::string line = out_.substr(0, nl);
    out_.erase(0, nl + 1);
    return line;
  }

  // Waits for exit (collecting output); kills the child at the deadline.
  ProcessResult wait(std::chrono::milliseconds timeout) {
    ProcessResult r;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        r.timed_out = true;
        kill(pid_, SIGKILL);
        break;
      }
      pump(static_cast<int>(std::min<long>(left.count(), 200)));
    }
    int status = 0;
    struct rusage usage {};
    wait4(pid_, &status, 0, &usage);
    pid_ = -1;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    r.max_rss_kb = usage.ru_maxrss;
    r.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    r.out = out_;
    r.err = err_;
    return r;
  }

  void kill_now(int sig) { kill(pid_, sig); }

 private:
  // One poll round; returns false when both pipes are closed.
  bool pump(int timeout_ms) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    if (n == 0) return false;
    if (poll(fds, n, timeout_ms) <= 0) return true;
    for (int i = 0; i < n; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      bool is_out = fds[i].fd == out_fd_;
      if (got <= 0) {
        close(fds[i].fd);
        (is_out ? out_fd_ : err_fd_) = -1;
      } else {
        (is_out ? out_ : err_).append(buf, static_cast<size_t>(got));
      }
    }
    return true;
  }
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point started_;
  int out_fd_ = -1, err_fd_ = -1;
  std::string out_, err_;
};

inline ProcessResult run_hk(const std::vector<std::string>& args,
                            const std::map<std::string, std::string>& env,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  std::vector<std::string> argv{hk_exe().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child(argv, env);
  return child.wait(timeout);
}

// `hk hub serve --root DIR --port 0` as a child; the URL is read from its first output line.
class ServerProcess {
 public:
  explicit ServerProcess(const fs::path& root, long throttle = 0, const std::string& token = "",
                         const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> argv{hk_exe().string(), "hub",    "serve", "--root",
                                  root.string(),     "--port", "0"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    if (throttle > 0) {
      argv.push_back("--throttle");
      argv.push_back(std::to_string(throttle));
    }
    if (!token.empty()) {
      argv.push_back("--require-token");
      argv.push_back(token);
    }
    child_ = std::make_unique<Child>(argv, std::map<std::string, std::string>{});
    std::string line = child_->read_line(std::chrono::seconds(10));
    size_t at = line.find("http://");
    if (at == std::string::npos) throw std::runtime_error("hk hub serve did not start: " + line);
    url_ = line.substr(at);
  }
  ~ServerProcess() { stop(); }
  void stop() {
    if (!child_) return;
    child_->kill_now(SIGTERM);
    child_->wait(std::chrono::seconds(5));
    child_.reset();
  }
  const std::string& url() const { return url_; }

 private:
  std::unique_ptr<Child> child_;
  std::string url_;
};

}  // namespace hk::hub::testing
