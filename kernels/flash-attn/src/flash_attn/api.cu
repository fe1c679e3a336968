// flash_attn/api.cu — host dispatch of flash.h: argument checks, kernel choice, workspace layout.
//
// Choice for the forward: the split-KV decode form when a kv head has at most 64 query rows
// (S·Hq/Hkv ≤ 64: its GQA group reads the cache once, split over a cluster sized to fill the GPU);
// else the Hopper kernel on sm_90 for head dim 64/128 batch layouts (HK_FLASH_SM90=0 turns it off,
// for comparisons; its layout by sm90_forward_layout, HK_FLASH_SM90_FWD=v1|v2|v3|v4|v5 forcing
// one; its block order by forward_heads_per_section, HK_FLASH_FWD_SECTION=N forcing N heads a
// section, and the streaming layouts' jobs by forward_stream_pairs, HK_FLASH_FWD_STREAM_ORDER;
// O by TMA stores where out allows, forward_out_by_tma, HK_FLASH_FWD_O=direct storing from
// registers);
// else the mma.sync prefill kernel. HK_FLASH_DECODE=0 keeps decode
// shapes on the prefill kernel. The backward: the Hopper dK/dV kernel under the same conditions
// (HK_FLASH_SM90_BWD=0 turns it alone off; its dq form by sm90_backward_dq, HK_FLASH_BWD_DQ=
// wg (default)|tma|warp|atomic — atomic into the row-major accumulator, the others into the tiled
// one; its block order by backward_heads_per_section, HK_FLASH_BWD_SECTION=N forcing N kv heads a
// section), else the mma.sync one, between the Di pre-pass and the dq pass (a tile a block over the
// tiled accumulator, HK_FLASH_BWD_PASSES=rows keeping the row-a-warp passes). Nothing here
// allocates or synchronises.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "flash_attn/block_schedule.h"
#include "flash_attn/flash.h"
#include "flash_attn/launch.h"
#include "flash_attn/launch_sm90.cuh"

namespace hk_flash {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw DeviceError(std::string(what) + " failed: " + cudaGetErrorString(status));
}

int current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}
namespace {
int attribute(cudaDeviceAttr attr) {
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attr, current_device()), "cudaDeviceGetAttribute");
  return value;
}
bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || !(std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0);
}
// The integer in `name`, or `fallback` when it is unset or not a number.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  char* end = nullptr;
  const long n = v != nullptr ? std::strtol(v, &end, 10) : 0;
  return v != nullptr && end != v && *end == '\0' ? static_cast<int>(n) : fallback;
}
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
bool aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}
bool strides_multiple(const Strides& s, int64_t m, bool batch_used) {
  return s.row % m == 0 && s.head % m == 0 && (!batch_used || s.batch % m == 0);
}
}  // namespace

bool verbose() {
  const char* v = std::getenv("HK_FLASH_VERBOSE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

int device_sm_count() {
  return attribute(cudaDevAttrMultiProcessorCount);
}
int device_capability() {
  return attribute(cudaDevAttrComputeCapabilityMajor) * 10 +
         attribute(cudaDevAttrComputeCapabilityMinor);
}
int device_max_smem_per_block() {
  return attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

void allow_smem(const void* kernel, size_t bytes, bool non_portable_cluster) {
  // Function attributes belong to a device's context, and a kernel may be launched with and
  // without clusters: once per (device, kernel, bytes, cluster permission), not once per kernel.
  static std::mutex mutex;
  static std::set<std::tuple<int, const void*, size_t, bool>> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (!done.insert({current_device(), kernel, bytes, non_portable_cluster}).second) return;
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)),
               "cudaFuncSetAttribute(max dynamic shared memory)");
  if (non_portable_cluster)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
               "cudaFuncSetAttribute(non-portable cluster size)");
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  const auto fn = hk::sdk::cuda::sm90::tensor_map_encoder();
  if (fn == nullptr)
    throw DeviceError("the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
  return fn;
}

