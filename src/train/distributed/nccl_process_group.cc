// The NCCL process group (hk/distributed.h) for CUDA ranks: one GPU per rank, collectives
// enqueued on the caller's stream.
//
// Start-up: rank 0 makes the ncclUniqueId and hands it to the others through hk's rendezvous
// (rendezvous.h); from there NCCL bootstraps its own transports (its TCP bootstrap, then NVLink,
// PCIe or the network). NVLink multicast (NVLS) is switched off unless the user set
// NCCL_NVLS_ENABLE: the machines hk is tested on require it, and it only serves all-reduces of
// NVSwitch systems. The host barrier runs over the rendezvous connections, so it needs no GPU work.
//
// Failure: NCCL kernels wait for their peers forever, so synchronize() polls the stream and
// NCCL's asynchronous error instead of blocking; a peer's failure or the timeout aborts the
// communicator and throws. Deliberately not here: NCCL's non-blocking communicators, groups of
// several collectives (ncclGroupStart), user buffer registration.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/cuda_check.h"
#include "hk/error.h"
#include "train/distributed/process_group_impl.h"
#include "train/distributed/rendezvous.h"

namespace hk::dist {
namespace {

ncclDataType_t nccl_dtype(DType d, const char* what) {
  switch (d) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
    case DType::Bool:
      return ncclUint8;
  }
  throw InvalidArgument(std::string(what) + ": dtype " + dtype_name(d) + " has no NCCL type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
  }
  return ncclSum;
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(Device device, Rendezvous r, ProcessGroupOptions options)
      : device_(device), r_(std::move(r)), options_(options) {
    HK_CUDA_CHECK(cudaSetDevice(device_.index));
    ncclUniqueId id;
    HK_CHECK(r_.payload.size() == sizeof id.internal,
             "NCCL start-up: rank 0 handed out " + std::to_string(r_.payload.size()) +
                 " bytes for the ncclUniqueId, NCCL needs " + std::to_string(sizeof id.internal));
    std::memcpy(id.internal, r_.payload.data(), sizeof id.internal);
    check(ncclCommInitRank(&comm_, r_.world_size, id, r_.rank), "ncclCommInitRank");
  }
  ~NcclProcessGroup() override {
    if (!comm_) return;
    if (broken_)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
  }

  int rank() const override { return r_.rank; }
  int size() const override { return r_.world_size; }
  Device device() const override { return device_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce(const Tensor& t, ReduceOp op, Stream stream) override {
    check_tensor(t, "all_reduce");
    const void* p = t.view().ptr();
    check(ncclAllReduce(p, t.view().ptr(), static_cast<size_t>(t.numel()),
                        nccl_dtype(t.dtype(), "all_reduce"), nccl_op(op), comm_, cuda(stream)),
          "ncclAllReduce");
  }

  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                      Stream stream) override {
    check_tensor(input, "reduce_scatter");
    check_tensor(output, "reduce_scatter");
    check_reduce_scatter(input, output, size());
    check(ncclReduceScatter(
              input.view().ptr(), output.view().ptr(), static_cast<size_t>(output.numel()),
              nccl_dtype(input.dtype(), "reduce_scatter"), nccl_op(op), comm_, cuda(stream)),
          "ncclReduceScatter");
  }

  void all_gather(const Tensor& input, const Tensor& output, Stream stream) override {
    check_tensor(input, "all_gather");
    check_tensor(output, "all_gather");
    check_all_gather(input, output, size());
    check(ncclAllGather(input.view().ptr(), output.view().ptr(), static_cast<size_t>(input.numel()),
                        nccl_dtype(input.dtype(), "all_gather"), comm_, cuda(stream)),
          "ncclAllGather");
  }

  void broadcast(const Tensor& t, int root, Stream stream) override {
    check_tensor(t, "broadcast");
    HK_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) +
                                             " is not a rank of this group of " +
                                             std::to_string(size()));
    check(ncclBroadcast(t.view().ptr(), t.view().ptr(), static_cast<size_t>(t.numel()),
                        nccl_dtype(t.dtype(), "broadcast"), root, comm_, cuda(stream)),
          "ncclBroadcast");
  }

  void barrier() override {
    try {
      star_barrier(r_, tcp::deadline_after(options_.timeout), "barrier");
    } catch (const Error& e) {
      fail(std::string("rank ") + std::to_string(rank()) + ": " + e.what());
    }
  }

  void synchronize(Stream stream) override {
    HK_CUDA_CHECK(cudaSetDevice(device_.index));
    cudaEvent_t done;
    HK_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    struct Destroy {
      cudaEvent_t e;
      ~Destroy() { cudaEventDestroy(e); }
    } destroy{done};
    HK_CUDA_CHECK(cudaEventRecord(done, cuda(stream)));
    const auto deadline = tcp::deadline_after(options_.timeout);
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) HK_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail("rank " + std::to_string(rank()) + ": NCCL reported " + ncclGetErrorString(async) +
             " (" + ncclGetLastError(comm_) + "); a peer probably failed");
      if (tcp::Clock::now() > deadline)
        fail("rank " + std::to_string(rank()) + ": NCCL collectives did not finish within " +
             std::to_string(options_.timeout.count() / 1000) +
             " s; a peer is stuck or died (raise HK_DIST_TIMEOUT_S for slow steps)");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
  }

 private:
  static cudaStream_t cuda(Stream s) { return static_cast<cudaStream_t>(s.handle); }

  void check_tensor(const Tensor& t, const char* what) const {
    if (broken_)
      throw RuntimeFailure(std::string(what) + " on rank " + std::to_string(rank()) +
                           ": the NCCL communicator was aborted after an earlier error");
    HK_CHECK(t.defined() && t.is_contiguous() && t.device() == device_,
             std::string(what) + ": the NCCL process group of " + device_.str() +
                 " needs contiguous tensors on that device, got " +
                 (t.defined() ? t.view().str() : std::string("an undefined tensor")));
  }

  void check(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    fail(std::string("rank ") + std::to_string(rank()) + ": " + call + " failed: " +
         ncclGetErrorString(rc) + (comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : ""));
  }

  [[noreturn]] void fail(const std::string& message) {
    broken_ = true;
    break_connections(r_);
    throw RuntimeFailure(message);
  }

  Device device_;
  Rendezvous r_;
  ProcessGroupOptions options_;
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(Device device, const RankEnvironment& env,
                                                      ProcessGroupOptions options) {
  // Off unless the user decided otherwise (setenv without overwrite), before NCCL reads it.
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  HK_CUDA_CHECK(cudaSetDevice(device.index));
  std::string payload;
  if (env.rank == 0) {
    ncclUniqueId id;
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess)
      throw RuntimeFailure(std::string("rank 0: ncclGetUniqueId failed: ") +
                           ncclGetErrorString(rc));
    payload.assign(id.internal, sizeof id.internal);
  }
  Rendezvous r = rendezvous(env, "nccl", payload, tcp::deadline_after(options.timeout));
  return std::make_shared<NcclProcessGroup>(device, std::move(r), options);
}

}  // namespace hk::dist
