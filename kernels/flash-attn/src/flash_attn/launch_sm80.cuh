// flash_attn/launch_sm80.cuh — internal: launchers of the mma.sync family and the KV-cache append,
// included by the inst/ files that instantiate them (see launch.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "flash_attn/bwd_sm80.cuh"
#include "flash_attn/bwd_tiles.cuh"
#include "flash_attn/fwd_sm80.cuh"
#include "flash_attn/launch.h"

namespace hk_flash {

// The split-KV decode launches with programmatic dependent launch on sm_90+ (the kernel waits for
// its predecessor before its first load, then lets its successor launch): in a decode step of PDL
// kernels its launch overlaps the rotary kernel's tail, and the next product stages its weights
// while the attention runs. The cluster form takes it only when its blocks are short (at most 512
// keys each): H200, Qwen3-0.6B shapes, in one call with and without it, batch 1 gained 1.4-1.9 %
// and batch 8 at 16+128 tokens 2.3 %, while batch 8 at 2048+128 (1,050 keys a block) lost 4.5 %.
// Fills `attr` and returns 1, or 0 (not asked for, before sm_90, or HK_FLASH_DECODE_PDL=0).
inline int decode_pdl_attribute(cudaLaunchAttribute& attr, bool asked = true) {
  const char* off = std::getenv("HK_FLASH_DECODE_PDL");
  if (off != nullptr && (std::strcmp(off, "0") == 0 || std::strcmp(off, "off") == 0)) return 0;
  if (!asked || device_capability() < 90) return 0;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return 1;
}

// The launch of the split-KV decode's `splits` blocks a row tile (the attributes are the caller's).
template <class Cfg>
cudaLaunchConfig_t decode_split_config(const Params& p, int splits, int tiles, size_t smem,
                                       cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(splits, tiles * p.heads_kv, p.batch);
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  return config;
}

// Whether the split kernel prefetches a settled cache before its PDL wait (Params::cache_settled):
// only ahead of such a wait, and for short blocks — H200, Qwen3-0.6B, batch 1: 128 keys a block
// (16+128 tokens) 1,297 -> 1,326 tok/s, 256 (2048+128) 1,079 -> 1,062.
inline bool prefetch_settled_cache(const Params& p, bool pdl, int keys_per_block) {
  return p.cache_settled && pdl && keys_per_block <= 128;
}

// Split-KV decode: clusters of up to `splits` blocks (more than 8 needs the non-portable size).
// The cluster size is the largest at most `splits` for which every cluster of the grid can be
// resident at once (cudaOccupancyMaxActiveClusters, per kernel and size, asked once): a cluster
// left for a second wave would double the call (on the H200 only seven 16-block clusters of a
// one-block-an-SM kernel fit, a GPC being short of 16 free SMs; fourteen of this kernel's do).
template <class T, int D, class Cfg>
void launch_decode_cluster(const Params& p, cudaStream_t stream, int splits) {
  constexpr size_t smem = fwd_smem_bytes<T, D, Cfg>();
  auto kernel = flash_fwd_sm80_kernel<T, D, Cfg>;
  allow_smem(reinterpret_cast<const void*>(kernel), smem, /*non_portable_cluster=*/true);
  const int group = p.heads_q / p.heads_kv;
  const int tiles = (p.seqlen_q * group + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int clusters = tiles * p.heads_kv * p.batch;
  // resident[device][s]: clusters of s blocks resident at once (0: not asked yet, -1: none fit)
  static int resident[16][17];
  static std::mutex mutex;
  const int dev = current_device() & 15;
  auto resident_clusters = [&](int size) {
    std::lock_guard<std::mutex> lock(mutex);
    int& n = resident[dev][size];
    if (n == 0) {
      cudaLaunchConfig_t probe = {};
      probe.gridDim = dim3(size, 1, 1);
      probe.blockDim = dim3(Cfg::kThreads);
      probe.dynamicSmemBytes = smem;
      cudaLaunchAttribute a;
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = size;
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
      probe.attrs = &a;
      probe.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &probe) != cudaSuccess) n = 0;
      (void)cudaGetLastError();
      if (n == 0) n = -1;  // cannot run at this size
    }
    return n;
  };
  const int asked = splits;
  while (splits > 1 && resident_clusters(splits) < clusters) --splits;
  if (verbose())
    std::fprintf(stderr,
                 "hk flash: split-kv decode (%d warps, %d-key tiles, %d deep, %zu B shared) over "
                 "clusters of %d (asked %d; %d clusters, %d of that size resident at once)\n",
                 Cfg::kWarps, Cfg::kBlockN, Cfg::kStages, smem, splits, asked, clusters,
                 splits > 1 ? resident_clusters(splits) : 0);
  cudaLaunchConfig_t config = decode_split_config<Cfg>(p, splits, tiles, smem, stream);
  cudaLaunchAttribute attr[2];
  int n_attr = 0;
  if (splits > 1) {
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = splits;
    attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr].val.clusterDim.z = 1;
    ++n_attr;
  }
  const int keys_per_block = (p.seqlen_k + splits - 1) / splits;
  const int pdl = decode_pdl_attribute(attr[n_attr], keys_per_block <= 512);
  n_attr += pdl;
  config.attrs = attr;
  config.numAttrs = n_attr;
  Params pc = p;
  pc.cache_settled = prefetch_settled_cache(p, pdl, keys_per_block);
  pc.workspace = nullptr;  // the kernel's switch between the two combines
  check_cuda(cudaLaunchKernelEx(&config, kernel, pc), "flash split-kv decode (sm80) launch");
}

