// The local launcher (launcher.h): fork + exec of one process per local rank, each in its own
// process group (so a terminal's Ctrl-C reaches them once, through the launcher, and a failing
// rank's siblings can be stopped by pid), and a wait loop that reaps children and forwards
// signals.
#include "train/distributed/launcher.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ostream>
#include <thread>

#include "hk/error.h"

extern char** environ;

namespace hk::dist {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

void set_var(std::vector<std::string>& env, const std::string& name, const std::string& value,
             bool overwrite = true) {
  const std::string prefix = name + "=";
  for (auto& e : env)
    if (e.compare(0, prefix.size(), prefix) == 0) {
      if (overwrite) e = prefix + value;
      return;
    }
  env.push_back(prefix + value);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

int shell_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

struct Child {
  pid_t pid = -1;
  int local_rank = 0, rank = 0;
  bool running = false;
};

}  // namespace

void validate(const LaunchOptions& o) {
  if (o.nproc_per_node < 1)
    throw InvalidArgument("--nproc-per-node must be >= 1, got " + std::to_string(o.nproc_per_node));
  if (o.nnodes < 1) throw InvalidArgument("--nnodes must be >= 1, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw InvalidArgument("--node-rank " + std::to_string(o.node_rank) +
                          " is outside the --nnodes " + std::to_string(o.nnodes) + " nodes (0 to " +
                          std::to_string(o.nnodes - 1) + ")");
  if (o.master_port < 1 || o.master_port > 65535)
    throw InvalidArgument("--master-port " + std::to_string(o.master_port) +
                          " is not a TCP port (1 to 65535)");
  if (o.master_addr.empty()) throw InvalidArgument("--master-addr must not be empty");
  if (o.nnodes > 1 && is_loopback(o.master_addr))
    throw InvalidArgument("--nnodes " + std::to_string(o.nnodes) + " with --master-addr " +
                          o.master_addr +
                          ": the other nodes cannot reach a loopback address; give the host "
                          "name or address of node 0");
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank,
                                          const std::vector<std::string>& base) {
  std::vector<std::string> env = base;
  const int world = o.nnodes * o.nproc_per_node;
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  set_var(env, "RANK", std::to_string(rank));
  set_var(env, "LOCAL_RANK", std::to_string(local_rank));
  set_var(env, "GROUP_RANK", std::to_string(o.node_rank));
  set_var(env, "ROLE_RANK", std::to_string(rank));
  set_var(env, "ROLE_NAME", "default");
  set_var(env, "LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  set_var(env, "WORLD_SIZE", std::to_string(world));
  set_var(env, "GROUP_WORLD_SIZE", std::to_string(o.nnodes));
  set_var(env, "ROLE_WORLD_SIZE", std::to_string(world));
  set_var(env, "MASTER_ADDR", o.master_addr);
  set_var(env, "MASTER_PORT", std::to_string(o.master_port));
  set_var(env, "TORCHELASTIC_RESTART_COUNT", "0");
  set_var(env, "TORCHELASTIC_MAX_RESTARTS", "0");
  set_var(env, "TORCHELASTIC_RUN_ID", o.run_id);
  if (o.nproc_per_node > 1) set_var(env, "OMP_NUM_THREADS", "1", /*overwrite=*/false);
  set_var(env, "NCCL_NVLS_ENABLE", "0", /*overwrite=*/false);
  return env;
}

int launch(const LaunchOptions& o, const std::string& program, const std::vector<std::string>& args,
           std::ostream& log) {
  validate(o);
  // Signals to forward are taken synchronously (sigtimedwait) instead of by handlers.
  sigset_t forward, previous;
  sigemptyset(&forward);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&forward, s);
  pthread_sigmask(SIG_BLOCK, &forward, &previous);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};

  const std::vector<std::string> base = current_environment();
  std::vector<Child> children;
  auto stop_all = [&](int sig) {
    for (const Child& c : children)
      if (c.running) ::kill(c.pid, sig);
  };
  for (int local = 0; local < o.nproc_per_node; ++local) {
    std::vector<std::string> env = rank_environment(o, local, base);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string prog = program;
    argv.push_back(prog.data());
    std::vector<std::string> args_copy = args;
    for (auto& a : args_copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      stop_all(SIGKILL);
      for (const Child& c : children) ::waitpid(c.pid, nullptr, 0);
      throw RuntimeFailure("hk launcher: cannot start local rank " + std::to_string(local) + ": " +
                           std::strerror(err));
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      ::execve(program.c_str(), argv.data(), envp.data());
      const std::string msg =
          "hk launcher: cannot run " + program + ": " + std::strerror(errno) + "\n";
      (void)!::write(STDERR_FILENO, msg.data(), msg.size());
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so it holds before the launcher signals it
    Child c;
    c.pid = pid;
    c.local_rank = local;
    c.rank = o.node_rank * o.nproc_per_node + local;
    c.running = true;
    children.push_back(c);
  }

  int result = 0;
  int running = static_cast<int>(children.size());
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  while (running > 0) {
    // Reap whatever exited.
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (Child& c : children) {
        if (c.pid != pid || !c.running) continue;
        c.running = false;
        --running;
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
          result = shell_status(status);
          log << "hk: rank " << c.rank << " (local rank " << c.local_rank << ", pid " << c.pid
              << ") " << describe_status(status);
          if (running > 0)
            log << "; stopping the other " << running << " rank" << (running == 1 ? "" : "s");
          log << std::endl;
          stopping = true;
          stop_deadline = std::chrono::steady_clock::now() + o.grace;
          stop_all(SIGTERM);
        }
      }
    }
    if (running == 0) break;
    if (stopping && !killed && std::chrono::steady_clock::now() >= stop_deadline) {
      log << "hk: " << running << " rank" << (running == 1 ? "" : "s")
          << " still running after the grace period; killing them" << std::endl;
      stop_all(SIGKILL);
      killed = true;
    }
    timespec wait{0, 20 * 1000 * 1000};
    siginfo_t info;
    const int sig = ::sigtimedwait(&forward, &info, &wait);
    if (sig > 0) {
      stop_all(sig);
      if (!stopping) {
        result = 128 + sig;
        stopping = true;
        stop_deadline = std::chrono::steady_clock::now() + o.grace;
        log << "hk: got signal " << sig << " (" << ::strsignal(sig) << "); passed it to the "
            << running << " running rank" << (running == 1 ? "" : "s") << std::endl;
      }
    }
  }
  return result;
}

}  // namespace hk::dist
