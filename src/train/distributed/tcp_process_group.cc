// The TCP process group (hk/distributed.h) for CPU ranks: collectives over the rendezvous'
// star of connections around rank 0. Rank 0 receives every rank's data, reduces in rank order
// (0, 1, 2, ...: the same result on every rank, run after run) and sends the results back.
//
// Meant for CI and small CPU jobs, not for speed: every byte goes through rank 0 (2·(W−1)·n bytes
// per all-reduce at rank 0, where a ring moves 2·n). Reductions of 16-bit tensors accumulate in
// f32 and round once. Any error (a peer closed, a timeout) breaks every connection of this rank,
// so the others fail too instead of waiting for it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "hk/error.h"
#include "ops/cpu_util.h"
#include "train/distributed/process_group_impl.h"
#include "train/distributed/rendezvous.h"

namespace hk::dist {
namespace {

constexpr size_t kChunkBytes = size_t{4} << 20;

class TcpProcessGroup final : public ProcessGroup {
 public:
  TcpProcessGroup(Rendezvous r, ProcessGroupOptions options)
      : r_(std::move(r)), options_(options) {}

  int rank() const override { return r_.rank; }
  int size() const override { return r_.world_size; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "tcp"; }

  void all_reduce(const Tensor& t, ReduceOp op, Stream) override {
    check_tensor(t, "all_reduce");
    guarded("all_reduce", [&](tcp::Deadline d) {
      char* data = static_cast<char*>(t.view().ptr());
      const size_t bytes = t.nbytes();
      if (rank() == 0) {
        reduce_from_peers(data, t.numel(), t.dtype(), op, d, "all_reduce");
        for (int i = 1; i < size(); ++i) peer(i).send_all(data, bytes, d, "all_reduce");
      } else {
        peer(0).send_all(data, bytes, d, "all_reduce");
        peer(0).recv_all(data, bytes, d, "all_reduce");
      }
    });
  }

  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op, Stream) override {
    check_tensor(input, "reduce_scatter");
    check_tensor(output, "reduce_scatter");
    check_reduce_scatter(input, output, size());
    guarded("reduce_scatter", [&](tcp::Deadline d) {
      const size_t chunk = output.nbytes();
      // Reduce a copy when the output is a chunk of the input (in place), so that rank 0's own
      // chunk is not overwritten before the others are sent.
      std::vector<char> work(input.nbytes());
      std::memcpy(work.data(), input.view().ptr(), input.nbytes());
      if (rank() == 0) {
        reduce_from_peers(work.data(), input.numel(), input.dtype(), op, d, "reduce_scatter");
        for (int i = 1; i < size(); ++i)
          peer(i).send_all(work.data() + chunk * static_cast<size_t>(i), chunk, d,
                           "reduce_scatter");
        std::memcpy(output.view().ptr(), work.data(), chunk);
      } else {
        peer(0).send_all(work.data(), work.size(), d, "reduce_scatter");
        peer(0).recv_all(output.view().ptr(), chunk, d, "reduce_scatter");
      }
    });
  }

  void all_gather(const Tensor& input, const Tensor& output, Stream) override {
    check_tensor(input, "all_gather");
    check_tensor(output, "all_gather");
    check_all_gather(input, output, size());
    guarded("all_gather", [&](tcp::Deadline d) {
      const size_t chunk = input.nbytes();
      char* out = static_cast<char*>(output.view().ptr());
      char* mine = out + chunk * static_cast<size_t>(rank());
      if (mine != input.view().ptr()) std::memmove(mine, input.view().ptr(), chunk);
      if (rank() == 0) {
        for (int i = 1; i < size(); ++i)
          peer(i).recv_all(out + chunk * static_cast<size_t>(i), chunk, d, "all_gather");
        for (int i = 1; i < size(); ++i) peer(i).send_all(out, output.nbytes(), d, "all_gather");
      } else {
        peer(0).send_all(mine, chunk, d, "all_gather");
        peer(0).recv_all(out, output.nbytes(), d, "all_gather");
      }
    });
  }

