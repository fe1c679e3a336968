// bench/kernels/bench_cuda.cuh — what the kernel benchmark programs share: exit-on-error checks for
// CUDA calls (CK) and for the liger launchers' status codes (LK), and deterministic random fills
// on the device (a splitmix hash of the index and a seed; no host copy, no cuRAND), and writing
// the JSON document.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
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
