// flash_attn/flash.h — the framework-free interface of hk's flash-attention kernels.
//
// One code base serves libhk's "sdpa" (src/ops/attention_fused_cuda.cc) and the hub repos
// kernels-community/flash-attn2, -3 and -4 (src/abi/): each caller fills a Params struct from its
// own tensor type and calls forward / backward / append_kv. Nothing here knows hk's types or the
// C ABI, allocates memory, or synchronises with the host: every launch is stream-ordered and
// capture-safe, and the only scratch is the caller's workspace (the backward's; the split-KV
// decode's partials, which without one are combined inside a thread-block cluster instead).
//
// Layout: q/out [B, S, Hq, D], k/v [B, T, Hkv, D] through element strides (last dim contiguous),
// or varlen (cu_seqlens_q/_k: sequence b is rows [cu[b], cu[b+1]) of [total, H, D] tensors, the
// batch strides unused). Semantics are those of hk's attention@1 / attention_varlen@1 /
// attention_kvcache@1 (include/hk/layer_interfaces.h): scores = scale·q·kᵀ, optional softcap,
// causal aligned bottom-right, left window, key_start masking, GQA (Hq % Hkv == 0), lse natural
// log in f32 (+∞ for a fully masked row, whose output is 0).
//
// Kernels (see each .cuh): an mma.sync family (fwd_sm80.cuh, bwd_sm80.cuh) for every feature and
// head dim 64/128/256, with a split-KV decode form whose splits are combined through a thread-block
// cluster's shared memory; and Hopper kernels for batch layouts at head dim 64/128 (fwd_sm90.cuh:
// TMA, wgmma, warp-specialised producer/consumers; bwd_sm90.cuh: TMA + wgmma dK/dV/dQ), which
// `forward` / `backward` pick when they apply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

struct CUstream_st;

namespace hk_flash {

using Stream = CUstream_st*;

enum class Dtype { BF16, F16 };

// A valid call these kernels do not implement (the caller falls back or reports it).
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A launch or CUDA call failed.
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Strides {
  int64_t batch = 0, row = 0, head = 0;  // elements; the head_dim stride is 1
};

struct Params {
  Dtype dtype = Dtype::BF16;
  int head_dim = 0;
  int batch = 0, seqlen_q = 0, seqlen_k = 0;  // varlen: max_seqlen_q / max_seqlen_k
  int heads_q = 0, heads_kv = 0;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  Strides q_strides, k_strides, v_strides, out_strides;
  // f32 lse, written when non-null: [B, Hq, S] with these strides (elements; row stride 1), or
  // [Hq, total_q] for varlen (lse_head stride; lse_batch unused).
  float* lse = nullptr;
  int64_t lse_batch = 0, lse_head = 0;
  const int32_t* cu_seqlens_q = nullptr;  // varlen: both or neither, [B + 1]
  const int32_t* cu_seqlens_k = nullptr;
  int total_q = 0;  // varlen: rows of q (sizes the backward's workspace)
  // KV cache: the keys of row b are [0, seqlens_k[b] + seqlens_k_add) (seqlen_k = capacity).
  const int32_t* seqlens_k = nullptr;
  int seqlens_k_add = 0;
  const void* key_start = nullptr;  // [B] i32/i64: keys before it are masked; null = none
  bool key_start_i64 = false;
  float scale = 0.0f;  // 0 → 1/sqrt(head_dim)
  float softcap = 0.0f;
  int window_left = -1;
  bool causal = true;
  bool allow_sm90 = true;  // false: the mma.sync kernels only (kernels-community/flash-attn2)
  int device_sms = 0;      // filled by the dispatcher when 0
  // Scratch of forward_workspace_size / backward_workspace_size bytes, 256-byte aligned; none
  // (null) is fine for the forward, which then combines split-KV partials inside a cluster.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Split-KV decode behind PDL only: true when seqlens_k, key_start and the cache rows before the
  // new ones were all written before the kernel launched just ahead of this one (hk's decode step:
  // that kernel writes q and the new row). The decode then reads the lengths and prefetches its
  // blocks' cache rows into L2 before it waits for that kernel.
  bool cache_settled = false;
  // HK_FLASH_TRACE builds only (a measurement build, never the shipped one): the Hopper kernels
  // stamp clock64 at each phase of their first kTraceTiles tiles (thread 0 of each consumer
  // warpgroup) into [block][warpgroup][tile][phases] — kBwdTracePhases for the backward,
  // kFwdTracePhases for the forward (tile = the block's key-tile stream index)
  unsigned long long* trace = nullptr;
};
constexpr int kTraceTiles = 64, kBwdTracePhases = 13, kFwdTracePhases = 12;

struct BackwardParams : Params {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dout_strides, dq_strides, dk_strides, dv_strides;
  const float* lse_in = nullptr;  // the forward's lse (same layout as Params::lse)
  bool deterministic = false;
};

// Empty when the kernels serve this call; otherwise why not (head dim, dtype, alignment, ...).
std::string unsupported_reason(const Params& p);
// Throws Unsupported (with unsupported_reason) or DeviceError.
void forward(const Params& p, Stream stream);
// Scratch the forward can use (the split-KV decode's partials, over every SM; 0 when it has no
// use for any). Without it the decode combines its splits inside one thread-block cluster per kv
// head, which leaves SMs idle at batch 1.
size_t forward_workspace_size(const Params& p);
size_t backward_workspace_size(const BackwardParams& p);
void backward(const BackwardParams& p, Stream stream);

// Writes k_new/v_new [B, S_new, Hkv, D] into the caches at rows [seqlens[b], seqlens[b] + S_new).
struct AppendParams {
  Dtype dtype = Dtype::BF16;
  int head_dim = 0, batch = 0, seqlen_new = 0, heads_kv = 0;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  Strides k_new_strides, v_new_strides, k_cache_strides, v_cache_strides;
  const int32_t* seqlens = nullptr;
};
void append_kv(const AppendParams& p, Stream stream);

// Which forward kernel `forward` would launch ("sm90 wgmma", "sm80 mma", "sm80 split-kv x33
// (workspace)"), for reports and benchmarks: with p's workspace, or, with_workspace, for a call
// that will get forward_workspace_size bytes.
std::string forward_kernel_name(const Params& p, bool with_workspace = false);

}  // namespace hk_flash
