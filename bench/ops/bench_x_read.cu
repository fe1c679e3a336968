// hk_bench_x_read — what it costs every block of a decode launch to read the activation row its
// predecessor just wrote, when all blocks read the same bytes (as the staged gemv does: 128 blocks
// at batch 1, each reading the whole 2–4 KB row right after its PDL wait) against each group of
// blocks reading its own copy of the row.
//
// Why: the staged gemv's trace puts ~1 µs between the wait's return and the row's sum of squares
// in the RMSNorm prologue (4 KB: residual and delta), ~0.46 µs for a plain 2 KB read — one round
// trip of loads in both. One suspect is L2: the row is 16–32 lines, each requested by every SM at
// the same moment, and a line's requests are served one after another by its L2 slice.
//
// Method: a chain of 64 PDL launches captured as one CUDA graph, each of 128 blocks × 256 threads
// with 104 KB of shared memory (about the staged gemv's, so the successor's block fits beside it,
// as in the step). A launch waits, lets its successor launch, reads the row (2 KB, then 4 KB) from
// copy blockIdx % R — by one warp, every piece loaded before any is used, or by all threads, a
// piece each — and then every block writes its slice of the next launch's row into all R copies (so
// the reads find lines just written by other SMs, as in the step). clock64 from the wait's return
// to the row in shared memory, mean and 90th percentile over blocks and launches of the last of 3
// replays, for R = 1, 2, 4, 8, 16, 32 and 128 (one copy a block). Then with weights in flight, as
// in the step: before its wait each block's thread 0 asks for 16–96 KB of its own rows of a 1 GB
// buffer (HBM) by 1-D bulk copies of 2 KB on an mbarrier, waited for after the row is read, and
// the successor's blocks (launched at the wait) do the same — whether the row's loads queue
// behind that traffic. Checks nothing numerical; it times a read pattern, not an hk kernel. (On
// the H200, 2026-12-04: no hot spot — R changes nothing beyond 3 % — but the loads queue behind
// more than ~32 KB of weight copies in flight; docs/performance.md, decode.)
//
// Usage: hk_bench_x_read [--out FILE.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../cuda_check.h"
#include "../pdl_launch.h"
#include "hk/kernel_sdk_sm90.cuh"

