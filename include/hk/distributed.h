// hk/distributed.h — data-parallel training's processes: who this process is (the rank
// environment a launcher sets) and the collectives between the processes (a ProcessGroup: NCCL
// for CUDA devices, hk's TCP transport for CPU ones), behind one interface.
//
//   hk::dist::RankEnvironment env = hk::dist::RankEnvironment::from_environment();
//   auto group = hk::dist::init_process_group(hk::Device::cuda(env.local_rank), env);
//   group->all_reduce(grads, hk::dist::ReduceOp::Sum, stream);
//
// Rank environment, in this order of precedence (the first family present wins):
//   torchrun / `hk train --nproc-per-node`: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//            GROUP_RANK (the node), MASTER_ADDR, MASTER_PORT
//   Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (MPICH/Intel MPI: PMI_RANK,
//            PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS)
//   Slurm (inside an srun step): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and the
//            tasks per node (SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE)
// MASTER_ADDR / MASTER_PORT may always be given; they default to 127.0.0.1:29500 when every rank
// runs on this node, and are required otherwise.
//
// Start-up (both backends): rank 0 listens on MASTER_ADDR:MASTER_PORT; every other rank connects
// (retrying until the timeout), says who it is, and receives from rank 0 what the backend needs
// (the ncclUniqueId for NCCL, which then bootstraps its own transports). The connections stay
// open: the TCP backend's collectives and every backend's barrier run over them. Every wait has a
// timeout and every failure is an hk::Error naming the rank, the address and what to do; a peer
// that dies makes the others fail instead of hanging.
//
// Deliberately not here: sub-groups, point-to-point sends for users, elastic membership.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hk/device.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk::dist {

struct RankEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Who set it: "torchrun" (also hk's launcher), "mpi", "slurm", or "none" (a plain process).
  std::string launcher = "none";

  // True when a launcher started this process (even with a world of 1): training then goes
  // through a process group.
  bool launched() const { return launcher != "none"; }

  // Reads the variables above from the process environment.
  static RankEnvironment from_environment();
  // The same from `lookup` (returns null for an unset variable): tests, and launchers that build
  // an environment. Throws InvalidArgument naming the variable for a malformed or inconsistent
  // value (a rank outside the world, a local world larger than the world, a missing MASTER_ADDR
  // across nodes).
  static RankEnvironment from_variables(const std::function<const char*(const char*)>& lookup);
};

enum class ReduceOp { Sum, Avg, Max };

struct ProcessGroupOptions {
  // Every wait: joining the rendezvous, a collective's data, a barrier, synchronize(). A peer
  // that does not answer within it is an error naming it. HK_DIST_TIMEOUT_S overrides it.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

// The collectives of one group of processes. Tensors are contiguous and on the group's device;
// every rank calls the same collectives in the same order with the same shapes and dtypes.
// CUDA groups enqueue on `stream` and return at once; the TCP group runs them before returning.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  virtual std::string backend() const = 0;  // "nccl" or "tcp"

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual void all_reduce(const Tensor& tensor, ReduceOp op, Stream stream = {}) = 0;
  // `input` holds size() equal chunks; this rank's `output` (one chunk's elements) gets the
  // reduction of chunk rank() over all ranks. `output` may be that chunk of `input` (in place).
  virtual void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                              Stream stream = {}) = 0;
  // `output` (size() × input's elements) gets every rank's `input`, rank r's at chunk r. `input`
  // may be this rank's chunk of `output` (in place).
  virtual void all_gather(const Tensor& input, const Tensor& output, Stream stream = {}) = 0;
  // Every rank's `tensor` becomes `root`'s.
  virtual void broadcast(const Tensor& tensor, int root, Stream stream = {}) = 0;
  // Blocks the host until every rank reached it (over the rendezvous connections).
  virtual void barrier() = 0;
  // Blocks the host until the collectives enqueued on `stream` finished; an error (a peer died,
  // NCCL failed) or the timeout throws instead of hanging. No-op for the TCP group.
  virtual void synchronize(Stream stream = {}) = 0;
};

// The group for `device`: NCCL for CUDA (one GPU per rank), TCP for CPU. Throws Unsupported for
// a CUDA device when hk was built without NCCL, hk::Error with a sentence when the rendezvous or
// the backend's start fails.
std::shared_ptr<ProcessGroup> init_process_group(Device device, const RankEnvironment& env,
                                                 ProcessGroupOptions options = {});

// Whether this build has the NCCL backend.
bool nccl_available();

// torch.utils.data.DistributedSampler, index for index. One epoch's order (a permutation from
// seed + epoch when shuffling, else 0..n-1) is split across `num_replicas` ranks: without
// drop_last it is padded to a multiple of num_replicas by repeating it from its start; with
// drop_last its tail is cut to a multiple; rank r then takes positions r, r + W, r + 2W, ...
// So micro-batch k of every rank together holds positions [k·B·W, (k+1)·B·W) of that order: the
// global batch of one process with batch B·W.
struct DistributedSamplerOptions {
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};
// The indices rank `options.rank` visits in `epoch` (set_epoch's value), as torch's sampler
// yields them. Throws InvalidArgument for a rank outside the replicas or an empty dataset.
std::vector<int64_t> distributed_sampler_indices(int64_t num_samples,
                                                 const DistributedSamplerOptions& options,
                                                 int64_t epoch);
// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on CPU (mt19937; n below
// 2^32 / 20, torch's "small n" algorithm; larger n throws Unsupported).
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);
// The split step alone, over any epoch order (the Trainer's: hk::epoch_order, the same on every
// rank, so N ranks visit what one process with the global batch visits).
std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int rank, int world_size,
                                 bool drop_last = false);
// Length of each rank's shard: ceil(n / world_size), or floor with drop_last (torch's
// num_samples).
int64_t shard_length(int64_t n, int world_size, bool drop_last = false);

}  // namespace hk::dist