int forward_heads_per_section(const Params& p, int head_row_bytes) {
  const int64_t heads = static_cast<int64_t>(p.heads_q) * p.batch;
  const int forced = env_int("HK_FLASH_FWD_SECTION", 0);
  if (forced > 0) return static_cast<int>(std::min<int64_t>(heads, forced));
  const int64_t kv_head_bytes = std::max<int64_t>(1, 2LL * p.seqlen_k * head_row_bytes);
  const int64_t l2_bytes = attribute(cudaDevAttrL2CacheSize);
  const int64_t groups = std::max<int64_t>(1, l2_bytes / 2 / kv_head_bytes);
  return static_cast<int>(std::min<int64_t>(heads, groups * (p.heads_q / p.heads_kv)));
}

int forward_stream_blocks(const Params& p) {
  const int forced = env_int("HK_FLASH_FWD_V4_BLOCKS", 0);
  return forced > 0 ? forced : std::max(1, p.device_sms);
}

bool forward_stream_pairs(bool producer_warpgroup) {
  const char* v = std::getenv("HK_FLASH_FWD_STREAM_ORDER");
  if (v == nullptr || *v == '\0') return producer_warpgroup;
  if (std::strcmp(v, "pairs") == 0) return true;
  if (std::strcmp(v, "snake") == 0) return false;
  throw std::invalid_argument(std::string("HK_FLASH_FWD_STREAM_ORDER=") + v +
                              " is not a job order of the streaming forwards: set it to pairs or "
                              "snake, or unset it");
}

bool forward_out_by_tma(const Params& p) {
  return aligned(p.out, 16) && strides_multiple(p.out_strides, 8, true) &&
         !env_is("HK_FLASH_FWD_O", "direct");
}

int backward_heads_per_section(const BackwardParams& p) {
  const int heads = p.heads_kv * p.batch;
  const int forced = env_int("HK_FLASH_BWD_SECTION", 0);
  if (forced > 0) return std::min(heads, forced);
  // per kv head: its group's Q and dO rows (16-bit) and dq accumulator rows (f32), 8 bytes a
  // q element
  const int64_t head_bytes = std::max<int64_t>(
      1, static_cast<int64_t>(p.heads_q / p.heads_kv) * p.seqlen_q * p.head_dim * 8);
  const int64_t l2_bytes = attribute(cudaDevAttrL2CacheSize);
  const int fit = static_cast<int>(
      std::min<int64_t>(heads, std::max<int64_t>(1, l2_bytes * 3 / 4 / head_bytes)));
  if (fit >= heads || p.device_sms <= 0) return heads;
  // Sections keep each tile's Q, dO and dq in L2 between the visits of its key blocks (B2 × H16 ×
  // S8192: the dK/dV kernel's DRAM traffic 3.56 → 0.65 GB, B1 × H32 × S16384 6.9 → 2.9 GB, H200
  // ncu), but blocks start longest-first only inside a section: the last sections' heaviest blocks
  // can start late and leave SMs idle at the end (B4 × H16 × S2048 in sections of 6 kv heads: the
  // backward 345-356 TF/s against 407-411 in one section; the model's tail 1.29 against 1.03). So
  // the largest section whose heads' Q, dO and dq fill at most 3/4 of L2 and whose schedule ends
  // within 2 % of the one-section order's; else one section. The L2 saving outweighs a modelled
  // 1-2 % tail: B8 × H16 × S2048 in sections of 8 kv heads (32 MB, tail 1.031 against 1.017), the
  // dK/dV kernel 671 against 718 µs and 0.52 against 1.88 GB of DRAM traffic (H200, ncu,
  // 2026-12-05; 16 heads 673 µs, 4 heads 713, 2 heads 729), the training step's B4 345 against 350
  // µs; B2 × S8192 now takes 4 heads (was 2; not yet measured). Worked out once per shape.
  using Key = std::tuple<int, int, int, int, int, bool, int, int64_t>;
  static std::mutex mutex;
  static std::map<Key, int> chosen;
  const Key key{heads,    p.heads_q / p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim,
                p.causal, p.device_sms,           l2_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = chosen.find(key); it != chosen.end()) return it->second;
  const int pick =
      choose_section(backward_block_work(p.seqlen_q, p.seqlen_k, p.heads_q / p.heads_kv, p.causal),
                     heads, fit, p.device_sms);
  chosen.emplace(key, pick);
  return pick;
}