  void broadcast(const Tensor& t, int root, Stream) override {
    check_tensor(t, "broadcast");
    HK_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) +
                                             " is not a rank of this group of " +
                                             std::to_string(size()));
    guarded("broadcast", [&](tcp::Deadline d) {
      char* data = static_cast<char*>(t.view().ptr());
      const size_t bytes = t.nbytes();
      if (rank() == 0) {
        if (root != 0) peer(root).recv_all(data, bytes, d, "broadcast");
        for (int i = 1; i < size(); ++i)
          if (i != root) peer(i).send_all(data, bytes, d, "broadcast");
      } else if (rank() == root) {
        peer(0).send_all(data, bytes, d, "broadcast");
      } else {
        peer(0).recv_all(data, bytes, d, "broadcast");
      }
    });
  }

  void barrier() override {
    guarded("barrier", [&](tcp::Deadline d) { star_barrier(r_, d, "barrier"); });
  }

  void synchronize(Stream) override {}

 private:
  tcp::Socket& peer(int i) { return r_.peers[static_cast<size_t>(i)]; }

  void check_tensor(const Tensor& t, const char* what) const {
    HK_CHECK(t.defined() && t.is_contiguous() && t.device().is_cpu(),
             std::string(what) + ": the TCP process group needs contiguous CPU tensors, got " +
                 (t.defined() ? t.view().str() : std::string("an undefined tensor")));
  }

  template <class F>
  void guarded(const char* what, F&& body) {
    if (broken_)
      throw RuntimeFailure(std::string(what) + " on rank " + std::to_string(rank()) +
                           ": the process group failed earlier (" + broken_reason_ +
                           "); it cannot be used again");
    try {
      body(tcp::deadline_after(options_.timeout));
    } catch (const Error& e) {
      broken_ = true;
      broken_reason_ = e.what();
      break_connections(r_);
      throw RuntimeFailure(std::string("rank ") + std::to_string(rank()) + ": " + e.what());
    }
  }

  // Rank 0: data ← op(data, rank 1's, rank 2's, ...), chunk by chunk.
  void reduce_from_peers(char* data, int64_t numel, DType dtype, ReduceOp op, tcp::Deadline d,
                         const char* what) {
    const size_t es = dtype_size(dtype);
    const int64_t per_chunk = static_cast<int64_t>(std::max<size_t>(1, kChunkBytes / es));
    std::vector<char> incoming(static_cast<size_t>(std::min(per_chunk, numel)) * es);
    std::vector<double> acc;
    for (int64_t first = 0; first < numel; first += per_chunk) {
      const int64_t n = std::min(per_chunk, numel - first);
      char* mine = data + static_cast<size_t>(first) * es;
      acc.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        acc[static_cast<size_t>(i)] = ops::cpu::load_one<double>(mine + i * es, dtype);
      for (int p = 1; p < size(); ++p) {
        peer(p).recv_all(incoming.data(), static_cast<size_t>(n) * es, d, what);
        combine(acc, incoming.data(), n, dtype, op);
      }
      for (int64_t i = 0; i < n; ++i) {
        double v = acc[static_cast<size_t>(i)];
        if (op == ReduceOp::Avg) v /= static_cast<double>(size());
        ops::cpu::store_one<double>(mine + i * es, dtype, v);
      }
    }
  }

  // acc ← op(acc, x), rounding like a reduction in the tensor's own precision for f32/f64 and
  // accumulating in f32 for 16-bit types (then rounded once by the caller's store).
  static void combine(std::vector<double>& acc, const char* x, int64_t n, DType dtype,
                      ReduceOp op) {
    const size_t es = dtype_size(dtype);
    for (int64_t i = 0; i < n; ++i) {
      const double v = ops::cpu::load_one<double>(x + i * es, dtype);
      double& a = acc[static_cast<size_t>(i)];
      if (op == ReduceOp::Max) {
        a = std::max(a, v);
      } else if (dtype == DType::F64 || dtype == DType::I64 || dtype == DType::I32) {
        a += v;
      } else {
        a = static_cast<double>(static_cast<float>(a) + static_cast<float>(v));
      }
    }
  }

  Rendezvous r_;
  ProcessGroupOptions options_;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_tcp_process_group(const RankEnvironment& env,
                                                     ProcessGroupOptions options) {
  Rendezvous r = rendezvous(env, "tcp", "", tcp::deadline_after(options.timeout));
  return std::make_shared<TcpProcessGroup>(std::move(r), options);
}

}  // namespace hk::dist
