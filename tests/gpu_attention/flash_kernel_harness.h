// Test and benchmark harness for the flash kernels called directly through
// kernels/flash-attn/src/flash_attn/flash.h (no libhk): device buffers of 16-bit values in
// [B, rows, H, D] layouts with optional padding between heads, random inputs, forward and
// backward calls with a caller workspace, and the kernel-choice environment switches.
// Used by test_flash_kernels.cc (GPU, against the double reference) and
// bench/attention/bench_flash_kernels.cc. Not here: anything of libhk (hk::Tensor, hk::ops).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash_attn/flash.h"
#include "gpu_attention/attention_cases.h"

namespace flash_harness {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline uint16_t to_bits(float x, hk_flash::Dtype dt) {
  if (dt == hk_flash::Dtype::BF16) {
    __nv_bfloat16 v = __float2bfloat16_rn(x);
    uint16_t b;
    std::memcpy(&b, &v, 2);
    return b;
  }
  __half v = __float2half_rn(x);
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}
inline double from_bits(uint16_t b, hk_flash::Dtype dt) {
  if (dt == hk_flash::Dtype::BF16) {
    __nv_bfloat16 v;
    std::memcpy(&v, &b, 2);
    return static_cast<double>(__bfloat162float(v));
  }
  __half v;
  std::memcpy(&v, &b, 2);
  return static_cast<double>(__half2float(v));
}
inline uint16_t nan_bits(hk_flash::Dtype dt) {
  return dt == hk_flash::Dtype::BF16 ? 0x7FC0 : 0x7E00;
}

// A [B, rows, H, D] tensor of 16-bit values on the device; pad_heads > 0 stores each row with
// that many extra heads (as a slice of a fused qkv buffer would be), the tensor starting one head
// in.
struct DevTensor {
  int64_t b = 0, rows = 0, h = 0, d = 0, pad = 0;
  hk_flash::Dtype dt = hk_flash::Dtype::BF16;
  uint16_t* base = nullptr;  // the allocation
  size_t alloc_elems = 0;
  DevTensor() = default;
  DevTensor(int64_t b_, int64_t rows_, int64_t h_, int64_t d_, hk_flash::Dtype dt_,
            int64_t pad_ = 0)
      : b(b_), rows(rows_), h(h_), d(d_), pad(pad_), dt(dt_) {
    alloc_elems = static_cast<size_t>(b * rows * (h + pad) * d) + 8;
    check(cudaMalloc(&base, alloc_elems * 2), "cudaMalloc");
  }
  DevTensor(const DevTensor&) = delete;
  DevTensor& operator=(const DevTensor&) = delete;
  DevTensor(DevTensor&& o) noexcept { *this = std::move(o); }
  DevTensor& operator=(DevTensor&& o) noexcept {
    std::swap(b, o.b), std::swap(rows, o.rows), std::swap(h, o.h), std::swap(d, o.d);
    std::swap(pad, o.pad), std::swap(dt, o.dt), std::swap(base, o.base);
    std::swap(alloc_elems, o.alloc_elems);
    return *this;
  }
  ~DevTensor() {
    if (base) cudaFree(base);
  }
  int64_t offset() const { return pad > 0 ? d : 0; }
  void* data() const { return base + offset(); }
  hk_flash::Strides strides() const {
    hk_flash::Strides s;
    s.head = d;
    s.row = (h + pad) * d;
    s.batch = rows * s.row;
    return s;
  }
  size_t at(int64_t bi, int64_t r, int64_t hi) const {
    return static_cast<size_t>(offset() + bi * rows * (h + pad) * d + (r * (h + pad) + hi) * d);
  }
  // Writes packed [B, rows, H, D] bits (everything else of the allocation: NaN).
  void upload(const std::vector<uint16_t>& packed) const {
    std::vector<uint16_t> buf(alloc_elems, nan_bits(dt));
    size_t i = 0;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t e = 0; e < d; ++e) buf[at(bi, r, hi) + e] = packed[i++];
    check(cudaMemcpy(base, buf.data(), alloc_elems * 2, cudaMemcpyHostToDevice), "upload");
  }
  void poison() const {
    upload(std::vector<uint16_t>(static_cast<size_t>(b * rows * h * d), nan_bits(dt)));
  }
  std::vector<double> download() const {
    std::vector<uint16_t> buf(alloc_elems);
    check(cudaMemcpy(buf.data(), base, alloc_elems * 2, cudaMemcpyDeviceToHost), "download");
    std::vector<double> out;
    out.reserve(static_cast<size_t>(b * rows * h * d));
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t e = 0; e < d; ++e) out.push_back(from_bits(buf[at(bi, r, hi) + e], dt));
    return out;
  }
};