// Split-KV decode through the workspace: `splits` independent blocks a row tile, each writing its
// partial, then flash_decode_combine_kernel (one block a (row, row tile, batch)), launched with
// programmatic dependent launch so its launch overlaps the split kernel's tail.
template <class T, int D, class Cfg>
void launch_decode_workspace(const Params& p, cudaStream_t stream, int splits) {
  static_assert(Cfg::kBlockM == 16, "the partials' layout (decode_slot_floats) has 16 rows");
  constexpr size_t smem = fwd_smem_bytes<T, D, Cfg>();
  auto kernel = flash_fwd_sm80_kernel<T, D, Cfg>;
  allow_smem(reinterpret_cast<const void*>(kernel), smem);
  const int group = p.heads_q / p.heads_kv;
  const int tiles = (p.seqlen_q * group + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (verbose())
    std::fprintf(stderr,
                 "hk flash: split-kv decode (%d warps, %d-key tiles, %d deep, %zu B shared) over "
                 "%d independent splits a row tile (%d row tiles), combined by a second kernel\n",
                 Cfg::kWarps, Cfg::kBlockN, Cfg::kStages, smem, splits,
                 tiles * p.heads_kv * p.batch);
  cudaLaunchConfig_t split_config = decode_split_config<Cfg>(p, splits, tiles, smem, stream);
  cudaLaunchAttribute split_attr[1];
  split_config.attrs = split_attr;
  split_config.numAttrs = decode_pdl_attribute(split_attr[0]);
  Params ps = p;
  ps.cache_settled =
      prefetch_settled_cache(p, split_config.numAttrs == 1, (p.seqlen_k + splits - 1) / splits);
  check_cuda(cudaLaunchKernelEx(&split_config, kernel, ps), "flash split-kv decode (sm80) launch");
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(Cfg::kBlockM, tiles * p.heads_kv, p.batch);
  config.blockDim = dim3(D);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, flash_decode_combine_kernel<T, D>, p, splits),
             "flash split-kv decode combine launch");
}

template <class T, int D>
void launch_forward_sm80(const Params& p, cudaStream_t stream, DecodeSplit split) {
  if (split.splits == 0) {
    using Cfg = FwdPrefill<D>;
    constexpr size_t smem = fwd_smem_bytes<T, D, Cfg>();
    auto kernel = flash_fwd_sm80_kernel<T, D, Cfg>;
    allow_smem(reinterpret_cast<const void*>(kernel), smem);
    const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.heads_q, p.batch);
    kernel<<<grid, Cfg::kThreads, smem, stream>>>(p);
    check_cuda(cudaGetLastError(), "flash forward (sm80) launch");
    return;
  }
  if constexpr (D <= 128)
    if (split.through_workspace && split.wide)
      return launch_decode_workspace<T, D, FwdDecodeWide<D>>(p, stream, split.splits);
  if (split.through_workspace)
    launch_decode_workspace<T, D, FwdDecode<D>>(p, stream, split.splits);
  else
    launch_decode_cluster<T, D, FwdDecodeCluster<D>>(p, stream, split.splits);
}

// The backward in three launches, so the Hopper dK/dV kernel can take the middle one's place:
// Di (and the zeroed dq accumulator), dK/dV (+ dq atomics), then dq (conversion, or the
// deterministic kernel when dq_accum is null).
template <class T, int D>
void launch_backward_prepare(const BackwardParams& p, cudaStream_t stream, float* di,
                             float* dq_accum, DqPasses passes) {
  if (passes == DqPasses::kTiled) {
    const dim3 tile_grid((p.seqlen_q + kDqTileRows - 1) / kDqTileRows, p.heads_q, p.batch);
    flash_bwd_preprocess_tiles_kernel<T, D><<<tile_grid, 256, 0, stream>>>(p, di, dq_accum);
    check_cuda(cudaGetLastError(), "flash backward preprocess (tiles) launch");
    return;
  }
  const dim3 row_grid((p.seqlen_q + 7) / 8, p.heads_q, p.batch);
  const bool tiled = passes == DqPasses::kTiledByRows;
  if (tiled)  // every tile's padding rows too (the bulk reduce-adds write them)
    check_cuda(cudaMemsetAsync(dq_accum, 0, dq_tiled_bytes(p), stream), "dq accumulator clear");
  flash_bwd_preprocess_kernel<T, D>
      <<<row_grid, 256, 0, stream>>>(p, di, tiled ? nullptr : dq_accum);
  check_cuda(cudaGetLastError(), "flash backward preprocess launch");
}

