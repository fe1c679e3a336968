// bench/ops/decode_step_probe.cuh — what the persistent decode-step probes share
// (hk_bench_persistent_step, five phases a layer; hk_bench_split_step, three): the Qwen3-0.6B
// shape, the grid-wide counters, loads of activations other blocks wrote this launch, the
// attention stand-in (one q head over a short cache, on the device and on the host), bf16 helpers
// and the event timing. Not an hk kernel and not hk's API: a benchmark's pieces, header-only, for
// sm_90 programs built by nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "../cuda_check.h"
#include "hk/dtype.h"
#include "ops/decode/persistent_step_device.cuh"

namespace decode_probe {

// counters, loads of what other blocks write, bf16 helpers, row splits: shared with libhk's step
using namespace hk::decode::persistent;

constexpr int kHidden = 1024, kQHeads = 16, kKvHeads = 8, kHeadDim = 128, kInter = 3072;
constexpr int kLayers = 28, kVocab = 151936;
constexpr int kQkv = (kQHeads + 2 * kKvHeads) * kHeadDim;  // 4096
constexpr float kEps = 1e-6f;

// ---- device ---------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long global_time() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
// The attention stand-in: `warps` warps (named barrier `sync`) attend q head h of the step's qkv
// vector over a cache of T positions whose last is the step's own k, v (plain f32 online softmax,
// no q/k norm, no rotary). The caches are [kKvHeads][T][kHeadDim]. `scratch` holds warps ×
// (kHeadDim + 2) floats. Returns output dimension `tid` (threads tid < kHeadDim; 0 elsewhere).
template <int kWarps, class Sync>
__device__ float attend_head(const bf16* qkv, const bf16* k_cache, const bf16* v_cache, int h,
                             int cache_t, float* scratch, Sync sync) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = h / (kQHeads / kKvHeads);
  const bf16* q = qkv + h * kHeadDim;
  const bf16* k_new = qkv + kQHeads * kHeadDim + g * kHeadDim;
  const bf16* v_new = k_new + kKvHeads * kHeadDim;
  const bf16* kc = k_cache + size_t(g) * cache_t * kHeadDim;
  const bf16* vc = v_cache + size_t(g) * cache_t * kHeadDim;
  const float scale = rsqrtf(float(kHeadDim));
  float qd[4], acc[4] = {0, 0, 0, 0}, m = -INFINITY, l = 0;
  bf16x4(load_cg8(q + lane * 4), qd);
  // a warp's positions in batches whose loads are all issued before any is used: the old
  // positions are not written this step (read-only loads), the step's own from L2 behind the
  // counter (one position a round trip put ~8 us a layer on the chain)
  constexpr int kBatch = 8;
  for (int j0 = warp; j0 < cache_t; j0 += kWarps * kBatch) {
    uint2 kr[kBatch], vr[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int j = j0 + i * kWarps;
      if (j < cache_t - 1) {
        kr[i] = __ldg(reinterpret_cast<const uint2*>(kc + size_t(j) * kHeadDim) + lane);
        vr[i] = __ldg(reinterpret_cast<const uint2*>(vc + size_t(j) * kHeadDim) + lane);
      } else if (j == cache_t - 1) {
        kr[i] = load_cg8(k_new + lane * 4);
        vr[i] = load_cg8(v_new + lane * 4);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (j0 + i * kWarps >= cache_t) break;
      float kd[4], vd[4];
      bf16x4(kr[i], kd);
      bf16x4(vr[i], vd);
      float s = 0;
      for (int e = 0; e < 4; ++e) s += qd[e] * kd[e];
      for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= scale;
      const float m_new = fmaxf(m, s), corr = __expf(m - m_new), e = __expf(s - m_new);
      l = l * corr + e;
      for (int c = 0; c < 4; ++c) acc[c] = acc[c] * corr + e * vd[c];
      m = m_new;
    }
  }
  float* mine = scratch + warp * (kHeadDim + 2);
  for (int i = 0; i < 4; ++i) mine[lane * 4 + i] = acc[i];
  if (lane == 0) mine[kHeadDim] = m, mine[kHeadDim + 1] = l;
  sync();
  float out = 0;
  if (tid < kHeadDim) {
    float mm = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, scratch[w * (kHeadDim + 2) + kHeadDim]);
    float sum = 0, o = 0;
    for (int w = 0; w < kWarps; ++w) {
      const float* t = scratch + w * (kHeadDim + 2);
      const float f = t[kHeadDim] == -INFINITY ? 0.f : __expf(t[kHeadDim] - mm);
      sum += t[kHeadDim + 1] * f;
      o += t[tid] * f;
    }
    out = o / sum;
  }
  sync();  // the scratch is free again
  return out;
}