// Random values in [-1, 1) rounded to the dtype: the bits and their exact doubles.
struct RandomValues {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
inline RandomValues random_values(size_t n, hk_flash::Dtype dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  RandomValues r;
  r.bits.resize(n);
  r.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    r.bits[i] = to_bits(dist(rng), dt);
    r.values[i] = from_bits(r.bits[i], dt);
  }
  return r;
}

struct DevFloats {
  float* ptr = nullptr;
  size_t n = 0;
  explicit DevFloats(size_t n_) : n(n_) {
    check(cudaMalloc(&ptr, std::max<size_t>(n, 1) * 4), "cudaMalloc");
  }
  DevFloats(const DevFloats&) = delete;
  DevFloats& operator=(const DevFloats&) = delete;
  ~DevFloats() { cudaFree(ptr); }
  void fill_nan() const { check(cudaMemset(ptr, 0xFF, n * 4), "memset"); }
  std::vector<double> download() const {
    std::vector<float> h(n);
    check(cudaMemcpy(h.data(), ptr, n * 4, cudaMemcpyDeviceToHost), "download");
    return std::vector<double>(h.begin(), h.end());
  }
};

using attention_cases::EnvScope;

// The backward variants: the mma.sync kernel, and the Hopper kernel with dq by bulk reduce-add
// (one a warpgroup — the default —, or one a warp), by a third warpgroup (the dQ warpgroup form)
// or by atomics, each in the default (atomic dq) mode; `deterministic` on top.
// Sm90TmaRowPasses: the TMA dq with the Di pre-pass and dq conversion a row a warp (the passes
// unaligned O, dO or dq take) instead of a tile a block
enum class Bwd { Sm80, Sm90Tma, Sm90TmaWarp, Sm90DqWarpgroup, Sm90Atomic, Sm90TmaRowPasses };
inline const char* bwd_name(Bwd k) {
  return k == Bwd::Sm80              ? "sm80"
         : k == Bwd::Sm90Tma         ? "sm90-tma-dq"
         : k == Bwd::Sm90TmaWarp     ? "sm90-tma-dq-a-warp"
         : k == Bwd::Sm90DqWarpgroup ? "sm90-dq-warpgroup"
         : k == Bwd::Sm90Atomic      ? "sm90-atomic-dq"
                                     : "sm90-tma-dq-row-passes";
}
// HK_FLASH_BWD_DQ's value for a variant
inline const char* bwd_dq_form(Bwd k) {
  return k == Bwd::Sm90Atomic        ? "atomic"
         : k == Bwd::Sm90TmaWarp     ? "warp"
         : k == Bwd::Sm90DqWarpgroup ? "wg"
                                     : "tma";
}
struct BwdScope {
  explicit BwdScope(Bwd k)
      : sm90("HK_FLASH_SM90_BWD", k == Bwd::Sm80 ? "0" : "1"),
        dq("HK_FLASH_BWD_DQ", bwd_dq_form(k)),
        passes("HK_FLASH_BWD_PASSES", k == Bwd::Sm90TmaRowPasses ? "rows" : nullptr) {}
  EnvScope sm90, dq, passes;
};