size_t backward_sm90_smem(int head_dim) {
  return head_dim <= 64 ? Sm90BwdConfig<64>::kSmem : Sm90BwdConfig<128>::kSmem;
}

namespace {
// Decode row tiles of a call: 16 (query, head-of-the-group) rows of one kv head each.
int64_t decode_row_tiles(const Params& p) {
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * (p.heads_q / p.heads_kv);
  return static_cast<int64_t>(p.batch) * p.heads_kv * ((rows + 15) / 16);
}
}  // namespace

// Decode rows per kv head at most 64 (row tiles of 16): the split-KV form. Without a workspace
// its splits are the blocks of one cluster (at most 16, combined through distributed shared
// memory); with one they are independent blocks over every SM (HK_FLASH_DECODE_WAVES a row tile's
// share of the SMs, default 1: one block an SM), whose partials a second kernel combines, eight
// warps on 128-key tiles for splits of 1024+ keys at head dim ≤ 128, else four warps six deep
// (HK_FLASH_DECODE_WARPS=4|8 forces one; H200, batch 1, 16/8 heads, D128: 32768 keys 40.0 µs with
// eight warps against 42.8 with four, 4096 keys 12.7 µs with four against 13.3).
// HK_FLASH_DECODE_CLUSTER=1 keeps the cluster form; HK_FLASH_DECODE_SPLITS=N caps its splits (at
// 81 keys, batch 1, one block a kv head took 7.64 µs against 5.72 for the default two a cluster,
// H200). The variables are read on every call, like
// the other switches here, so a test can change them between calls.
DecodeSplit decode_split(const Params& p, int sms, bool with_workspace) {
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * (p.heads_q / p.heads_kv);
  if (rows > 64 || !env_on("HK_FLASH_DECODE")) return {};
  const int64_t blocks = decode_row_tiles(p);
  if (with_workspace && !env_is("HK_FLASH_DECODE_CLUSTER", "1") && blocks < sms) {
    const int waves = std::clamp(env_int("HK_FLASH_DECODE_WAVES", 1), 1, 4);
    const int64_t key_tiles = (p.seqlen_k + 63) / 64;  // the four-warp decode kernel's tiles
    // at least two tiles a split, so a block's pipeline has something to overlap
    const int64_t splits =
        std::min<int64_t>({waves * sms / blocks, std::max<int64_t>(key_tiles / 2, 1), 256});
    if (splits > 1) {
      const int warps = env_int("HK_FLASH_DECODE_WARPS", 0);
      const bool wide =
          p.head_dim <= 128 &&
          (warps == 4 || warps == 8 ? warps == 8 : (p.seqlen_k + splits - 1) / splits >= 1024);
      return {static_cast<int>(splits), true, wide};
    }
  }
  const int64_t key_tiles = (p.seqlen_k + 127) / 128;
  int64_t splits =
      std::min<int64_t>({blocks >= sms ? 1 : sms / blocks, 16, std::max<int64_t>(key_tiles, 1)});
  const int cap = env_int("HK_FLASH_DECODE_SPLITS", 0);
  if (cap > 0) splits = std::min<int64_t>(splits, cap);
  return {static_cast<int>(std::max<int64_t>(splits, 1)), false, false};
}

size_t decode_partials_bytes(const Params& p, int splits) {
  return static_cast<size_t>(decode_row_tiles(p)) * splits * decode_slot_floats(p.head_dim) *
         sizeof(float);
}

