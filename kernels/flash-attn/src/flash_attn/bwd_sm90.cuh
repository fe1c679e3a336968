// flash_attn/bwd_sm90.cuh — the Hopper flash-attention backward's dK/dV (+ dQ) kernel (the FA3
// algorithm on TMA + wgmma); api.cu launches the Di pre-pass and the dq conversion around it
// (bwd_tiles.cuh: a 64-row tile a block over its tiled dq accumulator; bwd_sm80.cuh's row passes
// for unaligned tensors and atomic dq, and its deterministic dq kernel). Blocks take (kv head, key
// block) in block_order: kv heads in sections sized by backward_heads_per_section (api.cu).
//
// A block of two warpgroups (256 threads, no producer warpgroup: threads 0 and 128 issue the
// copies, so every warp may use 255 registers) owns 128 keys of one kv head, 64 per warpgroup, and
// walks every 64-query tile of every head of its GQA group that can see them (dK/dV summed over
// the group in registers, in a fixed order). K and V arrive once by TMA; Q and dO tiles by TMA
// (one copy a tile: its column blocks in one box) two stages deep (a "full" mbarrier per stage,
// and an "empty" one that all 256 threads arrive on; thread 128 refills a stage two tiles ahead
// once both warpgroups have released it); lse·log2(e) and Di rows go through shared memory by
// ordinary loads one tile ahead. Per tile, for a
// warpgroup's 64 keys (the transposed products keep keys in the accumulator rows, so no
// transposition is needed before dV and dK), in issue order:
//   Sᵀ = K·Qᵀ                          issued at the end of the tile before, behind its dQ (it
//                                      runs while dQ leaves and the loop turns; dQ warpgroup form:
//                                      once the tile's dK and dV are done)
//   dPᵀ = V·dOᵀ                        issued before the exponentials, which it runs under (after
//                                      them under softcap and in the dQ warpgroup form)
//                                      (both: wgmma, operands in shared memory, K-major)
//   Pᵀ = exp2(Sᵀ·scale·log2e − lse),  dSᵀ = Pᵀ∘(dPᵀ − Di) (∘ (1 − tanh²) under softcap), masks
//   dV += Pᵀ·dO, dK += dSᵀ·Q           wgmma, A (Pᵀ, dSᵀ) in registers, B MN-major in shared memory
//   dSᵀ → shared memory (16-bit, 128-byte swizzle) as well, then after one block barrier
//   dQ (64 queries × 64 columns) = dS·K wgmma with both operands MN-major: at head dim 128 each
//     warpgroup takes 64 of the columns over all 128 keys; at 64, all columns over its own keys.
// In the 256-thread kernel dQ leaves in f32 either by one bulk reduce-add a warpgroup (tma) of its
// part staged in shared memory in the order its threads hold it, into an accumulator tiled the same
// way (dq_tiled_index, dq_tiles.h: no swizzle arithmetic, 16-byte stores, one copy), or by one a
// warp of its own 16 rows (HK_FLASH_BWD_DQ=warp: no barrier across the warpgroup), or by
// red.global.add.v2 from registers into the row-major accumulator (HK_FLASH_BWD_DQ=atomic);
// deterministic mode skips it (the sm80 dq kernel runs after).
// The dQ warpgroup form (kDqWg, HK_FLASH_BWD_DQ unset or wg, the default; 384 threads, setmaxnreg
// 216 / 216 / 72): a third warpgroup (bwd_dq_warpgroup) takes dQ over all 128 keys once both main
// warpgroups have stored a tile's dSᵀ (an mbarrier of 256 arrivals; a second hands the buffer
// back), so the main warpgroups lose dQ's GEMM, its stores and the block barrier — each keeps its
// own lse/Di rows — and issue dPᵀ after the exponentials. Masks, softcap, window, key_start and lse
// follow bwd_sm80.cuh. HK_FLASH_TRACE builds stamp each phase's clock (Params::trace; the benchmark
// prints them), a measurement build only. Not here: varlen and KV-cache layouts, head dim 256 (the
// mma.sync backward serves them).
#pragma once

#include "flash_attn/bwd_sm80.cuh"
#include "flash_attn/device_common.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace hk_flash {

