// Internal: the local launcher behind `hk train --nproc-per-node N` — torchrun's job for one
// node: start N copies of a program, one per GPU, each with torchrun's environment; forward
// SIGINT / SIGTERM / SIGHUP to them; when one fails, stop the others (SIGTERM, then SIGKILL after
// a grace period) and report which rank failed and how.
//
// Multi-node: every node runs the launcher with the same --nnodes / --master-addr /
// --master-port and its own --node-rank; global ranks are node_rank · N + local rank (torchrun's
// static rendezvous). What the ranks then do to find each other is hk::dist::init_process_group's
// rendezvous, not the launcher's. Deliberately not here: restarts (elastic membership), per-rank
// log files, CPU binding.
#pragma once

#include <chrono>
#include <iosfwd>
#include <string>
#include <vector>

namespace hk::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // After a rank fails (or a signal arrives), how long the others get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace = std::chrono::seconds(10);
  std::string run_id = "none";  // TORCHELASTIC_RUN_ID (torchrun's static rendezvous: "none")
};

// Throws InvalidArgument naming the flag for values out of range (--nproc-per-node < 1,
// --node-rank outside --nnodes, a port outside 1..65535, several nodes on a loopback address).
void validate(const LaunchOptions& options);

// The environment of local rank `local_rank`: `base` (NAME=value entries) with torchrun's
// variables set — RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE,
// WORLD_SIZE, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID — and, unless `base`
// has them, OMP_NUM_THREADS=1 (several ranks per node; torchrun's default) and
// NCCL_NVLS_ENABLE=0. Variables of other launchers (OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID ...)
// are kept: torchrun's take precedence in hk::dist::RankEnvironment.
std::vector<std::string> rank_environment(const LaunchOptions& options, int local_rank,
                                          const std::vector<std::string>& base);

// Starts `program` with `args` (argv[1..]) once per local rank and waits for all of them.
// Returns 0 when every rank exited 0; otherwise the first failure's status (its exit code, or
// 128 + signal), after stopping the others; 128 + signal when the launcher itself was signalled.
// Progress and failures are reported on `log` (one line each).
int launch(const LaunchOptions& options, const std::string& program,
           const std::vector<std::string>& args, std::ostream& log);

// This process' environment as NAME=value entries.
std::vector<std::string> current_environment();

}  // namespace hk::dist