std::string unsupported_reason(const Params& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return "head_dim " + std::to_string(p.head_dim) + " (flash kernels take 64, 128 or 256)";
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0)
    return "q heads must be a multiple of kv heads";
  if (p.batch <= 0 || p.seqlen_q < 0 || p.seqlen_k < 0) return "empty or negative shape";
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return "varlen needs both cu_seqlens_q and cu_seqlens_k";
  const bool batch_used = p.cu_seqlens_q == nullptr;
  if (!aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 16) ||
      !strides_multiple(p.q_strides, 8, batch_used) ||
      !strides_multiple(p.k_strides, 8, batch_used) ||
      !strides_multiple(p.v_strides, 8, batch_used))
    return "q, k and v need 16-byte aligned rows (pointers and strides multiples of 8 elements)";
  if (!aligned(p.out, 4) || !strides_multiple(p.out_strides, 2, batch_used))
    return "out needs 4-byte aligned element pairs";
  const int cap = device_capability();
  if (cap < 80) return "compute capability " + std::to_string(cap) + " (flash kernels need 80+)";
  return "";
}

namespace {
// HK_FLASH_SM90_FWD: "v1" the producer-warpgroup layout, "v2" the two-warpgroup one, "v3" v2 with
// two query tiles a block, "v4" v2 streaming its query tiles (a block an SM), "v5" that streaming
// with v1's producer warpgroup; any other value is a typo that would silently measure the wrong
// kernel, so it fails the call. Unset: v5 at both head dims — measured on the H200 (bf16, causal,
// 2026-12-05, hk_bench_flash_kernels, the layouts mirrored in one run): v5 523-542 / 635-642 /
// 641 TF/s at B8×S2048 / B2×S8192 / B1×H32×S16384 against v1's 474-479 / 631-640 / 653 and v2's
// 452-464 / 560-571 / 593, the training step's B4×S2048 533 against v1 432, v2 415, v3 450, and at
// head dim 64 338 against v1's 294; beside cuDNN in one process (attention_interleaved.py) v5's
// forward 1.18 / 1.22 / 1.06× against v1's 0.97 / 1.15 / 1.07× and the old default's (v2/v3)
// 0.93 / 1.08 / 1.03×.
Sm90Forward sm90_forward_layout() {
  const char* v = std::getenv("HK_FLASH_SM90_FWD");
  if (v == nullptr || *v == '\0') return Sm90Forward::kProducerStreaming;
  if (std::strcmp(v, "v1") == 0) return Sm90Forward::kProducerWarpgroup;
  if (std::strcmp(v, "v2") == 0) return Sm90Forward::kTwoWarpgroups;
  if (std::strcmp(v, "v3") == 0) return Sm90Forward::kTwoWarpgroupsPaired;
  if (std::strcmp(v, "v4") == 0) return Sm90Forward::kStreaming;
  if (std::strcmp(v, "v5") == 0) return Sm90Forward::kProducerStreaming;
  throw std::invalid_argument(
      std::string("HK_FLASH_SM90_FWD=") + v +
      " is not a Hopper forward layout: set it to v1, v2, v3, v4 or v5, or unset it");
}

// HK_FLASH_BWD_DQ: how the Hopper backward's dq leaves (launch.h's Sm90BwdDq), read at each call
// so A/B runs can alternate forms in one process. Unset or `wg`: the dQ warpgroup form, the
// default since it measured faster (docs/performance.md, 2026-12-05); `tma` (one bulk reduce-add a
// warpgroup, the earlier default), `warp` and `atomic` for A/Bs. A value that names none of them
// fails the call rather than silently timing the default.
Sm90BwdDq sm90_backward_dq() {
  const char* v = std::getenv("HK_FLASH_BWD_DQ");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "wg") == 0) return Sm90BwdDq::kDqWarpgroup;
  if (std::strcmp(v, "tma") == 0) return Sm90BwdDq::kReduceWarpgroup;
  if (std::strcmp(v, "warp") == 0) return Sm90BwdDq::kReduceWarp;
  if (std::strcmp(v, "atomic") == 0) return Sm90BwdDq::kAtomic;
  throw std::invalid_argument(std::string("HK_FLASH_BWD_DQ=") + v +
                              " is not a dq form of the Hopper backward: set it to tma, warp, wg "
                              "or atomic, or unset it");
}