// ---- host -----------------------------------------------------------------------------------
// bf16 bits as the host copies hold them, through hk's conversions (round to nearest even)
inline uint16_t to_bf16(float f) {
  return hk::float_to_bf16(f).bits;
}
inline float from_bf16(uint16_t h) {
  return hk::bf16_to_float(hk::bf16_t{h});
}
inline float rb(float x) {
  return from_bf16(to_bf16(x));
}
struct Rng {
  uint64_t s;
  float uniform() {  // [-1, 1)
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return float(int64_t(s >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  }
};

// The probes' host copies: every weight (and the caches) in one bf16 array, each tensor from its
// own seeded xorshift stream (the next seed at each call), and activations as offsets into another.
struct HostArena {
  std::vector<uint16_t> w;
  size_t act_total = 0;
  uint64_t seed = 1;
  size_t weight(size_t count, float scale, float offset) {
    const size_t at = w.size();
    w.resize(at + count);
    Rng rng{seed++ * 0x9E3779B97F4A7C15ull + 1};
    for (size_t i = 0; i < count; ++i) w[at + i] = to_bf16(offset + scale * rng.uniform());
    return at;
  }
  // rows × cols, uniform within ±1.7/√(contracted length): the products stay O(1)
  size_t matrix(int rows, int cols, int contracted) {
    return weight(size_t(rows) * cols, 1.7f / std::sqrt(float(contracted)), 0);
  }
  size_t norm_weight() { return weight(kHidden, 0.1f, 1.f); }
  size_t activation(size_t count) {
    const size_t at = act_total;
    act_total += count;
    return at;
  }
};

// The device's properties and SM count (the grid: one block an SM); a device before sm_90 (no
// bulk copies) ends the program with a message.
inline int sm90_grid(const char* program, cudaDeviceProp& prop) {
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::fprintf(stderr, "%s: needs sm_90 (bulk copies); this is sm_%d%d\n", program, prop.major,
                 prop.minor);
    std::exit(1);
  }
  return prop.multiProcessorCount;
}

// The kernel's dynamic shared memory allowed, and one block of it fitting an SM (the grid is one
// block an SM, launched cooperatively), else the program ends with a message.
template <class Kernel>
void fit_one_block_an_sm(Kernel kernel, int threads, int smem, const char* program) {
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  if (per_sm < 1) {
    std::fprintf(stderr, "%s: the kernel does not fit an SM\n", program);
    std::exit(1);
  }
}

// The stand-in's head h on the host: the q head and the step's own k, v from `qkv`, the older
// positions from the caches (all bf16 bits). f32 sums in another order than the device's.
inline std::vector<float> host_attend_head(const uint16_t* qkv, const uint16_t* k_cache,
                                           const uint16_t* v_cache, int cache_t, int h) {
  const int g = h / (kQHeads / kKvHeads);
  auto k_at = [&](int j, int i) {
    return j == cache_t - 1 ? from_bf16(qkv[kQHeads * kHeadDim + g * kHeadDim + i])
                            : from_bf16(k_cache[(size_t(g) * cache_t + j) * kHeadDim + i]);
  };
  auto v_at = [&](int j, int i) {
    return j == cache_t - 1 ? from_bf16(qkv[(kQHeads + kKvHeads) * kHeadDim + g * kHeadDim + i])
                            : from_bf16(v_cache[(size_t(g) * cache_t + j) * kHeadDim + i]);
  };
  std::vector<float> s(cache_t), out(kHeadDim);
  float m = -INFINITY;
  for (int j = 0; j < cache_t; ++j) {
    float d = 0;
    for (int i = 0; i < kHeadDim; ++i) d += from_bf16(qkv[h * kHeadDim + i]) * k_at(j, i);
    s[j] = d / std::sqrt(float(kHeadDim));
    m = std::max(m, s[j]);
  }
  float l = 0;
  for (int j = 0; j < cache_t; ++j) l += (s[j] = std::exp(s[j] - m));
  for (int i = 0; i < kHeadDim; ++i) {
    float o = 0;
    for (int j = 0; j < cache_t; ++j) o += s[j] * v_at(j, i);
    out[i] = o / l;
  }
  return out;
}

// The worst |got − want| over the tolerance (≤ 1 passes): 2^-7 of the value plus 2^-8 of the
// vector's largest; a NaN (a poisoned output never written) fails.
inline double worst_over_tolerance(const std::vector<float>& want, const uint16_t* got) {
  float big = 0;
  for (float v : want) big = std::max(big, std::fabs(v));
  double worst = 0;
  for (size_t j = 0; j < want.size(); ++j) {
    const double tol = std::fabs(want[j]) / 128.0 + big / 256.0 + 1e-6;
    double e = std::fabs(from_bf16(got[j]) - want[j]) / tol;
    if (std::isnan(e)) e = INFINITY;
    worst = std::max(worst, e);
  }
  return worst;
}

// `reps` runs of `enqueue` on the default stream, each between two events: their times in ms,
// sorted (every timing of the probes: the copy bandwidth, the copy forms, the step modes).
template <class Enqueue>
std::vector<float> sorted_times_ms(int reps, Enqueue&& enqueue) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int rep = 0; rep < reps; ++rep) {
    CK(cudaEventRecord(e0));
    enqueue();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms;
}