template <int D>
struct Sm90BwdConfig {
  static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2, kThreads = 256;
  // the dQ warpgroup form: a third warpgroup takes dQ. setmaxnreg moves registers within the
  // block's own allocation — 384 threads × the 168 that __launch_bounds__(384, 1) gives each —,
  // not the whole file: a split past 3 × 168 leaves a warp's increase waiting for registers that
  // never free, and the block hangs (2 · 224 + 64 would). 216 / 72: ptxas ignores a decrease to
  // 56 around the dQ warpgroup's wgmma (C7507, "minimum register requirements"), and the main
  // warpgroups fit 216 (R0-R213) once their next S waits for dK and dV to finish.
  static constexpr int kThreadsDqWg = 384, kMainRegs = 216, kDqRegs = 72;
  static constexpr int kEntryRegs = (65536 / kThreadsDqWg) & ~7;  // 168
  static_assert(2 * kMainRegs + kDqRegs <= 3 * kEntryRegs,
                "setmaxnreg's split must fit the block's launch allocation");
  static constexpr int kColBlocks = D / 64;                   // 64-column blocks, one TMA box
  static constexpr uint32_t kQBox = kBlockM * 128;            // 64 rows × 128 bytes
  static constexpr uint32_t kKBox = kBlockN * 128;            // 128 rows × 128 bytes
  static constexpr uint32_t kQTile = kColBlocks * kQBox;      // a Q or dO tile
  static constexpr uint32_t kKTile = kColBlocks * kKBox;      // the K or V tile
  static constexpr uint32_t kDsTile = kBlockN * kBlockM * 2;  // dSᵀ [128 keys][64 queries]
  static constexpr uint32_t kDqPart = 64 * 64 * 4;            // a warpgroup's 64 × 64 f32 dQ
  // dQ of a warpgroup: columns [64·cw, +64) over all keys (D 128) or all columns over its keys
  static constexpr int kDqKeys = D == 128 ? kBlockN : kBlockN / 2;
  static constexpr uint32_t kOffK = 0, kOffV = kKTile, kOffQ = 2 * kKTile;
  static constexpr uint32_t kOffDo = kOffQ + kStages * kQTile;
  static constexpr uint32_t kOffDs = kOffDo + kStages * kQTile;
  static constexpr uint32_t kOffDq = kOffDs + 2 * kDsTile;
  // [warpgroup][buffer][lse 64 | Di 64] f32: the 256-thread form uses warpgroup 0's for both
  // (one block barrier a tile), the dQ warpgroup form one set a main warpgroup (no block barrier)
  static constexpr uint32_t kOffRows = kOffDq + 2 * kDqPart;
  static constexpr uint32_t kRowsPerWg = 2 * 2 * kBlockM;  // floats
  static constexpr uint32_t kOffBar = kOffRows + 2 * kRowsPerWg * 4;
  // mbarriers (8 bytes each): K/V, Q/dO full [2], Q/dO empty [2], and the dQ warpgroup form's
  // dSᵀ full [2] (main warpgroups → dQ warpgroup) and dSᵀ empty [2] (back)
  static constexpr uint32_t kBarKv = 0, kBarFull = 1, kBarEmpty = 3, kBarDsFull = 5,
                            kBarDsEmpty = 7, kBars = 9;
  static constexpr uint32_t kSmem = kOffBar + 8 * kBars + 1024 /* alignment */;
  static_assert(D == 64 || D == 128, "the Hopper backward takes head dim 64 or 128");
  static_assert(kQBox % 1024 == 0 && kOffRows % 1024 == 0, "swizzle atoms need 1024-byte tiles");
};

struct Sm90BwdMaps {
  CUtensorMap q, k, v, dout;
};

// A warpgroup's 64 × 64 f32 dQ part, as its threads hold it (thread 32·warp + lane: the wgmma m64
// accumulator), into a 16 KB shared-memory buffer in the tiled accumulator's word order
// (dq_tiles.h): 16-byte stores, consecutive across a warp.
__device__ __forceinline__ void stage_dq_part(uint32_t part, const float (&dq)[32], int warp,
                                              int lane) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    asm volatile(
        "st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(part + dq_tile_word(warp, j, lane) * 16),
        "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
        : "memory");
}
// One warp's 4 KB run of a staged part added to the accumulator by one bulk reduce-add (after the
// warp's stores, fence_proxy_async and __syncwarp; lane 0 issues). `run_start` is the tiled index
// of the run's first element, (row 16·warp of the tile, the part's first column).
__device__ __forceinline__ void send_dq_warp_run(float* run_start, uint32_t part, int warp) {
  hk::sdk::cuda::sm90::bulk_reduce_add_f32(run_start, part + dq_tile_word(warp, 0, 0) * 16,
                                           kDqWordsPerWarp * 16);
  hk::sdk::cuda::sm90::bulk_commit();
}