const char* sm90_backward_dq_name(Sm90BwdDq form) {
  return form == Sm90BwdDq::kReduceWarp    ? " (dq by bulk reduce-add a warp)"
         : form == Sm90BwdDq::kDqWarpgroup ? " (dq by a third warpgroup, bulk reduce-add a warp)"
         : form == Sm90BwdDq::kAtomic      ? " (dq by atomics)"
                                           : " (dq by bulk reduce-add a warpgroup)";
}

const char* sm90_forward_name(Sm90Forward layout) {
  return layout == Sm90Forward::kTwoWarpgroups         ? "sm90 wgmma v2"
         : layout == Sm90Forward::kTwoWarpgroupsPaired ? "sm90 wgmma v3"
         : layout == Sm90Forward::kStreaming           ? "sm90 wgmma v4"
         : layout == Sm90Forward::kProducerStreaming   ? "sm90 wgmma v5"
                                                       : "sm90 wgmma";
}

template <class T>
void forward_typed(const Params& p, cudaStream_t stream, DecodeSplit splits, bool sm90,
                   Sm90Forward layout) {
  switch (p.head_dim) {
    case 64:
      if (sm90 && launch_forward_sm90<T, 64>(p, stream, layout)) return;
      return launch_forward_sm80<T, 64>(p, stream, splits);
    case 128:
      if (sm90 && launch_forward_sm90<T, 128>(p, stream, layout)) return;
      return launch_forward_sm80<T, 128>(p, stream, splits);
    default:
      return launch_forward_sm80<T, 256>(p, stream, splits);
  }
}

bool sm90_applies(const Params& p, int splits) {
#if HK_FLASH_HAVE_SM90A
  if (splits != 0 || !p.allow_sm90 || !env_on("HK_FLASH_SM90")) return false;
  if (device_capability() != 90 || p.head_dim > 128) return false;
  if (p.cu_seqlens_q != nullptr || p.seqlens_k != nullptr) return false;
  // TMA: 16-byte aligned base and strides (checked for 16-bit elements by unsupported_reason)
  return true;
#else
  (void)p;
  (void)splits;
  return false;
#endif
}

// The Hopper backward: the Hopper forward's conditions, plus dO as a TMA source (16-byte rows)
// and the shared memory it needs. HK_FLASH_SM90_BWD=0 turns it off (scripts/gpu-test does when its
// canary fails; and for comparisons); HK_FLASH_SM90=0 turns off both Hopper kernels.
bool backward_sm90_applies(const BackwardParams& p) {
#if HK_FLASH_HAVE_SM90A
  if (!p.allow_sm90 || !env_on("HK_FLASH_SM90") || !env_on("HK_FLASH_SM90_BWD")) return false;
  if (device_capability() != 90 || (p.head_dim != 64 && p.head_dim != 128)) return false;
  if (p.cu_seqlens_q != nullptr || p.seqlens_k != nullptr) return false;
  if (!aligned(p.dout, 16) || !strides_multiple(p.dout_strides, 8, true)) return false;
  return static_cast<int>(backward_sm90_smem(p.head_dim)) <= device_max_smem_per_block();
#else
  (void)p;
  return false;
#endif
}

Params with_defaults(const Params& in) {
  Params p = in;
  if (p.device_sms <= 0) p.device_sms = device_sm_count();
  return p;
}

// The decode split this call gets: through the workspace when the caller gave one large enough.
DecodeSplit planned_split(const Params& p) {
  DecodeSplit d = decode_split(p, p.device_sms, p.workspace != nullptr);
  if (d.through_workspace && p.workspace_bytes < decode_partials_bytes(p, d.splits))
    d = decode_split(p, p.device_sms, false);
  return d;
}
}  // namespace

