// flash_attn/launch_sm90.cuh — internal: the Hopper forward's and backward's launchers (TMA
// descriptors + launch), included by the inst/sm90_*.cu files. The tensor maps are encoded on the
// host for every call (a few microseconds, no device work, no synchronisation: capture-safe)
// through the driver entry point, so kernels need not link libcuda.
#pragma once

#include <cudaTypedefs.h>

#include "flash_attn/bwd_sm90.cuh"
#include "flash_attn/fwd_sm90.cuh"
#include "flash_attn/launch.h"

namespace hk_flash {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A 5-D map over [B, rows, H, D] with D split in 64-column blocks (innermost first: 64 columns,
// rows, column blocks 128 bytes apart, H, B) and boxes of 64 × box_rows × D/64: one copy brings a
// whole tile, its column blocks one after the other in shared memory (box_rows × 128 bytes
// each, the 128-byte swizzle's 64-column layout the kernels read), instead of one copy a block.
// box_col_blocks < D/64: boxes of fewer column blocks (the forward's O stores, one a block).
template <class T>
CUtensorMap make_tile_map(const void* data, int rows, int heads, int batch, int head_dim,
                          const Strides& st, int box_rows, int box_col_blocks = 0) {
  CUtensorMap map;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(st.row) * sizeof(T);
  // A dimension of size 1 is never stepped over; give it a stride TMA accepts.
  const cuuint64_t head_bytes =
      heads > 1 ? static_cast<cuuint64_t>(st.head) * sizeof(T) : row_bytes * rows;
  const cuuint64_t batch_bytes =
      batch > 1 ? static_cast<cuuint64_t>(st.batch) * sizeof(T) : head_bytes * heads;
  const cuuint64_t dims[5] = {64, static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(head_dim / 64),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[4] = {row_bytes, 128, head_bytes, batch_bytes};
  const cuuint32_t box[5] = {
      64, static_cast<cuuint32_t>(box_rows),
      static_cast<cuuint32_t>(box_col_blocks > 0 ? box_col_blocks : head_dim / 64), 1, 1};
  const cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<T, __nv_bfloat16>
                                       ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r =
      tensor_map_encoder()(&map, type, 5, const_cast<void*>(data), dims, strides, box, elem,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw DeviceError("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r));
  return map;
}

// block_order's section (fwd_sm90.cuh): as many GQA groups as leave their K and V in half of L2
// (the other half for the Q and O streams), at least one group. HK_FLASH_FWD_SECTION=N forces N
// heads (1: every position of one head, then the next head — the order before sections, for A/Bs).
int forward_heads_per_section(const Params& p, int head_row_bytes);
// Whether the forward may store O by TMA: out 16-byte aligned with strides of 8 elements, and
// HK_FLASH_FWD_O not "direct" (stores from registers, for A/Bs).
bool forward_out_by_tma(const Params& p);
// v4's and v5's grid: the SM count, or HK_FLASH_FWD_V4_BLOCKS=N blocks (tests: many query tiles
// a block).
int forward_stream_blocks(const Params& p);
// Whether v4 / v5 take their jobs in pairs of m-blocks (fwd_sm90.cuh): v5 does, v4 keeps the snake
// it was measured with; HK_FLASH_FWD_STREAM_ORDER=pairs|snake forces one for both.
bool forward_stream_pairs(bool producer_warpgroup);
// The backward's section (bwd_sm90.cuh): the most kv heads whose GQA groups' Q, dO and f32 dq
// accumulator rows fill at most 3/4 of L2 and whose modelled schedule ends within 2 % of one
// section's (block_schedule.h), at least one. HK_FLASH_BWD_SECTION=N forces
// N kv heads (N ≥ batch × kv heads: every head in one section, key-position-major — the order
// before sections, for A/Bs).
int backward_heads_per_section(const BackwardParams& p);

template <class T, int D, bool kProducerWg, int kTiles>
void launch_forward_sm90_layout(const Params& p, cudaStream_t stream) {
  using Cfg = Sm90Config<D, kProducerWg, kTiles>;
  Sm90Maps maps;
  maps.q = make_tile_map<T>(p.q, p.seqlen_q, p.heads_q, p.batch, D, p.q_strides, Cfg::kBlockM);
  maps.k = make_tile_map<T>(p.k, p.seqlen_k, p.heads_kv, p.batch, D, p.k_strides, Cfg::kBlockN);
  maps.v = make_tile_map<T>(p.v, p.seqlen_k, p.heads_kv, p.batch, D, p.v_strides, Cfg::kBlockN);
  // O through shared memory and TMA stores where out is a TMA target
  maps.o_by_tma = forward_out_by_tma(p);
  if (maps.o_by_tma)
    maps.o = make_tile_map<T>(p.out, p.seqlen_q, p.heads_q, p.batch, D, p.out_strides,
                              Cfg::kBlockM / 2, 1);
  auto kernel = flash_fwd_sm90_kernel<T, D, kProducerWg, kTiles>;
  allow_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmem);
  const int m_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int positions = Cfg::positions(m_blocks);
  const int heads = p.heads_q * p.batch;
  // v4, v5: one block an SM (or fewer), each taking jobs of each round of the order
  // (stream_jobs.h) — more blocks where a block's jobs would overflow its job table
  if (kTiles == 0 && (p.heads_q >= 65536 || p.batch >= 65536 || p.seqlen_k / Cfg::kBlockN >= 65535))
    throw std::invalid_argument(
        "HK_FLASH_SM90_FWD=v4 and v5 pack heads, batch and key blocks in 16 bits each; this call "
        "exceeds that: use v2 (unset HK_FLASH_SM90_FWD)");
  const bool pairs = kTiles == 0 && forward_stream_pairs(kProducerWg);
  const unsigned blocks =
      kTiles == 0 ? static_cast<unsigned>(stream_grid(pairs, m_blocks, heads, Cfg::kJobTable,
                                                      forward_stream_blocks(p)))
                  : static_cast<unsigned>(static_cast<int64_t>(positions) * heads);
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmem, stream>>>(
      p, maps, forward_heads_per_section(p, D * static_cast<int>(sizeof(T))), pairs ? 1 : 0);
  check_cuda(cudaGetLastError(), kProducerWg && kTiles == 0 ? "flash forward (sm90 v5) launch"
                                 : kProducerWg              ? "flash forward (sm90 v1) launch"
                                 : kTiles == 2              ? "flash forward (sm90 v3) launch"
                                 : kTiles == 0              ? "flash forward (sm90 v4) launch"
                                                            : "flash forward (sm90 v2) launch");
}

template <class T, int D>
bool launch_forward_sm90(const Params& p, cudaStream_t stream, Sm90Forward layout) {
#if HK_FLASH_HAVE_SM90A
  if (layout == Sm90Forward::kTwoWarpgroups)
    launch_forward_sm90_layout<T, D, false, 1>(p, stream);
  else if (layout == Sm90Forward::kTwoWarpgroupsPaired)
    launch_forward_sm90_layout<T, D, false, 2>(p, stream);
  else if (layout == Sm90Forward::kStreaming)
    launch_forward_sm90_layout<T, D, false, 0>(p, stream);
  else if (layout == Sm90Forward::kProducerStreaming)
    launch_forward_sm90_layout<T, D, true, 0>(p, stream);
  else
    launch_forward_sm90_layout<T, D, true, 1>(p, stream);
  return true;
#else
  (void)p;
  (void)stream;
  (void)layout;
  return false;
#endif
}

template <class T, int D>
bool launch_backward_dkdv_sm90(const BackwardParams& p, cudaStream_t stream, const float* di,
                               float* dq_accum, Sm90BwdDq form) {
#if HK_FLASH_HAVE_SM90A
  using Cfg = Sm90BwdConfig<D>;
  Sm90BwdMaps maps;
  maps.q = make_tile_map<T>(p.q, p.seqlen_q, p.heads_q, p.batch, D, p.q_strides, Cfg::kBlockM);
  maps.dout =
      make_tile_map<T>(p.dout, p.seqlen_q, p.heads_q, p.batch, D, p.dout_strides, Cfg::kBlockM);
  maps.k = make_tile_map<T>(p.k, p.seqlen_k, p.heads_kv, p.batch, D, p.k_strides, Cfg::kBlockN);
  maps.v = make_tile_map<T>(p.v, p.seqlen_k, p.heads_kv, p.batch, D, p.v_strides, Cfg::kBlockN);
  // 0: no dq (deterministic), 1: atomics into rows, 2 / 3: bulk reduce-adds into the tiled
  // accumulator, a warpgroup's or a warp's at a time (3 is also the dQ warpgroup form's layout)
  const int dq_mode = dq_accum == nullptr                   ? 0
                      : form == Sm90BwdDq::kAtomic          ? 1
                      : form == Sm90BwdDq::kReduceWarpgroup ? 2
                                                            : 3;
  const bool dq_warpgroup = dq_accum != nullptr && form == Sm90BwdDq::kDqWarpgroup;
  const bool cap = p.softcap > 0.0f;  // as score_map decides
  auto kernel = dq_warpgroup ? (cap ? flash_bwd_dkdv_sm90_kernel<T, D, true, true>
                                    : flash_bwd_dkdv_sm90_kernel<T, D, false, true>)
                             : (cap ? flash_bwd_dkdv_sm90_kernel<T, D, true, false>
                                    : flash_bwd_dkdv_sm90_kernel<T, D, false, false>);
  allow_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmem);
  const unsigned blocks = static_cast<unsigned>(p.heads_kv) * p.batch *
                          ((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN);
  const int threads = dq_warpgroup ? Cfg::kThreadsDqWg : Cfg::kThreads;
  kernel<<<blocks, threads, Cfg::kSmem, stream>>>(p, maps, di, dq_accum, dq_mode,
                                                  backward_heads_per_section(p));
  check_cuda(cudaGetLastError(), dq_warpgroup ? "flash backward dk/dv (sm90, dQ warpgroup) launch"
                                              : "flash backward dk/dv (sm90) launch");
  return true;
#else
  (void)p;
  (void)stream;
  (void)di;
  (void)dq_accum;
  (void)form;
  return false;
#endif
}

#define HK_FLASH_INSTANTIATE_SM90(T, D)                                                            \
  template bool launch_forward_sm90<T, D>(const Params&, cudaStream_t, Sm90Forward);               \
  template bool launch_backward_dkdv_sm90<T, D>(const BackwardParams&, cudaStream_t, const float*, \
                                                float*, Sm90BwdDq);

}  // namespace hk_flash