// The dQ warpgroup of the kDqWg form: per tile, once both main warpgroups' dSᵀ is in shared memory
// (dSᵀ full), dQ = dS·K over the block's 128 keys, 64 columns at a time (32 accumulator registers
// under the warpgroup's 72), each part staged in dq_tiles.h's order into one of two buffers and
// sent by one bulk reduce-add a warp; the dSᵀ buffer goes back (dSᵀ empty) once the tile's last
// part has read it. Tiles come in the main warpgroups' order (heads of the group, then m-blocks).
template <class T, int D>
__device__ __forceinline__ void bwd_dq_warpgroup(const BackwardParams& p, float* dq_accum,
                                                 uint32_t base, int b, int first_head, int m_first,
                                                 int m_blocks, int n_iters) {
  using Cfg = Sm90BwdConfig<D>;
  using namespace hk::sdk::cuda::sm90;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x % 128) / 32;
  int h = first_head, m_block = 0, part = 0;
  for (int it = 0; it < n_iters; ++it) {
    const int buf = it & 1, m0 = (m_first + m_block) * Cfg::kBlockM, head = h;
    if (++m_block == m_blocks) {
      m_block = 0;
      ++h;
    }
    mbar_wait_in_wgmma_region(base + Cfg::kOffBar + 8 * (Cfg::kBarDsFull + buf), (it >> 1) & 1);
    // addresses from an opaque copy of the base (as the main loop's, for the same reason)
    const uint32_t sb = opaque_u32(base);
    const uint64_t ds_mn =
        uniform_desc(make_desc(sb + Cfg::kOffDs + buf * Cfg::kDsTile, Cfg::kDsTile, 1024));
#pragma unroll
    for (int c = 0; c < D / 64; ++c, ++part) {
      // dQ[:, 64c, +64) = dS·K: A = dSᵀ (MN-major, keys as K), B = K's column block c (MN-major)
      const uint64_t k_mn =
          uniform_desc(make_desc(sb + Cfg::kOffK + c * Cfg::kKBox, Cfg::kKBox, 1024));
      float dq[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
        wgmma_ss<64, T, 1, 1>(dq, desc_add(ds_mn, kk * 16 * 128), desc_add(k_mn, kk * 16 * 128),
                              kk > 0 ? 1 : 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);
      if (c == D / 64 - 1) mbar_arrive(base + Cfg::kOffBar + 8 * (Cfg::kBarDsEmpty + buf));
      // staging buffer part % 2, whose last reader (this warp's part before last) must be done
      const uint32_t stage = sb + Cfg::kOffDq + (part & 1) * Cfg::kDqPart;
      if (lane == 0) bulk_wait_read<1>();
      __syncwarp();
      stage_dq_part(stage, dq, warp, lane);
      fence_proxy_async();
      __syncwarp();
      if (lane == 0)
        send_dq_warp_run(dq_accum + dq_tiled_index(p, b, m0 + 16 * warp, head, 64 * c), stage,
                         warp);
    }
  }
  if (lane == 0) bulk_wait_all();
}

// dq_mode: 0 none (deterministic: another kernel computes dq), 1 red.global.add (rows), 2 bulk
// reduce-add a warpgroup, 3 bulk reduce-add a warp (both into the tiled accumulator).
// kCap: softcap (p.softcap > 0) compiled in. A run-time softcap branch kept the tanh derivatives'
// 16 registers reserved on every path; without them the kernel runs 4-5% faster at head dim 128
// (H200, 2026-12-02: 313-412 against 298-393 TF/s).
// kDqWg: the dQ warpgroup form (384 threads; dq_mode is 3's layout, and dq_accum is never null).
template <class T, int D, bool kCap, bool kDqWg>
__global__ void __launch_bounds__(kDqWg ? Sm90BwdConfig<D>::kThreadsDqWg
                                        : Sm90BwdConfig<D>::kThreads,
                                  1)
    flash_bwd_dkdv_sm90_kernel(const __grid_constant__ BackwardParams p,
                               const __grid_constant__ Sm90BwdMaps maps, const float* di,
                               float* dq_accum, int dq_mode, int heads_per_section) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Sm90BwdConfig<D>;
  using namespace hk::sdk::cuda::sm90;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr uint32_t kQBox = Cfg::kQBox, kKBox = Cfg::kKBox, kQTile = Cfg::kQTile;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzle atoms need 1024 B
  const uint32_t s_k = base + Cfg::kOffK, s_v = base + Cfg::kOffV;
  auto s_q = [&](int st) { return base + Cfg::kOffQ + st * kQTile; };
  auto s_do = [&](int st) { return base + Cfg::kOffDo + st * kQTile; };
  auto s_ds = [&](int buf) { return base + Cfg::kOffDs + buf * Cfg::kDsTile; };
  const uint32_t bar_kv = base + Cfg::kOffBar + 8 * Cfg::kBarKv;
  auto bar_full = [&](int st) { return base + Cfg::kOffBar + 8 * (Cfg::kBarFull + st); };
  auto bar_empty = [&](int st) { return base + Cfg::kOffBar + 8 * (Cfg::kBarEmpty + st); };
  auto bar_ds_full = [&](int buf) { return base + Cfg::kOffBar + 8 * (Cfg::kBarDsFull + buf); };
  auto bar_ds_empty = [&](int buf) { return base + Cfg::kOffBar + 8 * (Cfg::kBarDsEmpty + buf); };

  // cw broadcast from lane 0 so the compiler knows it is warp-uniform (the wgmma descriptors
  // derived from it then stay in uniform registers); cw 2 is the dQ warpgroup (kDqWg)
  const int tid = threadIdx.x, cw = __shfl_sync(0xffffffffu, tid / 128, 0), ltid = tid % 128;
  const int warp = ltid / 32, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // who loads lse and Di: warpgroup 0 for both (256 threads), each main warpgroup its own (kDqWg)
  const bool loads_rows = kDqWg ? cw < 2 : tid < 128;
  float* rows = reinterpret_cast<float*>(smem_raw + (base - raw) + Cfg::kOffRows) +
                (kDqWg && cw == 1 ? Cfg::kRowsPerWg : 0);
  // a wait inside the main loops: the dQ warpgroup form's may not trap (mbar_wait_in_wgmma_region)
  auto loop_wait = [&](uint32_t bar, uint32_t parity) {
    if constexpr (kDqWg)
      mbar_wait_in_wgmma_region(bar, parity);
    else
      mbar_wait(bar, parity);
  };