// One attention call's tensors on the device.
struct Problem {
  int b, s, t, hq, hkv, d;
  bool causal = true;
  float softcap = 0, scale = 0;
  int window = -1;
  std::vector<int32_t> key_start;  // per batch, empty = none
  hk_flash::Dtype dt = hk_flash::Dtype::BF16;
  int pad = 0;  // extra heads per row in every tensor (strided views)
};

struct Buffers {
  DevTensor q, k, v, out, dout, dq, dk, dv;
  DevFloats lse;
  int32_t* key_start = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  explicit Buffers(const Problem& p)
      : q(p.b, p.s, p.hq, p.d, p.dt, p.pad),
        k(p.b, p.t, p.hkv, p.d, p.dt, p.pad),
        v(p.b, p.t, p.hkv, p.d, p.dt, p.pad),
        out(p.b, p.s, p.hq, p.d, p.dt, p.pad),
        dout(p.b, p.s, p.hq, p.d, p.dt, p.pad),
        dq(p.b, p.s, p.hq, p.d, p.dt, p.pad),
        dk(p.b, p.t, p.hkv, p.d, p.dt, p.pad),
        dv(p.b, p.t, p.hkv, p.d, p.dt, p.pad),
        lse(static_cast<size_t>(p.b) * p.hq * p.s) {
    if (!p.key_start.empty()) {
      check(cudaMalloc(&key_start, p.key_start.size() * 4), "cudaMalloc");
      check(
          cudaMemcpy(key_start, p.key_start.data(), p.key_start.size() * 4, cudaMemcpyHostToDevice),
          "key_start");
    }
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    if (key_start) cudaFree(key_start);
    if (workspace) cudaFree(workspace);
  }
};

inline hk_flash::Params forward_params(const Problem& pr, const Buffers& bf) {
  hk_flash::Params p;
  p.dtype = pr.dt;
  p.head_dim = pr.d;
  p.batch = pr.b;
  p.seqlen_q = pr.s;
  p.seqlen_k = pr.t;
  p.heads_q = pr.hq;
  p.heads_kv = pr.hkv;
  p.q = bf.q.data();
  p.k = bf.k.data();
  p.v = bf.v.data();
  p.out = bf.out.data();
  p.q_strides = bf.q.strides();
  p.k_strides = bf.k.strides();
  p.v_strides = bf.v.strides();
  p.out_strides = bf.out.strides();
  p.lse = bf.lse.ptr;
  p.lse_head = pr.s;
  p.lse_batch = static_cast<int64_t>(pr.hq) * pr.s;
  p.key_start = bf.key_start;
  p.scale = pr.scale;
  p.softcap = pr.softcap;
  p.window_left = pr.window;
  p.causal = pr.causal;
  return p;
}

// The backward's parameters, with a workspace of the size it asks for (kept in `bf`).
inline hk_flash::BackwardParams backward_params(const Problem& pr, Buffers& bf,
                                                bool deterministic) {
  hk_flash::BackwardParams p;
  static_cast<hk_flash::Params&>(p) = forward_params(pr, bf);
  p.lse = nullptr;
  p.lse_in = bf.lse.ptr;
  p.dout = bf.dout.data();
  p.dq = bf.dq.data();
  p.dk = bf.dk.data();
  p.dv = bf.dv.data();
  p.dout_strides = bf.dout.strides();
  p.dq_strides = bf.dq.strides();
  p.dk_strides = bf.dk.strides();
  p.dv_strides = bf.dv.strides();
  p.deterministic = deterministic;
  const size_t need = hk_flash::backward_workspace_size(p);
  if (need > bf.workspace_bytes) {
    if (bf.workspace) cudaFree(bf.workspace);
    check(cudaMalloc(&bf.workspace, need), "cudaMalloc(workspace)");
    bf.workspace_bytes = need;
  }
  p.workspace = bf.workspace;
  p.workspace_bytes = bf.workspace_bytes;
  return p;
}

}  // namespace flash_harness