template <class T, int D>
void launch_backward_dkdv_sm80(const BackwardParams& p, cudaStream_t stream, const float* di,
                               float* dq_accum) {
  using Cfg = BwdDkdv<D>;
  constexpr size_t smem = bwd_dkdv_smem_bytes<D, Cfg>();
  auto kernel = flash_bwd_dkdv_sm80_kernel<T, D, Cfg>;
  allow_smem(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, p.heads_kv, p.batch);
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p, di, dq_accum);
  check_cuda(cudaGetLastError(), "flash backward dk/dv launch");
}

template <class T, int D>
void launch_backward_finish(const BackwardParams& p, cudaStream_t stream, const float* di,
                            const float* dq_accum, DqPasses passes) {
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / sqrtf(static_cast<float>(D));
  const dim3 row_grid((p.seqlen_q + 7) / 8, p.heads_q, p.batch);
  if (dq_accum != nullptr && passes == DqPasses::kTiled) {
    const dim3 tile_grid((p.seqlen_q + kDqTileRows - 1) / kDqTileRows, p.heads_q, p.batch);
    flash_bwd_convert_dq_tiles_kernel<T, D><<<tile_grid, 256, 0, stream>>>(p, dq_accum, scale);
    check_cuda(cudaGetLastError(), "flash backward dq conversion (tiles) launch");
  } else if (dq_accum != nullptr) {
    flash_bwd_convert_dq_kernel<T, D>
        <<<row_grid, 256, 0, stream>>>(p, dq_accum, scale, passes == DqPasses::kTiledByRows);
    check_cuda(cudaGetLastError(), "flash backward dq conversion launch");
  } else {
    constexpr size_t smem = bwd_dq_smem_bytes<D>();
    auto kernel = flash_bwd_dq_sm80_kernel<T, D>;
    allow_smem(reinterpret_cast<const void*>(kernel), smem);
    const dim3 grid((p.seqlen_q + BwdDq<D>::kBlockM - 1) / BwdDq<D>::kBlockM, p.heads_q, p.batch);
    kernel<<<grid, BwdDq<D>::kThreads, smem, stream>>>(p, di);
    check_cuda(cudaGetLastError(), "flash backward deterministic dq launch");
  }
}

// One warp per (new row, kv head) copies its K and V rows into the caches.
template <class T, int D>
__global__ void __launch_bounds__(256) flash_append_kv_kernel(const AppendParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = blockIdx.x * 8 + warp, h = blockIdx.y, b = blockIdx.z;
  if (s >= p.seqlen_new) return;
  const int64_t dst_row = static_cast<int64_t>(p.seqlens[b]) + s;
  const T* kn = static_cast<const T*>(p.k_new) + b * p.k_new_strides.batch +
                s * p.k_new_strides.row + h * p.k_new_strides.head;
  const T* vn = static_cast<const T*>(p.v_new) + b * p.v_new_strides.batch +
                s * p.v_new_strides.row + h * p.v_new_strides.head;
  T* kc = static_cast<T*>(p.k_cache) + b * p.k_cache_strides.batch +
          dst_row * p.k_cache_strides.row + h * p.k_cache_strides.head;
  T* vc = static_cast<T*>(p.v_cache) + b * p.v_cache_strides.batch +
          dst_row * p.v_cache_strides.row + h * p.v_cache_strides.head;
  for (int d = lane; d < D; d += 32) {
    kc[d] = kn[d];
    vc[d] = vn[d];
  }
}

template <class T, int D>
void launch_append_kv(const AppendParams& p, cudaStream_t stream) {
  const dim3 grid((p.seqlen_new + 7) / 8, p.heads_kv, p.batch);
  flash_append_kv_kernel<T, D><<<grid, 256, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "flash KV-cache append launch");
}

#define HK_FLASH_INSTANTIATE_SM80(T, D)                                                            \
  template void launch_forward_sm80<T, D>(const Params&, cudaStream_t, DecodeSplit);               \
  template void launch_backward_prepare<T, D>(const BackwardParams&, cudaStream_t, float*, float*, \
                                              DqPasses);                                           \
  template void launch_backward_dkdv_sm80<T, D>(const BackwardParams&, cudaStream_t, const float*, \
                                                float*);                                           \
  template void launch_backward_finish<T, D>(const BackwardParams&, cudaStream_t, const float*,    \
                                             const float*, DqPasses);                              \
  template void launch_append_kv<T, D>(const AppendParams&, cudaStream_t);

}  // namespace hk_flash