size_t forward_workspace_size(const Params& in) {
  if (!unsupported_reason(in).empty() || in.seqlen_q == 0) return 0;
  const Params p = with_defaults(in);
  const DecodeSplit d = decode_split(p, p.device_sms, true);
  return d.through_workspace ? decode_partials_bytes(p, d.splits) : 0;
}

std::string forward_kernel_name(const Params& in, bool with_workspace) {
  const Params p = with_defaults(in);
  const DecodeSplit d = with_workspace ? decode_split(p, p.device_sms, true) : planned_split(p);
  const int splits = d.splits;
  if (splits > 0)
    return "sm80 split-kv x" + std::to_string(splits) +
           (d.through_workspace ? " (workspace)" : " (cluster)");
  if (!sm90_applies(p, splits)) return "sm80 mma";
  return sm90_forward_name(sm90_forward_layout());
}

void forward(const Params& in, Stream stream_handle) {
  const std::string why = unsupported_reason(in);
  if (!why.empty()) throw Unsupported("flash attention: " + why);
  const Params p = with_defaults(in);
  if (p.seqlen_q == 0) return;
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const DecodeSplit split = planned_split(p);
  const int splits = split.splits;
  const bool sm90 = sm90_applies(p, splits);
  const Sm90Forward layout = sm90 ? sm90_forward_layout() : Sm90Forward::kProducerWarpgroup;
  if (verbose() && splits == 0)
    std::fprintf(stderr, "hk flash: forward on the %s kernel\n",
                 sm90 ? sm90_forward_name(layout) : "sm80 mma");
  if (p.dtype == Dtype::BF16)
    forward_typed<__nv_bfloat16>(p, stream, split, sm90, layout);
  else
    forward_typed<__half>(p, stream, split, sm90, layout);
}

namespace {
constexpr size_t kAlign = 256;
size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
size_t q_rows(const Params& p) {
  return p.cu_seqlens_q != nullptr ? static_cast<size_t>(p.total_q)
                                   : static_cast<size_t>(p.batch) * p.seqlen_q;
}
}  // namespace

size_t dq_tiled_bytes(const Params& p) {  // every (b, h) a whole number of 64-row tiles
  const size_t tiles = (static_cast<size_t>(p.seqlen_q) + kDqTileRows - 1) / kDqTileRows;
  return static_cast<size_t>(p.batch) * p.heads_q * tiles * kDqTileRows * p.head_dim * 4;
}

size_t backward_workspace_size(const BackwardParams& p) {
  const size_t di = round_up(q_rows(p) * p.heads_q * sizeof(float));
  // rows, or the Hopper kernel's tiles (batch layouts), whichever the call may take is larger
  const size_t dq_rows = q_rows(p) * p.heads_q * p.head_dim * 4;
  const size_t dq_tiles = p.cu_seqlens_q == nullptr ? dq_tiled_bytes(p) : 0;
  const size_t dq = p.deterministic ? 0 : round_up(std::max(dq_rows, dq_tiles));
  return di + dq;
}