namespace {

constexpr int kBlocks = 128, kThreads = 256, kLaunches = 64;
constexpr int kMaxWeightKB = 96, kRowOffset = 8192;  // weights land after the row's 8 KB
constexpr size_t kSmem = kRowOffset + kMaxWeightKB * 1024;
constexpr int kMaxCopies = 128, kMaxBytes = 4096;
constexpr size_t kWeightBuffer = size_t(1) << 30;

// kOneWarp: warp 0 reads the row, 16 bytes a lane per load, all loads issued before any is used
// (the prologue's form); else each thread reads one 16-byte piece (the plain x read's form).
template <bool kOneWarp>
__global__ void __launch_bounds__(kThreads)
    x_read_kernel(const uint4* src, uint4* dst, int copies, int bytes, long long* cycles,
                  int launch, const char* weights, int weight_kb) {
  using namespace hk::sdk::cuda::sm90;
  extern __shared__ uint4 row[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  const uint32_t bar = base + kRowOffset - 8;
  if (weight_kb > 0 && threadIdx.x == 0) {
    mbar_init(bar, 1);
    fence_barrier_init();
    mbar_expect_tx(bar, uint32_t(weight_kb) * 1024);
    // a distinct region a launch and block, so the copies come from HBM
    const size_t region = (size_t(launch) * kBlocks + blockIdx.x) * kMaxWeightKB * 1024;
    const char* w = weights + region % (kWeightBuffer - kMaxWeightKB * 1024);
    for (int c = 0; c < weight_kb / 2; ++c)
      bulk_load(base + kRowOffset + c * 2048, w + c * 2048, 2048, bar);
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long long t0 = clock64();
  const int pieces = bytes / 16;
  const uint4* mine = src + (blockIdx.x % copies) * (kMaxBytes / 16);
  if (kOneWarp) {
    if (threadIdx.x < 32) {
      uint4 v[kMaxBytes / 16 / 32];
#pragma unroll
      for (int i = 0; i < kMaxBytes / 16 / 32; ++i) {
        const int c = threadIdx.x + 32 * i;
        v[i] = c < pieces ? __ldg(mine + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kMaxBytes / 16 / 32; ++i)
        if (threadIdx.x + 32 * i < pieces) row[threadIdx.x + 32 * i] = v[i];
    }
  } else {
    for (int c = threadIdx.x; c < pieces; c += kThreads) row[c] = __ldg(mine + c);
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[launch * kBlocks + blockIdx.x] = t1 - t0;
  if (weight_kb > 0) mbar_wait(bar, 0);
  // this block's slice of the next row, into every copy (from what it read, so nothing is dead)
  const int slice = pieces / kBlocks > 0 ? pieces / kBlocks : 1;
  for (int i = threadIdx.x; i < copies * slice; i += kThreads) {
    const int c = blockIdx.x * slice + i % slice;
    if (c < pieces) {
      uint4 v = row[c];
      v.x += 1u;
      dst[(i / slice) * (kMaxBytes / 16) + c] = v;
    }
  }
}

struct Result {
  double mean, p90;
};

template <bool kOneWarp>
Result run(int copies, int bytes, int weight_kb, cudaStream_t s, uint4* a, uint4* b,
           long long* cycles, const char* weights) {
  auto kernel = x_read_kernel<kOneWarp>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < kLaunches; ++l) {
    const uint4* src = (l & 1) ? b : a;
    uint4* dst = (l & 1) ? a : b;
    launch_pdl(kernel, dim3(kBlocks), dim3(kThreads), kSmem, s, src, dst, copies, bytes, cycles, l,
               weights, weight_kb);
  }
  CK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  std::vector<long long> c(size_t(kLaunches) * kBlocks);
  CK(cudaMemcpy(c.data(), cycles, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  // the first launch waits on nothing of this chain: left out
  std::vector<double> v(c.begin() + kBlocks, c.end());
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return {sum / double(v.size()), v[v.size() * 9 / 10]};
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: hk_bench_x_read [--out FILE.json] (unknown argument '%s')\n",
                   arg.c_str());
      return 2;
    }
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  uint4 *a, *b;
  long long* cycles;
  const size_t copy_bytes = size_t(kMaxCopies) * kMaxBytes;
  CK(cudaMalloc(&a, copy_bytes));
  CK(cudaMalloc(&b, copy_bytes));
  CK(cudaMemset(a, 0, copy_bytes));
  CK(cudaMemset(b, 0, copy_bytes));
  CK(cudaMalloc(&cycles, sizeof(long long) * kLaunches * kBlocks));
  char* weights;
  CK(cudaMalloc(&weights, kWeightBuffer));
  CK(cudaMemset(weights, 1, kWeightBuffer));
  nlohmann::json rows = nlohmann::json::array();
  auto measure = [&](bool one_warp, int bytes, int copies, int weight_kb) {
    const Result r = one_warp ? run<true>(copies, bytes, weight_kb, s, a, b, cycles, weights)
                              : run<false>(copies, bytes, weight_kb, s, a, b, cycles, weights);
    std::printf(
        "x read %-9s %4d bytes, %3d copies, %2d KB weights in flight: %6.0f cycles mean, "
        "%6.0f p90\n",
        one_warp ? "one warp" : "all", bytes, copies, weight_kb, r.mean, r.p90);
    rows.push_back({{"reader", one_warp ? "one warp" : "all threads"},
                    {"bytes", bytes},
                    {"copies", copies},
                    {"weight_kb", weight_kb},
                    {"cycles_mean", r.mean},
                    {"cycles_p90", r.p90}});
  };
  for (const bool one_warp : {true, false})
    for (const int bytes : {2048, 4096})
      for (const int copies : {1, 2, 4, 8, 16, 32, 128}) measure(one_warp, bytes, copies, 0);
  for (const bool one_warp : {true, false})
    for (const int bytes : {2048, 4096})
      for (const int weight_kb : {16, 32, 48, 64, 96}) measure(one_warp, bytes, 1, weight_kb);
  if (!out.empty()) {
    std::ofstream f(out);
    f << nlohmann::json{{"benchmark", "x_read"}, {"rows", rows}}.dump(2) << "\n";
  }
  return 0;
}
