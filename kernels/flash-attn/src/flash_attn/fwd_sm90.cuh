// flash_attn/fwd_sm90.cuh — the Hopper flash-attention forward (FA3-class): TMA, wgmma,
// warp specialisation, two consumer warpgroups in ping-pong, intra-warpgroup GEMM/softmax overlap.
//
// A block of 3 warpgroups owns 128 query rows of one head:
//   - warpgroup 0, the producer, drops to 24 registers (setmaxnreg); one thread issues TMA bulk
//     tensor copies of the Q tile and of each K and V tile (kStages deep), every copy completing
//     on the tile's "full" mbarrier; it waits on the tile's "empty" mbarrier before reusing a
//     stage.
//   - warpgroups 1 and 2, the consumers, rise to 240 registers and take 64 rows each. S = Q·Kᵀ is
//     one wgmma chain with both operands in shared memory (the 128-byte swizzle TMA wrote); P stays
//     in registers as the A operand of O += P·V (V as the transposed B operand). Within a
//     warpgroup the S of tile n+1 is issued before the P·V of tile n, so the tensor cores work
//     while the softmax runs; across warpgroups two named barriers hand the tensor cores back and
//     forth (ping-pong), so one warpgroup's softmax overlaps the other's GEMMs.
// Masks (causal, window, key_start, sequence end), softcap and lse follow fwd_sm80.cuh exactly.
// Not here: varlen, split-KV decode, head dim 256 (the sm80 kernels serve them).
#pragma once

#include "flash_attn/device_common.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace hk_flash {

// 128 query rows (two consumer warpgroups of 64), 128-key tiles, three stages deep at head dim
// 64 and two at 128 (shared memory). At head dim 128 a consumer thread holds S (64 floats), O (64)
// and P (32 words) while both GEMMs run; ptxas then spills a little and serialises some wgmma
// (C7512) — measured and kept, because 64- and 96-key tiles, which fit, gave wrong results on the
// H200 (2026-12-01; cause not found, see docs/performance.md).
template <int D>
struct Sm90Config {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = D <= 64 ? 3 : 2;
  static constexpr int kThreads = 384;
  static constexpr int kColBlocks = D / 64;                 // 64-column TMA boxes
  static constexpr uint32_t kQBox = 128 * 128;              // 128 rows × 128 bytes
  static constexpr uint32_t kKVBox = kBlockN * 128;         // kBlockN rows × 128 bytes
  static constexpr uint32_t kQTile = kColBlocks * kQBox;    // the Q tile
  static constexpr uint32_t kKVTile = kColBlocks * kKVBox;  // a K or V tile
  static_assert(kKVBox % 1024 == 0, "swizzle atoms need 1024-byte aligned boxes");
  static constexpr uint32_t kSmem =
      kQTile + 2 * kStages * kKVTile + 1024 /* barriers */ + 1024 /* alignment */;
};

struct Sm90Maps {
  CUtensorMap q, k, v;
};