void backward(const BackwardParams& in, Stream stream_handle) {
  std::string why = unsupported_reason(in);
  const bool batch_used = in.cu_seqlens_q == nullptr;
  if (why.empty() && (!aligned(in.dout, 4) || !aligned(in.dq, 4) || !aligned(in.dk, 4) ||
                      !aligned(in.dv, 4) || !strides_multiple(in.dout_strides, 2, batch_used) ||
                      !strides_multiple(in.dq_strides, 2, batch_used) ||
                      !strides_multiple(in.dk_strides, 2, batch_used) ||
                      !strides_multiple(in.dv_strides, 2, batch_used)))
    why = "dout, dq, dk and dv need 4-byte aligned element pairs";
  if (why.empty() && in.lse_in == nullptr) why = "the backward needs the forward's lse";
  if (why.empty() && in.cu_seqlens_q != nullptr && in.total_q <= 0)
    why = "varlen backward needs total_q";
  if (!why.empty()) throw Unsupported("flash attention backward: " + why);
  BackwardParams p = in;
  if (p.device_sms <= 0) p.device_sms = device_sm_count();
  const size_t need = backward_workspace_size(p);
  if (p.workspace_bytes < need || (need > 0 && p.workspace == nullptr))
    throw Unsupported("flash attention backward: workspace of " +
                      std::to_string(p.workspace_bytes) + " bytes, " + std::to_string(need) +
                      " needed");
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  float* di = static_cast<float*>(p.workspace);
  float* dq_accum = p.deterministic ? nullptr
                                    : reinterpret_cast<float*>(static_cast<char*>(p.workspace) +
                                                               round_up(q_rows(p) * p.heads_q * 4));
  if (p.seqlen_k == 0 || p.seqlen_q == 0) return;  // nothing the kernels would touch
  const bool sm90 = backward_sm90_applies(p);
  // (read only where the Hopper kernel runs, as the forward's layout switch is)
  const Sm90BwdDq dq_form = sm90 ? sm90_backward_dq() : Sm90BwdDq::kReduceWarpgroup;
  // the Hopper kernel's bulk reduce-adds leave dq in its tiled layout (whole tiles)
  const bool tiled_dq = sm90 && sm90_backward_dq_tiled(dq_form) && dq_accum != nullptr;
  // its passes a tile a block need 16-byte O and dO rows and 8-byte dq rows (batch layouts: the
  // Hopper kernel's); HK_FLASH_BWD_PASSES=rows keeps the row passes, for A/Bs
  const bool tile_passes =
      tiled_dq && aligned(p.out, 16) && aligned(p.dout, 16) && aligned(p.dq, 8) &&
      strides_multiple(p.out_strides, 8, true) && strides_multiple(p.dout_strides, 8, true) &&
      strides_multiple(p.dq_strides, 4, true) && !env_is("HK_FLASH_BWD_PASSES", "rows");
  const DqPasses passes = !tiled_dq     ? DqPasses::kRows
                          : tile_passes ? DqPasses::kTiled
                                        : DqPasses::kTiledByRows;
  if (verbose())
    std::fprintf(stderr, "hk flash: backward on the %s kernel%s\n",
                 sm90 ? "sm90 wgmma" : "sm80 mma",
                 sm90 && dq_accum != nullptr ? sm90_backward_dq_name(dq_form) : "");
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto steps = [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      launch_backward_prepare<T, D>(p, stream, di, dq_accum, passes);
      if (!(sm90 && launch_backward_dkdv_sm90<T, D>(p, stream, di, dq_accum, dq_form)))
        launch_backward_dkdv_sm80<T, D>(p, stream, di, dq_accum);
      launch_backward_finish<T, D>(p, stream, di, dq_accum, passes);
    };
    switch (p.head_dim) {
      case 64:
        return steps(std::integral_constant<int, 64>{});
      case 128:
        return steps(std::integral_constant<int, 128>{});
      default: {
        // head dim 256: the mma.sync kernels only (backward_sm90_applies is false)
        launch_backward_prepare<T, 256>(p, stream, di, dq_accum, DqPasses::kRows);
        launch_backward_dkdv_sm80<T, 256>(p, stream, di, dq_accum);
        launch_backward_finish<T, 256>(p, stream, di, dq_accum, DqPasses::kRows);
        return;
      }
    }
  };
  if (p.dtype == Dtype::BF16)
    run(__nv_bfloat16{});
  else
    run(__half{});
}

void append_kv(const AppendParams& p, Stream stream_handle) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    throw Unsupported("flash KV-cache append: head_dim " + std::to_string(p.head_dim));
  if (p.seqlen_new == 0 || p.batch == 0) return;
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    switch (p.head_dim) {
      case 64:
        return launch_append_kv<T, 64>(p, stream);
      case 128:
        return launch_append_kv<T, 128>(p, stream);
      default:
        return launch_append_kv<T, 256>(p, stream);
    }
  };
  if (p.dtype == Dtype::BF16)
    run(__nv_bfloat16{});
  else
    run(__half{});
}

}  // namespace hk_flash
