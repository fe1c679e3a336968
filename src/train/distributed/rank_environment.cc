// RankEnvironment (hk/distributed.h): which rank this process is, read from the variables of
// torchrun (and hk's launcher), MPI or Slurm, validated so that a wrong launch fails with the
// variable's name instead of a rendezvous that waits forever.
//
// It reads; it never sets variables or starts processes (launcher.cc does that).
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "hk/distributed.h"
#include "hk/error.h"

namespace hk::dist {
namespace {

using Lookup = std::function<const char*(const char*)>;

bool has(const Lookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && *v != '\0';
}

int int_var(const Lookup& env, const char* name, int min_value) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0')
    throw InvalidArgument(std::string("the environment variable ") + name +
                          " is not set; the launcher that started this process must set it");
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < min_value || x > 1 << 24)
    throw InvalidArgument(std::string("the environment variable ") + name + "='" + v +
                          "' is not an integer >= " + std::to_string(min_value));
  return static_cast<int>(x);
}

int int_var_or(const Lookup& env, const char* name, int min_value, int fallback) {
  return has(env, name) ? int_var(env, name, min_value) : fallback;
}

// Slurm's SLURM_TASKS_PER_NODE: "4(x2),3" = 4 tasks on each of two nodes, then 3. Returns the
// count of node `node` (0 when the string is malformed or too short).
int slurm_tasks_on_node(const std::string& spec, int node) {
  int index = 0;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    int tasks = 0, repeat = 1;
    const size_t paren = item.find("(x");
    try {
      tasks = std::stoi(item.substr(0, paren));
      if (paren != std::string::npos) repeat = std::stoi(item.substr(paren + 2));
    } catch (const std::exception&) {
      return 0;
    }
    if (node < index + repeat) return tasks;
    index += repeat;
    pos = comma + 1;
  }
  return 0;
}

void validate(RankEnvironment& e, const Lookup& env, const char* rank_var, const char* size_var,
              const char* local_var, const char* local_size_var) {
  if (e.rank >= e.world_size)
    throw InvalidArgument(std::string(rank_var) + "=" + std::to_string(e.rank) +
                          " is outside the world of " + size_var + "=" +
                          std::to_string(e.world_size) + " ranks (ranks are 0 to " +
                          std::to_string(e.world_size - 1) + ")");
  if (e.local_world_size > e.world_size)
    throw InvalidArgument(std::string(local_size_var) + "=" + std::to_string(e.local_world_size) +
                          " is larger than " + size_var + "=" + std::to_string(e.world_size));
  if (e.local_rank >= e.local_world_size)
    throw InvalidArgument(std::string(local_var) + "=" + std::to_string(e.local_rank) +
                          " is outside the " + std::to_string(e.local_world_size) +
                          " ranks of this node (" + local_size_var + ")");
  if (has(env, "MASTER_ADDR")) {
    e.master_addr = env("MASTER_ADDR");
  } else if (e.local_world_size != e.world_size) {
    throw InvalidArgument(
        "MASTER_ADDR is not set, and the " + std::to_string(e.world_size) +
        " ranks span several nodes (" + std::to_string(e.local_world_size) +
        " on this one); export MASTER_ADDR=<the host of rank 0> (and MASTER_PORT) for every "
        "rank before starting them");
  }
  e.master_port = int_var_or(env, "MASTER_PORT", 1, 29500);
  if (e.master_port > 65535)
    throw InvalidArgument("MASTER_PORT=" + std::to_string(e.master_port) +
                          " is not a TCP port (1 to 65535)");
}

}  // namespace

RankEnvironment RankEnvironment::from_variables(const Lookup& env) {
  RankEnvironment e;
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) {
    // torchrun's variables; LOCAL_* default to one node (torch.distributed.launch-style launchers
    // that set only RANK / WORLD_SIZE).
    e.launcher = "torchrun";
    e.rank = int_var(env, "RANK", 0);
    e.world_size = int_var(env, "WORLD_SIZE", 1);
    e.local_rank = int_var_or(env, "LOCAL_RANK", 0, e.rank);
    e.local_world_size = int_var_or(env, "LOCAL_WORLD_SIZE", 1, e.world_size);
    e.node_rank = int_var_or(env, "GROUP_RANK", 0, e.rank / e.local_world_size);
    validate(e, env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    return e;
  }
  // MPI launchers: rank, size, local rank, local size; the node follows from them.
  struct MpiFamily {
    const char *rank, *size, *local, *local_size;
  };
  for (const MpiFamily& f :
       {MpiFamily{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE"},
        MpiFamily{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}}) {
    if (!has(env, f.rank)) continue;
    e.launcher = "mpi";
    e.rank = int_var(env, f.rank, 0);
    e.world_size = int_var(env, f.size, 1);
    e.local_rank = int_var_or(env, f.local, 0, e.rank);
    e.local_world_size = int_var_or(env, f.local_size, 1, e.world_size);
    e.node_rank = e.rank / e.local_world_size;
    validate(e, env, f.rank, f.size, f.local, f.local_size);
    return e;
  }
  // Slurm only inside a job step (srun): a batch script's own environment has SLURM_PROCID=0 and
  // SLURM_NTASKS of the whole job, and must not make a lone `hk train` wait for absent ranks.
  if (has(env, "SLURM_PROCID") && (has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID"))) {
    e.launcher = "slurm";
    e.rank = int_var(env, "SLURM_PROCID", 0);
    e.world_size = int_var(env, "SLURM_NTASKS", 1);
    e.local_rank = int_var_or(env, "SLURM_LOCALID", 0, 0);
    e.node_rank = int_var_or(env, "SLURM_NODEID", 0, 0);
    int per_node = int_var_or(env, "SLURM_NTASKS_PER_NODE", 1, 0);
    if (per_node == 0 && has(env, "SLURM_TASKS_PER_NODE"))
      per_node = slurm_tasks_on_node(env("SLURM_TASKS_PER_NODE"), e.node_rank);
    if (per_node == 0)
      throw InvalidArgument(
          "Slurm: cannot tell how many tasks run on this node (SLURM_NTASKS_PER_NODE and "
          "SLURM_TASKS_PER_NODE are unset or malformed); start the step with srun "
          "--ntasks-per-node N");
    e.local_world_size = per_node;
    validate(e, env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    return e;
  }
  return e;
}

RankEnvironment RankEnvironment::from_environment() {
  return from_variables([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace hk::dist