template <class T, int D>
__global__ void __launch_bounds__(384, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ Params p, const __grid_constant__ Sm90Maps maps) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Sm90Config<D>;
  using namespace hk::sdk::cuda::sm90;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr uint32_t kQTile = Cfg::kQTile, kQBox = Cfg::kQBox;
  constexpr uint32_t kTile = Cfg::kKVTile, kBox = Cfg::kKVBox;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024 B
  const uint32_t s_q = base;
  const uint32_t s_k = s_q + kTile;              // [kStages] K tiles
  const uint32_t s_v = s_k + kStages * kTile;    // [kStages] V tiles
  const uint32_t s_bar = s_v + kStages * kTile;  // mbarriers (8 bytes each)
  const uint32_t bar_q = s_bar;
  auto bar_full_k = [&](int s) { return s_bar + 8 * (1 + s); };
  auto bar_full_v = [&](int s) { return s_bar + 8 * (1 + kStages + s); };
  auto bar_empty_k = [&](int s) { return s_bar + 8 * (1 + 2 * kStages + s); };
  auto bar_empty_v = [&](int s) { return s_bar + 8 * (1 + 3 * kStages + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // 0 producer, 1-2 consumers
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int m_block = m_blocks - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.heads_q / p.heads_kv);
  const SeqInfo seq = seq_info(p, b);
  const int m0 = m_block * kBlockM;
  const int valid_rows = min(kBlockM, seq.S - m0);
  if (valid_rows <= 0) return;  // the whole block: before any barrier exists

  // key tiles any row of the block sees
  const KeyRange first = key_range(p, seq, m0);
  const KeyRange last = key_range(p, seq, m0 + valid_rows - 1);
  const int n_lo = first.lo / kBlockN;
  const int n_hi = last.hi > first.lo ? (last.hi + kBlockN - 1) / kBlockN : n_lo;
  const int n_iters = n_hi - n_lo;

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full_k(s), 1);
      mbar_init(bar_full_v(s), 1);
      mbar_init(bar_empty_k(s), 256);
      mbar_init(bar_empty_v(s), 256);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    regs_decrease<24>();
    if (tid == 0 && n_iters > 0) {  // no keys: no copies (none may land after the block exits)
      prefetch_tma(&maps.q);
      prefetch_tma(&maps.k);
      prefetch_tma(&maps.v);
      mbar_expect_tx(bar_q, kQTile);
      for (int c = 0; c < Cfg::kColBlocks; ++c)
        tma_load_4d(s_q + c * kQBox, &maps.q, bar_q, c * 64, m0, h, b);
      for (int it = 0; it < n_iters; ++it) {
        const int n_block = n_hi - 1 - it;
        const int stage = it % kStages;
        const uint32_t parity = ((it / kStages) & 1) ^ 1;
        mbar_wait(bar_empty_k(stage), parity);
        mbar_expect_tx(bar_full_k(stage), kTile);
        for (int c = 0; c < Cfg::kColBlocks; ++c)
          tma_load_4d(s_k + stage * kTile + c * kBox, &maps.k, bar_full_k(stage), c * 64,
                      n_block * kBlockN, hk, b);
        mbar_wait(bar_empty_v(stage), parity);
        mbar_expect_tx(bar_full_v(stage), kTile);
        for (int c = 0; c < Cfg::kColBlocks; ++c)
          tma_load_4d(s_v + stage * kTile + c * kBox, &maps.v, bar_full_v(stage), c * 64,
                      n_block * kBlockN, hk, b);
      }
    }
  } else {
    // ---------------- consumers ----------------
    regs_increase<240>();
    const int cw = wg - 1;            // consumer warpgroup 0 / 1: rows [64·cw, 64·cw + 64)
    const int ltid = tid - 128 * wg;  // thread within the warpgroup
    const int warp_in_wg = ltid / 32, lane = ltid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const float scale = p.scale != 0.0f ? p.scale : rsqrtf(static_cast<float>(D));
    const ScoreMap smap = score_map(p, scale);
    const int wg_row0 = 64 * cw;                     // within the block
    const int wg_rows_valid = valid_rows - wg_row0;  // may be ≤ 0 (nothing to write)

    KeyRange rng[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      rng[r] = key_range(p, seq, m0 + min(wg_row0 + warp_in_wg * 16 + g + 8 * r, valid_rows - 1));
    const KeyRange wg_first = key_range(p, seq, m0 + min(wg_row0, valid_rows - 1));
    const KeyRange wg_last = key_range(p, seq, m0 + min(wg_row0 + 63, valid_rows - 1));

    constexpr int kNS = kBlockN / 2;  // S accumulator floats per thread (64 rows × 128 keys)
    constexpr int kNO = D / 2;        // O accumulator floats per thread
    float o[kNO];
#pragma unroll
    for (int i = 0; i < kNO; ++i) o[i] = 0.0f;
    float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.0f, 0.0f};
    uint32_t pa[kBlockN / 16][4];  // P as wgmma A fragments, one set per 16 keys
    // P stays live (in its registers) until the P·V that reads it has completed
    auto fence_pa = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_regs_u32(pa[kk][e]);
    };

    // scheduler barriers 1 (consumer 0's turn) and 2 (consumer 1's turn)
    const int my_bar = 1 + cw, other_bar = 2 - cw;
    int turns_left = n_iters;
    auto take_turn = [&] { named_sync(my_bar, 256); };
    auto pass_turn = [&] {
      --turns_left;
      if (cw == 0 || turns_left > 0) named_arrive(other_bar, 256);
    };
    if (cw == 0 && n_iters > 0) named_arrive(my_bar, 256);  // consumer 0 starts

    auto issue_s = [&](float(&s)[kNS], int stage) {
      const uint32_t k_tile = s_k + stage * kTile;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t within = (kk % 4) * 32;
        const uint64_t da = make_desc(s_q + (kk / 4) * kQBox + within + wg_row0 * 128, 16, 1024);
        const uint64_t db = make_desc(k_tile + (kk / 4) * kBox + within, 16, 1024);
        wgmma_ss<kBlockN, T>(s, da, db, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int stage) {
      const uint32_t v_tile = s_v + stage * kTile;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t db = make_desc(v_tile + kk * 16 * 128, kBox, 1024);
        wgmma_rs<D, T>(o, pa[kk], db);
      }
      wgmma_commit();
    };
    // Softcaps and masks S, then exponentiates it in place (the scale inside exp2: one FFMA per
    // element); returns the per-row rescale factors.
    const float sl2 = smap.scale_log2;
    auto softmax = [&](float(&s)[kNS], int n_block, float(&alpha)[2]) {
      const int key0 = n_block * kBlockN;
      if (smap.softcap()) {
#pragma unroll
        for (int i = 0; i < kNS; ++i) s[i] = smap.cap(s[i]);
      }
      if (key0 + kBlockN > wg_first.hi || key0 < wg_last.lo) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 8 * j + 2 * t4 + (e & 1);
            const KeyRange& kr = rng[e >> 1];
            if (key < kr.lo || key >= kr.hi) s[4 * j + e] = -INFINITY;
          }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
          mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
        mx = quad_max(mx) * sl2;
        const float m_new = fmaxf(m_row[r], mx);
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = fast_exp2(m_row[r] - m_ref);
        m_row[r] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
          s[4 * j + 2 * r] = fast_exp2(fmaf(s[4 * j + 2 * r], sl2, -m_ref));
          s[4 * j + 2 * r + 1] = fast_exp2(fmaf(s[4 * j + 2 * r + 1], sl2, -m_ref));
          sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
        }
        l_row[r] = l_row[r] * alpha[r] + sum;
      }
    };
    auto to_pa = [&](const float(&s)[kNS]) {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };

    if (n_iters > 0) {
      mbar_wait(bar_q, 0);
      float s[kNS];
      // first tile: S only
      mbar_wait(bar_full_k(0), 0);
      take_turn();
      issue_s(s, 0);
      pass_turn();
      wgmma_wait<0>();
      fence_regs(s);
      mbar_arrive(bar_empty_k(0));
      {
        float alpha[2];
        softmax(s, n_hi - 1, alpha);
      }
      to_pa(s);
      for (int it = 1; it < n_iters; ++it) {
        const int stage = it % kStages, prev = (it - 1) % kStages;
        const uint32_t parity = (it / kStages) & 1, prev_parity = ((it - 1) / kStages) & 1;
        mbar_wait(bar_full_k(stage), parity);
        take_turn();
        issue_s(s, stage);
        mbar_wait(bar_full_v(prev), prev_parity);
        issue_pv(prev);
        pass_turn();
        wgmma_wait<1>();  // S done, P·V may still run
        fence_regs(s);
        mbar_arrive(bar_empty_k(stage));
        float alpha[2];
        softmax(s, n_hi - 1 - it, alpha);
        wgmma_wait<0>();  // P·V done: O and the old P may be touched again
        fence_regs(o);
        fence_pa();
        mbar_arrive(bar_empty_v(prev));
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          o[4 * j + 0] *= alpha[0];
          o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1];
          o[4 * j + 3] *= alpha[1];
        }
        to_pa(s);
      }
      const int last_stage = (n_iters - 1) % kStages;
      mbar_wait(bar_full_v(last_stage), ((n_iters - 1) / kStages) & 1);
      issue_pv(last_stage);
      wgmma_wait<0>();
      fence_regs(o);
      fence_pa();
      mbar_arrive(bar_empty_v(last_stage));
    }

    // epilogue: O / l, lse
#pragma unroll
    for (int r = 0; r < 2; ++r) l_row[r] = quad_sum(l_row[r]);
    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp_in_wg * 16 + g + 8 * r;  // within the warpgroup
      if (row >= wg_rows_valid) continue;
      const int s_idx = m0 + wg_row0 + row;
      const float inv = l_row[r] > 0.0f ? 1.0f / l_row[r] : 0.0f;
      T* dst = out + row_offset(p.out_strides, b, seq.q_row0, s_idx, h);
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) =
            pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      if (p.lse != nullptr && t4 == 0)
        p.lse[lse_offset(p, b, seq.q_row0, s_idx, h)] =
            l_row[r] > 0.0f ? (m_row[r] + __log2f(l_row[r])) * kLn2 : INFINITY;
    }
  }  // consumers
#endif
}

}  // namespace hk_flash