#ifdef HK_FLASH_TRACE
  // tile stamps at it + 1: slot 0 holds the block's life (trace_block), as in the forward
  unsigned long long* const trace_at =
      ltid == 0 && cw < 2 ? trace_row(p, cw, kBwdTracePhases) : nullptr;
#define HK_BWD_STAMP(k) trace_stamp(trace_at, it + 1, kBwdTracePhases, k)
#define HK_BWD_BLOCK(slot) trace_block(trace_at, slot)
  HK_BWD_BLOCK(kTraceSm);
  HK_BWD_BLOCK(kTraceStart);
#else
#define HK_BWD_STAMP(k) \
  do {                  \
  } while (0)
#define HK_BWD_BLOCK(slot) \
  do {                     \
  } while (0)
#endif
  // (kv head, key block): heads in L2-sized sections, heavy (early, causal) key blocks first
  const BlockOrder order =
      block_order(p.heads_kv * p.batch, (p.seqlen_k + kBlockN - 1) / kBlockN, heads_per_section);
  const int hk = order.head % p.heads_kv, b = order.head / p.heads_kv;
  const int n_block = order.x;
  const int group = p.heads_q / p.heads_kv;
  const SeqInfo seq = seq_info(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.T) return;  // the whole block, before any barrier exists
  const float scale = p.scale != 0.0f ? p.scale : rsqrtf(static_cast<float>(D));
  const ScoreMap smap = score_map(p, scale);

  const int2 mrange = query_rows_seeing(p, seq, n0, min(seq.T, n0 + kBlockN));
  const int m_first = mrange.x / kBlockM;
  const int m_blocks = mrange.y > mrange.x ? (mrange.y + kBlockM - 1) / kBlockM - m_first : 0;
  const int n_iters = m_blocks * group;
  auto head_of = [&](int it) { return hk * group + it / m_blocks; };
  auto row0_of = [&](int it) { return (m_first + it % m_blocks) * kBlockM; };
  // threads ltid 0..127 of a loading warpgroup: lse (0..63) or Di (64..127) of row ltid % 64 of
  // tile (h, m0), as loaded: the ·log2e (store_row) waits until the value is needed, so the
  // load's latency stays off the tile's path (applied at once, it stalled warpgroup 0 ~850 cycles
  // a tile on the H200)
  auto load_row = [&](int h, int m0) -> float {
    const int s = m0 + (ltid & 63);
    const float* src = ltid < 64 ? p.lse_in + lse_offset(p, b, seq.q_row0, s, h)
                                 : di + di_offset(p, b, seq.q_row0, s, h);
    // a predicated load into the register holding the fallback: nothing reads it before
    // store_row (a select after the load would wait for it)
    float v = ltid < 64 ? INFINITY : 0.0f;
    asm volatile("{\n.reg .pred p;\nsetp.lt.s32 p, %1, %2;\n@p ld.global.nc.f32 %0, [%3];\n}\n"
                 : "+f"(v)
                 : "r"(s), "r"(seq.S), "l"(src));
    return v;
  };
  auto store_row = [&](int buf, float v) {
    rows[buf * 2 * kBlockM + ltid] = ltid < 64 ? v * kLog2e : v;
  };
  auto issue_qdo = [&](int it, int st) {
    const int h = head_of(it), m0 = row0_of(it);
    mbar_expect_tx(bar_full(st), 2 * kQTile);
    tma_load_5d(s_q(st), &maps.q, bar_full(st), 0, m0, 0, h, b);
    tma_load_5d(s_do(st), &maps.dout, bar_full(st), 0, m0, 0, h, b);
  };

  if (tid == 0) {
    mbar_init(bar_kv, 1);
    for (int st = 0; st < Cfg::kStages; ++st) {
      mbar_init(bar_full(st), 1);
      mbar_init(bar_empty(st), Cfg::kThreads);  // the main warpgroups
      if constexpr (kDqWg) {
        mbar_init(bar_ds_full(st), Cfg::kThreads);  // every main thread's dSᵀ stored
        mbar_init(bar_ds_empty(st), 128);           // the dQ warpgroup has read it
      }
    }
    fence_barrier_init();
  }
  if (n_iters > 0 && loads_rows) store_row(0, load_row(head_of(0), row0_of(0)));
  __syncthreads();
  if (tid == 0 && n_iters > 0) {  // no tiles: no copies (none may land after the block exits)
    prefetch_tma(&maps.q);
    prefetch_tma(&maps.dout);
    mbar_expect_tx(bar_kv, 2 * Cfg::kKTile);
    tma_load_5d(s_k, &maps.k, bar_kv, 0, n0, 0, hk, b);
    tma_load_5d(s_v, &maps.v, bar_kv, 0, n0, 0, hk, b);
    issue_qdo(0, 0);
    if (n_iters > 1) issue_qdo(1, 1);
  }

  if constexpr (kDqWg) {
    // the waits before the loops keep mbar_wait's trap: outside the setmaxnreg regions it costs
    // nothing (inside, mbar_wait_in_wgmma_region). The dQ warpgroup needs only K before its loop
    // (a wait there for Q's first stage could meet that stage's third phase, of the same parity)
    if (n_iters > 0) mbar_wait(bar_kv, 0);
    if (cw == 2) {
      regs_decrease<Cfg::kDqRegs>();
      bwd_dq_warpgroup<T, D>(p, dq_accum, base, b, hk * group, m_first, m_blocks, n_iters);
      return;
    }
    if (n_iters > 0) mbar_wait(bar_full(0), 0);
    regs_increase<Cfg::kMainRegs>();
  }
  const int key_row0 = 64 * cw + 16 * warp + g;  // this thread's first key row (and + 8)
  const int dq_col0 = D == 128 ? 64 * cw : 0;
  const int dq_key0 = D == 128 ? 0 : 64 * cw;
  // whether this thread issues (and waits for) bulk reduce-adds of dQ: its warpgroup's first
  // (dq_mode 2) or its warp's (3); none in the other modes
  auto dq_issuer = [&] { return dq_mode >= 2 && (dq_mode == 3 ? lane : ltid) == 0; };
  const float sl2 = smap.scale_log2;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;
  // A warpgroup's 64 keys × 64 queries over the head dim (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ): one wgmma
  // chain with both operands K-major in shared memory, committed as one group.
  auto keys_by_queries = [&](float(&acc)[32], uint64_t keys, uint64_t queries) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t within = (kk % 4) * 32;
      const uint64_t da = desc_add(keys, (kk / 4) * kKBox + within);
      const uint64_t db = desc_add(queries, (kk / 4) * kQBox + within);
      wgmma_ss<64, T>(acc, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // Sᵀ = K·Qᵀ (64 keys × 64 queries) of the tile in `stage`, both operands K-major in shared
  // memory, issued at the end of the tile before (once its dK and dV are done, behind its dQ —
  // the dQ warpgroup form has none), so it runs while dQ leaves and the loop turns; the last tile
  // issues one more, unread, over its own stage, so every iteration ends with one S in flight
  // (H200, 2026-12-03: with dP below, the backward +3-7% over S issued at its tile's start;
  // 2026-12-04: behind dQ instead of after it, +1-3%; dP issued behind it too measured 2% slower,
  // branch bwd-early-dp). Addresses from an opaque copy of the base, so the compiler rebuilds the
  // wgmma descriptors where they are used instead of holding dozens of them in registers.
  float s[32];
  auto issue_s = [&](int stage) {
    const uint32_t sb = opaque_u32(base);
    keys_by_queries(s, uniform_desc(make_desc(sb + Cfg::kOffK + 64 * cw * 128, 16, 1024)),
                    uniform_desc(make_desc(sb + Cfg::kOffQ + stage * kQTile, 16, 1024)));
  };
  if (n_iters > 0) {
    if constexpr (!kDqWg) {
      mbar_wait(bar_kv, 0);
      mbar_wait(bar_full(0), 0);
    }
    issue_s(0);
    HK_BWD_BLOCK(kTraceFirstS);
  }

  // the coming tile's head and m-block, kept by increments (head_of / row0_of divide)
  int next_h = hk * group, next_m = 0;
  // thread 128 found the stage it released not yet free (the other warpgroup still reading it)
  // and refills it at the next tile's start instead of waiting
  bool refill_pending = false;
  for (int it = 0; it < n_iters; ++it) {
    HK_BWD_STAMP(0);
    const int st = it & 1;
    const uint32_t phase = (it >> 1) & 1;
    const int h = next_h, m0 = (m_first + next_m) * kBlockM;
    if (++next_m == m_blocks) {
      next_m = 0;
      ++next_h;
    }
    const bool more = it + 1 < n_iters;
    float next_row = 0.0f;  // lse / Di of the next tile, stored once this tile's S is in
    if (more && loads_rows) next_row = load_row(next_h, (m_first + next_m) * kBlockM);
    if (refill_pending) {  // (only thread 128 sets it) tile it + 1 into stage st ^ 1
      loop_wait(bar_empty(st ^ 1), ((it - 1) >> 1) & 1);
      issue_qdo(it + 1, st ^ 1);
      refill_pending = false;
    }
    HK_BWD_STAMP(1);

    // Shared-memory addresses from an opaque copy of the base, so the compiler rebuilds the wgmma
    // descriptors in each iteration instead of holding dozens of them in registers.
    const uint32_t sb = opaque_u32(base);
    const uint32_t k_it = sb + Cfg::kOffK, v_it = sb + Cfg::kOffV;
    const uint32_t q_it = sb + Cfg::kOffQ + st * kQTile, do_it = sb + Cfg::kOffDo + st * kQTile;
    const uint32_t dq_it = sb + Cfg::kOffDq + cw * Cfg::kDqPart;
    // wgmma descriptor bases, warp-uniform (each wgmma of a chain adds a constant to one)
    const uint64_t v_kmaj = uniform_desc(make_desc(v_it + 64 * cw * 128, 16, 1024));
    const uint64_t do_kmaj = uniform_desc(make_desc(do_it, 16, 1024));
    const uint64_t q_mn = uniform_desc(make_desc(q_it, kQBox, 1024));
    const uint64_t do_mn = uniform_desc(make_desc(do_it, kQBox, 1024));
    // dPᵀ = V·dOᵀ (as S), issued before the exponentials so it runs under them — but after them
    // under softcap, whose tanh derivatives would hold 16 more registers beside dP's 32 (ptxas
    // spilled 44 bytes), and in the dQ warpgroup form, where every form of it before them that
    // was tried made ptxas serialise the wgmma (C7514) in the main warpgroups' setmaxnreg region
    constexpr bool kDpLate = kCap || kDqWg;
    float dp[32];
    if constexpr (!kDpLate) {
      keys_by_queries(dp, v_kmaj, do_kmaj);
      wgmma_wait<1>();  // S done
    } else {
      wgmma_wait<0>();
    }
    fence_regs(s);
    HK_BWD_STAMP(2);

    // Pᵀ = exp2(Sᵀ·scale·log2e − lse) (masks and softcap branch once per tile; hi is smallest for
    // the tile's first query, lo largest for its last), packed at once to the A fragments of dV
    // (one set per 16 queries) so S's registers are free while dP is computed. Under softcap the
    // tanh derivative 1 − tanh² is packed beside it (0 where P is 0).
    const float* lse_rows = rows + st * 2 * kBlockM;
    const float* di_rows = lse_rows + kBlockM;
    const bool need_mask = n0 + kBlockN > key_range(p, seq, m0).hi ||
                           n0 < key_range(p, seq, min(m0 + kBlockM, seq.S) - 1).lo;
    uint32_t pa[4][4], cap_grad[4][4];
    auto probabilities = [&](auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
      // elements (4j + 2r, +1) make one A-fragment word: packed as soon as both exist, so no
      // float copy of Pᵀ or of the tanh derivative outlives its pair
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 lse2 = *reinterpret_cast<const float2*>(lse_rows + 8 * j + 2 * t4);
        KeyRange kr[2] = {{0, 0}, {0, 0}};
        if constexpr (kMask) {
#pragma unroll
          for (int e = 0; e < 2; ++e)
            kr[e] = key_range(p, seq, min(m0 + 8 * j + 2 * t4 + e, seq.S - 1));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float pr[2];
          [[maybe_unused]] float cg[2];  // the softcap gradient factors (kCap only)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[4 * j + 2 * r + e];
            if constexpr (kCap) x = smap.cap(x);
            if constexpr (kMask) {
              const int key = n0 + key_row0 + 8 * r;
              if (key < kr[e].lo || key >= kr[e].hi) x = -INFINITY;
            }
            pr[e] = fast_exp2(fmaf(x, sl2, -(e ? lse2.y : lse2.x)));
            if constexpr (kCap) {
              const float th = x / smap.cap_out;
              cg[e] = pr[e] > 0.0f ? 1.0f - th * th : 0.0f;
            }
          }
          pa[j / 2][2 * (j & 1) + r] = pack2<T>(pr[0], pr[1]);
          if constexpr (kCap) cap_grad[j / 2][2 * (j & 1) + r] = pack2<T>(cg[0], cg[1]);
        }
      }
    };
    need_mask ? probabilities(std::true_type{}) : probabilities(std::false_type{});
    HK_BWD_STAMP(3);

    if constexpr (kDpLate) keys_by_queries(dp, v_kmaj, do_kmaj);
    // dV += Pᵀ·dO (A: Pᵀ in registers; B: dO MN-major, 16 queries a step)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<D, T>(dv, pa[kk], desc_add(do_mn, kk * 16 * 128));
    wgmma_commit();
    wgmma_wait<1>();  // dP done; dV may still run (P's registers stay untouched)
    fence_regs(dp);
    HK_BWD_STAMP(4);

    // dSᵀ = Pᵀ∘(dPᵀ − Di) (∘ (1 − tanh²)) as 16-bit values: kept in registers as the A fragments
    // of dK (the layout of Pᵀ's), and stored to shared [key][query] (128-byte rows, the swizzle
    // TMA would write; conflict-free) as the MN-major A operand of dQ
    const uint32_t ds_buf = sb + Cfg::kOffDs + (it & 1) * Cfg::kDsTile;
    const uint64_t ds_mn = uniform_desc(make_desc(ds_buf, Cfg::kDsTile, 1024));
    const uint64_t k_mn = uniform_desc(make_desc(k_it + (dq_col0 / 64) * kKBox, kKBox, 1024));
    uint32_t dsa[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 dd = *reinterpret_cast<const float2*>(di_rows + 8 * j + 2 * t4);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * j + 2 * r;
        const uint32_t pw = pa[j / 2][2 * (j & 1) + r];  // P of elements i, i + 1
        const float2 pr = unpack2<T>(pw);
        float d0 = pr.x * (dp[i] - dd.x), d1 = pr.y * (dp[i + 1] - dd.y);
        if constexpr (kCap) {
          const float2 c = unpack2<T>(cap_grad[j / 2][2 * (j & 1) + r]);
          d0 *= c.x;
          d1 *= c.y;
        }
        dsa[j / 2][2 * (j & 1) + r] = pack2<T>(d0, d1);
      }
    }
    // dQ warpgroup form: this dSᵀ buffer's last tile (it − 2) must have been read by the dQ
    // warpgroup (phase (it − 2) / 2 of dSᵀ empty)
    if constexpr (kDqWg)
      if (it >= 2) loop_wait(bar_ds_empty(it & 1), ((it >> 1) - 1) & 1);
    {
      // a thread's 16 words are sixteen 8×8 matrices (8 keys × 8 queries) in the layout stmatrix
      // takes: four stores of four (lane 8m + i gives row i of matrix m) instead of 16 st.shared
      // (on the H200 the dS phase went from ~800 to ~570 cycles a tile)
      const int mat = lane >> 3, row = lane & 7;
      const int key = 64 * cw + 16 * warp + 8 * (mat & 1) + row;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t at = ds_buf + key * 128 + (((2 * q + (mat >> 1)) ^ row) << 4);
        stmatrix_x4(at, dsa[q][0], dsa[q][1], dsa[q][2], dsa[q][3]);
      }
    }
    HK_BWD_STAMP(5);
    // dK += dSᵀ·Q (A: dSᵀ from registers; B: Q MN-major), issued before the block barrier: it
    // needs no other thread's dSᵀ, and reading A from registers spares shared-memory bandwidth,
    // which the tile's other GEMMs and copies use up. Issued after the stores that read dSᵀ's
    // registers: the PTX ISA makes any access to a wgmma's A registers before its wait_group
    // undefined (reads included), so nothing but dK itself touches them until dK is done
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<D, T>(dk, dsa[kk], desc_add(q_mn, kk * 16 * 128));
    wgmma_commit();
    fence_proxy_async();
    if (more && loads_rows) store_row(st ^ 1, next_row);

    // The next tile's S (the last tile: one over its own stage, unread), and this tile's end:
    // dK and dV done, so their register operands and this stage's Q and dO are free — thread 128
    // refills the stage with tile it + 2 if the other warpgroup has released it too, else at the
    // next tile's start (a thread waiting here held its warpgroup's next GEMMs back by the other
    // warpgroup's: ~900 cycles a tile on the H200)
    auto issue_next_s = [&] {
      loop_wait(bar_full(more ? st ^ 1 : st), more ? ((it + 1) >> 1) & 1 : phase);
      issue_s(more ? st ^ 1 : st);
    };
    auto release_stage = [&] {
      fence_regs(dk);
      fence_regs(dv);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          fence_regs_u32(pa[kk][e]);
          fence_regs_u32(dsa[kk][e]);
        }
      mbar_arrive(bar_empty(st));
      if (tid == 128 && it + 2 < n_iters) {
        if (mbar_try_wait(bar_empty(st), phase))
          issue_qdo(it + 2, st);
        else
          refill_pending = true;
      }
    };
    if constexpr (kDqWg) {
      // this tile's dSᵀ is the dQ warpgroup's; the next tile's rows are this warpgroup's own, so
      // a barrier of its 128 threads makes them visible. The next S waits for dK and dV: issued
      // behind dK instead, its accumulators live beside P's and dSᵀ's registers need 224, which
      // leaves the dQ warpgroup too few (see Sm90BwdConfig); the other warpgroup's GEMMs keep
      // the tensor cores busy meanwhile
      mbar_arrive(bar_ds_full(it & 1));
      named_sync(1 + cw, 128);
      HK_BWD_STAMP(6);
      HK_BWD_STAMP(7);
      wgmma_wait<0>();  // dV and dK done
      HK_BWD_STAMP(8);
      release_stage();
      issue_next_s();
      HK_BWD_STAMP(9);
      HK_BWD_STAMP(10);
      HK_BWD_STAMP(11);
      HK_BWD_STAMP(12);
      continue;
    }

    if (dq_issuer()) bulk_wait_read_all();  // the last dQ part has left s_dq
    __syncthreads();  // every dSᵀ of this tile is in shared memory; next rows stored
    HK_BWD_STAMP(6);

    float dq[32];
    if (dq_mode != 0) {
      // dQ = dS·K: A = dSᵀ (MN-major, keys as K), B = K (MN-major, keys as K)
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Cfg::kDqKeys / 16; ++kk) {
        const int key = dq_key0 + 16 * kk;
        const uint64_t da = desc_add(ds_mn, key * 128);
        const uint64_t db = desc_add(k_mn, key * 128);
        wgmma_ss<64, T, 1, 1>(dq, da, db, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    }
    HK_BWD_STAMP(7);
    // dK and dV done (dQ may still run): their register operands and this stage's Q and dO are
    // free, so the stage is released and the next tile's S issued behind dQ — the tensor cores go
    // from dQ straight to S instead of idling through the release and the barrier waits
    if (dq_mode != 0)
      wgmma_wait<1>();
    else
      wgmma_wait<0>();
    HK_BWD_STAMP(8);
    release_stage();
    issue_next_s();
    wgmma_wait<1>();  // dQ done; S runs on
    HK_BWD_STAMP(9);
    if (dq_mode == 0) continue;
    fence_regs(dq);
    if (dq_mode == 1) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int s_row = m0 + 16 * warp + g + 8 * r;
        if (s_row >= seq.S) continue;
        float* dst = dq_accum + dq_accum_offset(p, b, seq.q_row0, s_row, h) + dq_col0 + 2 * t4;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          red_add_f32x2(dst + 8 * j, dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
      }
    } else {
      // stage the warpgroup's [64 rows][64 columns] in the accumulator's tiled order (a thread's
      // four values of column group j as one 16-byte word, consecutive across a warp) and add it to
      // the accumulator's tile by bulk reduce-adds: one a warpgroup after a named barrier (2), or
      // one a warp of its own 16 rows (3: a warp's part is contiguous, so only __syncwarp)
      stage_dq_part(dq_it, dq, warp, lane);
      HK_BWD_STAMP(10);
      fence_proxy_async();
      if (dq_mode == 3) {
        __syncwarp();
        HK_BWD_STAMP(11);
        if (lane == 0)
          send_dq_warp_run(dq_accum + dq_tiled_index(p, b, m0 + 16 * warp, h, dq_col0), dq_it,
                           warp);
      } else {
        named_sync(1 + cw, 128);
        HK_BWD_STAMP(11);
        if (ltid == 0) {
          // this part's first element, (m0, dq_col0), begins it in the tiled layout
          bulk_reduce_add_f32(dq_accum + dq_tiled_index(p, b, m0, h, dq_col0), dq_it, Cfg::kDqPart);
          bulk_commit();
        }
      }
    }
    HK_BWD_STAMP(12);
  }
#undef HK_BWD_STAMP
  HK_BWD_BLOCK(kTraceEpilogue);
  wgmma_wait<0>();  // the last, unread S
  fence_regs(s);
  if (!kDqWg && dq_issuer()) bulk_wait_all();

  // dK·scale, dV → global (keys past the sequence end are not written)
  T* dkp = static_cast<T*>(p.dk);
  T* dvp = static_cast<T*>(p.dv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + key_row0 + 8 * r;
    if (key >= seq.T) continue;
    T* dk_row = dkp + row_offset(p.dk_strides, b, seq.k_row0, key, hk) + 2 * t4;
    T* dv_row = dvp + row_offset(p.dv_strides, b, seq.k_row0, key, hk) + 2 * t4;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * j) =
          pack2<T>(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_row + 8 * j) =
          pack2<T>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
  HK_BWD_BLOCK(kTraceEnd);
#undef HK_BWD_BLOCK
#else
  (void)p;
  (void)maps;
  (void)di;
  (void)dq_accum;
  (void)dq_mode;
  (void)heads_per_section;
#endif
}

}  // namespace hk_flash
