// hk_bench_attention — times hk::ops::attention forward (no probs, so the fast CUDA path) on one
// GPU: Qwen-like prefill and batch-1 decode shapes, causal, bf16.
//
// Method: random inputs in [-1, 1); 5 warm-up calls, then 20 calls each between two CUDA events on
// the default stream; prints the median in ms and TFLOP/s counted as 4·B·Hq·S·T·D (the full score
// matrix, though causal attention needs only about half of it). Not here: JSON output, peers.
//
// Usage: hk_bench_attention   (HK_ATTENTION_FAST=0 hk_bench_attention times the eager kernels)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "hk/device.h"
#include "hk/ops.h"
#include "hk/tensor.h"

namespace {

using hk::DType;
using hk::Tensor;

void check(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
}

Tensor random_gpu(const hk::Shape& shape, DType dt, uint32_t seed, hk::Device device) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_floats(v, shape, dt).to(device);
}

void bench(const char* name, int64_t B, int64_t S, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
           hk::Device device) {
  const DType dt = DType::BF16;
  Tensor q = random_gpu({B, S, Hq, D}, dt, 1, device);
  Tensor k = random_gpu({B, T, Hkv, D}, dt, 2, device);
  Tensor v = random_gpu({B, T, Hkv, D}, dt, 3, device);
  Tensor out = Tensor::empty({B, S, Hq, D}, dt, device);
  hk::ops::AttentionOptions opt;
  for (int i = 0; i < 5; ++i) hk::ops::attention(q, k, v, out, opt);
  check(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start));
  check(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    check(cudaEventRecord(start));
    hk::ops::attention(q, k, v, out, opt);
    check(cudaEventRecord(stop));
    check(cudaEventSynchronize(stop));
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  check(cudaEventDestroy(start));
  check(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  const double flops = 4.0 * double(B) * double(Hq) * double(S) * double(T) * double(D);
  std::printf(
      "%-8s B=%lld S=%lld T=%lld Hq=%lld Hkv=%lld D=%lld bf16 causal: %9.4f ms  %7.2f TFLOP/s\n",
      name, (long long)B, (long long)S, (long long)T, (long long)Hq, (long long)Hkv, (long long)D,
      median, flops / (median * 1e-3) / 1e12);
}

}  // namespace

int main() {
  try {
    const hk::Device device = hk::Device::cuda(0);
    bench("prefill", 1, 2048, 2048, 32, 8, 128, device);
    bench("prefill", 8, 2048, 2048, 16, 8, 128, device);
    bench("decode", 1, 1, 512, 16, 8, 128, device);
    bench("decode", 1, 1, 512, 32, 8, 128, device);
    bench("decode", 8, 1, 2048, 16, 8, 128, device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hk_bench_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
