// bench/kernels/bench_cuda.cuh — what the kernel benchmark programs share: exit-on-error checks for
// CUDA calls (CK, bench/cuda_check.h) and for the liger launchers' status codes (LK), and
// deterministic random fills on the device (a splitmix hash of the index and a seed; no host copy,
// no cuRAND), the two timers (per call with events on the default stream; CUDA-graph replays on a
// stream of their own) and writing the JSON document.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../cuda_check.h"

#define LK(x)                                                                      \
  do {                                                                             \
    int rc_ = (x);                                                                 \
    if (rc_ != 0) {                                                                \
      std::fprintf(stderr, "%s:%d %s returned %d\n", __FILE__, __LINE__, #x, rc_); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// Included by one translation unit per program: internal linkage.
namespace bench {
namespace {

// Uniform in [0, 1), a function of (i, seed) only.
__device__ __forceinline__ float hash01(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}
// p[i] = uniform in [offset - scale, offset + scale).
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, float scale, float offset, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16((hash01(i, seed) * 2 - 1) * scale + offset);
}

// Median time in ms of `reps` runs of f(rep) after `warm` warm-up runs.
double time_ms(const std::function<void(int)>& f, int warm = 3, int reps = 20) {
  for (int i = 0; i < warm; ++i) f(i);
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    f(warm + i);
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

// Median time in ms of one run of f(i), measured as graph replays: `per_graph` consecutive runs
// (i = 0 .. per_graph-1, so callers rotate buffer sets) captured into one CUDA graph, the replay
// timed with events, divided by per_graph. This removes the launch gaps that a per-call event
// pair includes (METHOD.md: "for many small launches, capture a graph and time its replays") —
// the way kernels run inside a training step, queued back to back.
double graph_ms(const std::function<void(int, cudaStream_t)>& f, int per_graph = 20,
                int reps = 20) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < per_graph; ++i) f(i, s);  // warm-up outside the capture
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) f(i, s);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[2 * i], s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CK(cudaStreamSynchronize(s));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2] / per_graph;
}

// Writes `json` to `path` (stdout when empty); false, with a message, when the file cannot be
// written.
bool write_json(const std::string& json, const std::string& path) {
  if (path.empty()) {
    std::fputs(json.c_str(), stdout);
    return true;
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::fputs(json.c_str(), f);
  std::fclose(f);
  return true;
}

}  // namespace
}  // namespace bench