// One mode's timing: three warm-up steps, then five event windows of `steps` launches queued back
// to back (a step = a window / steps, no host launch latency inside; median and best of the five),
// then one more step, untimed, traced into d_trace (trace_words words, zeroed first) and brought
// back. launch(trace) enqueues one step; trace is d_trace or null.
struct ModeTiming {
  double median_us, best_us;
  std::vector<unsigned long long> trace;
};
template <class Launch>
ModeTiming time_mode(int steps, unsigned long long* d_trace, size_t trace_words, Launch&& launch) {
  for (int s = 0; s < 3; ++s) launch(nullptr);
  CK(cudaDeviceSynchronize());
  const std::vector<float> window_ms = sorted_times_ms(5, [&] {
    for (int s = 0; s < steps; ++s) launch(nullptr);
  });
  CK(cudaMemset(d_trace, 0, trace_words * sizeof(unsigned long long)));
  launch(d_trace);
  CK(cudaDeviceSynchronize());
  ModeTiming t{double(window_ms[window_ms.size() / 2]) * 1e3 / steps,
               double(window_ms.front()) * 1e3 / steps,
               std::vector<unsigned long long>(trace_words)};
  CK(cudaMemcpy(t.trace.data(), d_trace, trace_words * sizeof(unsigned long long),
                cudaMemcpyDeviceToHost));
  return t;
}

// A mode's record (the JSON out), with the fields both probes write; `floor_us` is the weights'
// time at the copy bandwidth.
inline nlohmann::json mode_record(const char* mode, const ModeTiming& t, double floor_us,
                                  bool checked) {
  return {{"mode", mode},
          {"step_us_median", t.median_us},
          {"step_us_best", t.best_us},
          {"tok_per_s", 1e6 / t.median_us},
          {"fraction_of_weight_copy_time", floor_us / t.median_us},
          {"checked", checked}};
}

// The self-check's step: every activation poisoned with bf16 NaN except the step's input
// [keep, keep + kHidden) (so a read before its counter finds a NaN, not the previous step's equal
// value), one more step by launch(), and the activations it left, for the host to check.
template <class Launch>
std::vector<uint16_t> poisoned_step(const std::vector<uint16_t>& act, size_t keep, bf16* d_act,
                                    Launch&& launch) {
  std::vector<uint16_t> got(act.size(), uint16_t(0x7fc0));
  std::copy(act.begin() + keep, act.begin() + keep + kHidden, got.begin() + keep);
  CK(cudaMemcpy(d_act, got.data(), got.size() * 2, cudaMemcpyHostToDevice));
  launch();
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got.data(), d_act, got.size() * 2, cudaMemcpyDeviceToHost));
  return got;
}

// The copy bandwidth (1 GiB device copy, read + write; median of 5), as the decode benchmarks'
// limit uses.
inline double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  const std::vector<float> ms =
      sorted_times_ms(5, [&] { CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (ms[2] * 1e-3) / 1e9;
}

}  // namespace decode_probe
