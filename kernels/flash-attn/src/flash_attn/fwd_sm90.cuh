// flash_attn/fwd_sm90.cuh — the Hopper flash-attention forward (FA3-class): TMA, wgmma,
// two consumer warpgroups in ping-pong, intra-warpgroup GEMM/softmax overlap. Two layouts of one
// kernel (HK_FLASH_SM90_FWD picks, api.cu):
//
// v1 (kProducerWg): a block of 3 warpgroups owns 128 query rows of one head:
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
// v2 (!kProducerWg): the same two consumer warpgroups and nothing else (256 threads), so ptxas
//   compiles every thread to the 255-register budget of __launch_bounds__(256, 1) instead of the
//   168 of 384 threads. (v1's consumers raise theirs to 240 with setmaxnreg; until 2026-12-05
//   ptxas allocated them no more than 168 at head dim 128 — spilling 208 bytes and serialising
//   wgmma, C7512 — because of the inline trap in its consumers' mbar_waits; with the trap behind
//   a call there, v1 compiles to 236 registers without spills. v2 was measured against the
//   spilling v1.) One thread of consumer warpgroup 1 (the one that trails in the ping-pong, so
//   its release of a stage is usually the last) issues the copies: Q and the first kStages K/V
//   tiles at the start, then each refill right after its own warpgroup has released the stage
//   (it waits there for the other warpgroup's release, normally long done).
// v3 (!kProducerWg, kTiles 2): v2 with two query tiles a block, m-blocks M-1-x and x of the same
//   head (equal work per block under causal masks); their key tiles form one stream through the
//   stages, so the second tile's Q and first K/V copies land while the first tile computes (v1
//   and v2 wait for them at every block start; at S = 2048 a block has ~8 key tiles).
// v4 (!kProducerWg, kTiles 0): v2 with a block an SM, each taking one query tile ("job") of each
//   round of the block order (a snake: forwards, then backwards, so heavy tiles spread evenly):
//   one K/V stream across its jobs and a ring of kStages + 1 Q tiles, so the next job's copies
//   land under the current job's GEMMs and stores and no block starts or ends in between. Its
//   jobs sit in a shared-memory table worked out once at the start; the issuer copies inside a
//   job from the job's own fields (as v2 does) and reads the table only where its copies cross
//   into the next job. Still slower than v2 on the H200 (2026-12-04, same binary, mirrored
//   order): 455 against 468 TF/s at B8 × S2048, 482 against 574 at S8192, 556 against 613 at
//   S16384 — its key-tile period is 3,163 / 3,263 cycles (warpgroups 0 / 1) against v2's 2,764 /
//   2,922 at B8 × S2048 (v3's is 3,064 / 3,188). Not L2 bandwidth (the same period on half the
//   SMs), not its job boundaries (+10 % at S8192 too), not the stream's run-time offset (literal
//   values gain nothing): with one job a block v4 runs ~6 % behind v2, ~2 % of it the issuer's
//   cross-job copy path inside the loop — but with that path out of the loop (a table of the next
//   copies filled at a job's start) only the issuer's warpgroup speeds up, and warpgroup 0's S
//   issue (~880 cycles against v2's ~640) still sets the period. With the head sections of the
//   block order its static rounds leave the heaviest block 21 % above the mean
//   at S8192 (6 % at S16384, 4 % at S2048) — so only HK_FLASH_SM90_FWD=v4 selects it. What it
//   removes (v2 at B8 × H16 × S2048): 2,530 cycles from a block's start to its first S, ~3,000
//   from the last P·V to the end and 2,117 idle between blocks on an SM, against a block's
//   ~29,800.
// v5 (kProducerWg, kTiles 0): v4's jobs, Q ring and one K/V stream with v1's producer
//   warpgroup issuing every copy, so the consumers' loop holds no copy code at all (v4's issuer
//   paths, inlined into warpgroup 1's loop, are what its slower key-tile period was traced to).
//   v1 could not be the base until its consumers' waits took the trap behind a call (kernel SDK,
//   2026-12-05): with it inline ptxas held v1's consumers to 168 registers at head dim 128. The
//   default at both head dims since 2026-12-05 (api.cu: sm90_forward_layout says by how much).
// The epilogue: each warpgroup writes O / l into its own 64 rows of the Q tile (free once its
// last S has completed) with stmatrix, and one thread stores them by TMA, a 64-column box at a
// time — where out is a TMA target (16-byte aligned rows; else 4-byte stores from registers). In
// v4 the storing thread frees the slot for the ring once the store has read it, at the start of
// its next job. On the H200 (2026-12-04) the TMA epilogue made v2 5-11 % faster at S = 2048 and
// ~1 % at 8192, and v4 3-5 % faster at S = 2048.
// Masks (causal, window, key_start, sequence end), softcap and lse follow fwd_sm80.cuh exactly.
// HK_FLASH_TRACE builds stamp each phase of a key tile (Params::trace; the benchmark prints them),
// a measurement build only.
// Not here: varlen, split-KV decode, head dim 256 (the sm80 kernels serve them).
#pragma once

#include "flash_attn/device_common.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace hk_flash {

// 128 query rows (two consumer warpgroups of 64), 128-key tiles, three stages deep at head dim
// 64 and two at 128 (shared memory). At head dim 128 a consumer thread holds S (64 floats), O (64)
// and P (32 words) while both GEMMs run: v2 fits that in its 255 registers (226 used), v1's and
// v5's consumers in the 240 setmaxnreg gives them (236, their waits' trap out of line; inline,
// ptxas held them to 168: spills, serialised wgmma, C7512). 64- and 96-key tiles (which fit 168)
// gave wrong results on the H200 (2026-12-01) because the K stages began kKVTile after Q instead of
// kQTile (the same size only at 128 keys; fixed since, not re-measured).
// How far (log2) a row's running max may rise above the reference the exponentials use before the
// reference moves and O is rescaled (a factor 256 in P, O and the row sums).
constexpr float kRescaleLog2 = 8.0f;

template <int D, bool kProducerWg = true, int kTiles = 1>
struct Sm90Config {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = D <= 64 ? 3 : 2;
  static constexpr int kThreads = kProducerWg ? 384 : 256;
  static constexpr int kFirstConsumerWg = kProducerWg ? 1 : 0;
  // the softmax's reference max moves only by more than kRescaleLog2 (the kernel's softmax says
  // why); v1 at head dim 64 keeps the exact running max
  static constexpr bool kLazyMax = !kProducerWg || D >= 128;
  static constexpr int kColBlocks = D / 64;                 // 64-column blocks, one TMA box
  static constexpr uint32_t kQBox = 128 * 128;              // 128 rows × 128 bytes
  static constexpr uint32_t kKVBox = kBlockN * 128;         // kBlockN rows × 128 bytes
  static constexpr uint32_t kQTile = kColBlocks * kQBox;    // the Q tile
  static constexpr uint32_t kKVTile = kColBlocks * kKVBox;  // a K or V tile
  static_assert(kKVBox % 1024 == 0, "swizzle atoms need 1024-byte aligned boxes");
  // v4 (kTiles 0) keeps a ring of kStages + 1 Q tiles. A slot is free again once its job's O
  // stores (by TMA, from the slot) have read it, which each warpgroup's storing thread signals at
  // the start of the next job; the copy of the job kStages + 1 keyed jobs later waits for that
  // signal, and is issued with key tile g + kStages at the refill after key tile g, where g
  // already lies in the next job (every keyed job has a key tile) — so the issuer never waits for
  // its own later signal.
  static constexpr int kQTiles = kTiles == 0 ? kStages + 1 : kTiles;
  // mbarriers (8 bytes each); v4's fit in 256 bytes, the rest of its shared memory is Q, K, V
  static constexpr uint32_t kBarrierBytes = kTiles == 0 ? 256 : 1024;
  // v4's jobs (query tiles) in shared memory, worked out once at the start: the issuer reads an
  // entry where a job's copies begin instead of recomputing the block order there (16 bytes each;
  // as many as fit beside the ring at head dim 128, and the launcher adds blocks so that none has
  // more)
  static constexpr int kJobTable = kTiles == 0 ? 96 : 0;
  static constexpr uint32_t kSmem = kQTiles * kQTile + 2 * kStages * kKVTile + kBarrierBytes +
                                    16 * kJobTable + 1024 /* alignment */;
  static_assert(8 * (4 * kStages + 2 * kQTiles) <= kBarrierBytes, "the mbarriers must fit");
  static_assert(kSmem <= 227 * 1024, "over the H100/H200 shared memory a block may opt into");
  static_assert(kTiles != 2 || !kProducerWg, "v3 pairs tiles in the two-warpgroup layout only");
  // block_order's positions a head: m-blocks (v1, v2, v4), pairs of them (v3)
  __host__ __device__ static constexpr int positions(int m_blocks) {
    return kTiles == 2 ? stream_pair_positions(m_blocks) : m_blocks;
  }
};

// v4's job table entry (a query tile with its head), 16 bytes: (h | b << 16, hk, m0,
// n_hi | n_iters << 16) — the launcher refuses calls whose heads, batch or key blocks need more
// than 16 bits.
struct JobEntry {
  uint4 e;
  __device__ static JobEntry pack(int h, int b, int hk, int m0, int n_hi, int n_iters) {
    return {make_uint4(static_cast<uint32_t>(h) | static_cast<uint32_t>(b) << 16,
                       static_cast<uint32_t>(hk), static_cast<uint32_t>(m0),
                       static_cast<uint32_t>(n_hi) | static_cast<uint32_t>(n_iters) << 16)};
  }
  __device__ int h() const { return static_cast<int>(e.x & 0xffffu); }
  __device__ int b() const { return static_cast<int>(e.x >> 16); }
  __device__ int hk() const { return static_cast<int>(e.y); }
  __device__ int m0() const { return static_cast<int>(e.z); }
  __device__ int n_hi() const { return static_cast<int>(e.w & 0xffffu); }
  __device__ int n_iters() const { return static_cast<int>(e.w >> 16); }
};

struct Sm90Maps {
  CUtensorMap q, k, v;
  CUtensorMap o;  // boxes of 64 rows × 64 columns; valid when o_by_tma
  bool o_by_tma;
};

template <class T, int D, bool kProducerWg = true, int kTiles = 1>
__global__ void __launch_bounds__(Sm90Config<D, kProducerWg, kTiles>::kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ Params p, const __grid_constant__ Sm90Maps maps,
                          int heads_per_section, int paired_jobs) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Sm90Config<D, kProducerWg, kTiles>;
  using namespace hk::sdk::cuda::sm90;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr uint32_t kQTile = Cfg::kQTile, kQBox = Cfg::kQBox;
  constexpr uint32_t kTile = Cfg::kKVTile, kBox = Cfg::kKVBox;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024 B
  const uint32_t s_q = base;                                    // [kQTiles] Q tiles
  // (after the Q tiles: kQTile, not the K/V tile size, which is smaller when kBlockN < 128)
  const uint32_t s_k = s_q + Cfg::kQTiles * kQTile;  // [kStages] K tiles
  const uint32_t s_v = s_k + kStages * kTile;        // [kStages] V tiles
  const uint32_t s_bar = s_v + kStages * kTile;      // mbarriers (8 bytes each)
  // v4: [kJobTable] jobs
  JobEntry* const jobs =
      reinterpret_cast<JobEntry*>(smem_raw + (s_bar + Cfg::kBarrierBytes - smem_u32(smem_raw)));
  auto bar_q = [&](int t) { return t == 0 ? s_bar : s_bar + 8 * (4 * kStages + t); };
  // v4: Q tile t done with — read by every consumer (256 arrivals), or, with O stored by TMA
  // from the slot, that store's reads done (one arrival a warpgroup) — so the ring may refill it
  auto bar_q_empty = [&](int t) { return s_bar + 8 * (4 * kStages + Cfg::kQTiles + t); };
  constexpr bool kStream = kTiles == 0;  // v4, v5
  auto bar_full_k = [&](int s) { return s_bar + 8 * (1 + s); };
  auto bar_full_v = [&](int s) { return s_bar + 8 * (1 + kStages + s); };
  auto bar_empty_k = [&](int s) { return s_bar + 8 * (1 + 2 * kStages + s); };
  auto bar_empty_v = [&](int s) { return s_bar + 8 * (1 + 3 * kStages + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // v1: 0 producer, 1-2 consumers; v2: 0-1 consumers
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int positions = Cfg::positions(m_blocks);
  // (v1-v3: this block's; v4, v5 take jobs of the order's rounds instead: stream_jobs.h)
  const BlockOrder order = block_order(p.heads_q * p.batch, positions, heads_per_section);
  const int h = order.head % p.heads_q, b = order.head / p.heads_q;
  const int hk = h / (p.heads_q / p.heads_kv);
  const SeqInfo seq = seq_info(p, b);
  // The block's query tiles: m-block m_blocks-1-x (heavy ones launched first); v3 (kTiles 2) also
  // m-block x, so under causal masks every block does the same work (the middle m-block of an odd
  // count alone), and the second tile's copies overlap the first tile's GEMMs. (Pairing
  // neighbouring m-blocks instead, so that blocks start longest-first as v2's do, measured slower
  // on the H200: 339-403 against 420-442 TF/s at S = 2048, 488 against 517 at S = 8192.)
  const int m_heavy = m_blocks - 1 - order.x;
  const int m_light = order.x;
  const int n_tiles = kTiles == 2 && m_light < m_heavy ? 2 : 1;
  auto m_block_of = [&](int t) { return t == 0 ? m_heavy : m_light; };
  // v4, v5: the block's query tiles ("jobs"), in the snake or in pairs of m-blocks
  // (stream_jobs.h; paired_jobs)
  const int grid = static_cast<int>(gridDim.x), bx = static_cast<int>(blockIdx.x);
  const bool pairs = kStream && paired_jobs != 0;
  const int n_jobs = kStream ? stream_job_count(pairs, bx, grid, m_blocks, p.heads_q * p.batch) : 0;
  if (kStream ? n_jobs <= 0 : seq.S - m_heavy * kBlockM <= 0)
    return;  // the whole block: before any barrier exists
  // rows of a query tile and the key tiles [n_hi - n_iters, n_hi) any of them sees
  struct TileKeys {
    int m0, valid_rows, n_hi, n_iters;
  };
  auto keys_of = [&](const SeqInfo& sq, int m_block) {
    TileKeys k;
    k.m0 = m_block * kBlockM;
    k.valid_rows = min(kBlockM, sq.S - k.m0);
    const KeyRange first = key_range(p, sq, k.m0);
    const KeyRange last = key_range(p, sq, k.m0 + k.valid_rows - 1);
    const int n_lo = first.lo / kBlockN;
    k.n_hi = last.hi > first.lo ? (last.hi + kBlockN - 1) / kBlockN : n_lo;
    k.n_iters = k.n_hi - n_lo;
    return k;
  };
  auto tile_keys = [&](int t) { return keys_of(seq, m_block_of(t)); };
  // A query tile with its head: v1-v3's tile t of this block, v4's job j.
  struct Job {
    int h, b, hk;
    SeqInfo seq;
    TileKeys keys;
  };
  auto job_of = [&](int j) {
    Job jb;
    const StreamJob sj =
        stream_job(pairs, j, bx, grid, m_blocks, p.heads_q * p.batch, heads_per_section);
    jb.h = sj.head % p.heads_q;
    jb.b = sj.head / p.heads_q;
    jb.hk = jb.h / (p.heads_q / p.heads_kv);
    jb.seq = seq_info(p, jb.b);
    if (sj.m_block >= 0) {
      jb.keys = keys_of(jb.seq, sj.m_block);
    } else {  // an empty job (a pair's missing partner): past every row, no keys
      jb.keys.m0 = m_blocks * kBlockM;
      jb.keys.valid_rows = 0;
      jb.keys.n_hi = 0;
      jb.keys.n_iters = 0;
    }
    return jb;
  };
  // One stream of key tiles over the block's query tiles: index g < total_iters is key tile
  // g - iters0 of query tile 1 when g ≥ iters0, else key tile g of query tile 0. Stages and
  // barrier phases follow g, so the second tile's copies start as soon as stages free up.
  const TileKeys keys0 = tile_keys(0);
  const int iters0 = keys0.n_iters;
  // v3's second tile, worked out once: the copies' issuer needs its n_hi for every key tile
  const TileKeys keys1 = n_tiles == 2 ? tile_keys(1) : keys0;
  int total_iters = iters0 + (n_tiles == 2 ? keys1.n_iters : 0);
  if constexpr (kStream) {
    for (int j = tid; j < n_jobs; j += Cfg::kThreads) {
      const Job jb = job_of(j);
      jobs[j] = JobEntry::pack(jb.h, jb.b, jb.hk, jb.keys.m0, jb.keys.n_hi, jb.keys.n_iters);
    }
  }

  if (tid == 0) {
    for (int t = 0; t < Cfg::kQTiles; ++t) {
      mbar_init(bar_q(t), 1);
      if (kStream) mbar_init(bar_q_empty(t), maps.o_by_tma ? 2 : 256);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full_k(s), 1);
      mbar_init(bar_full_v(s), 1);
      mbar_init(bar_empty_k(s), 256);
      mbar_init(bar_empty_v(s), 256);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if constexpr (kStream) {  // the key tiles of every job
    total_iters = 0;
    for (int j = 0; j < n_jobs; ++j) total_iters += jobs[j].n_iters();
  }
  // v4: job j from the table (the consumers' view: with its sequence and rows)
  auto job_at = [&](int j) {
    // broadcast from lane 0, so the compiler knows every value below is warp-uniform (it may move
    // them to uniform registers; the H200 SASS of 2026-12-04 still does v4's stage and parity
    // arithmetic on the vector pipes)
    JobEntry e = jobs[j];
    e.e.x = __shfl_sync(0xffffffffu, e.e.x, 0);
    e.e.y = __shfl_sync(0xffffffffu, e.e.y, 0);
    e.e.z = __shfl_sync(0xffffffffu, e.e.z, 0);
    e.e.w = __shfl_sync(0xffffffffu, e.e.w, 0);
    Job jb;
    jb.h = e.h();
    jb.b = e.b();
    jb.hk = e.hk();
    jb.seq = seq_info(p, jb.b);
    jb.keys.m0 = e.m0();
    jb.keys.valid_rows = min(kBlockM, jb.seq.S - jb.keys.m0);
    jb.keys.n_hi = e.n_hi();
    jb.keys.n_iters = e.n_iters();
    return jb;
  };

  // The copies of the Q tiles (those that see keys) and of stream index g (key tiles run from
  // the last key block down).
  auto load_q = [&] {
    prefetch_tma(&maps.q);
    prefetch_tma(&maps.k);
    prefetch_tma(&maps.v);
    // v4: each job's Q goes with its first K (load_k)
    for (int t = 0; t < (kStream ? 0 : n_tiles); ++t) {
      const TileKeys k = tile_keys(t);
      if (k.n_iters == 0) continue;
      mbar_expect_tx(bar_q(t), kQTile);
      tma_load_5d(s_q + t * kQTile, &maps.q, bar_q(t), 0, k.m0, 0, h, b);
    }
  };
  // stream index g of K or V into its stage, completing on that stage's full barrier
  auto load_kv = [&](int g, uint32_t s_tiles, const CUtensorMap* map, uint32_t bar_full) {
    const int stage = g % kStages;
    int key_block = keys0.n_hi - 1 - g;
    if (kTiles == 2 && g >= iters0) key_block = keys1.n_hi - 1 - (g - iters0);
    mbar_expect_tx(bar_full, kTile);
    tma_load_5d(s_tiles + stage * kTile, map, bar_full, 0, key_block * kBlockN, 0, hk, b);
  };
  // v4: where key tile `it` of job j lies when it is past that job's last (the copies run
  // kStages key tiles ahead, so across job boundaries): the job holding it, its index there, and
  // the keyed jobs before that job (their Q tiles go round the ring in that order). `keyed`
  // counts those before job j. Only the issuing thread walks, and only where a job's copies end.
  struct StreamAt {
    JobEntry job;
    int it, keyed;
  };
  auto stream_at = [&](int j, int it, int keyed) {
    JobEntry e = jobs[j];
    while (it >= e.n_iters()) {
      it -= e.n_iters();
      if (e.n_iters() > 0) ++keyed;
      e = jobs[++j];
    }
    return StreamAt{e, it, keyed};
  };
  // v4: the K and V copies of stream index g, key tile `it` of the job with those fields, and the
  // Q copy of a job into its ring slot
  auto load_stream_kv = [&](bool k, int g, int hk_at, int b_at, int n_hi_at, int it) {
    const uint32_t bar = k ? bar_full_k(g % kStages) : bar_full_v(g % kStages);
    mbar_expect_tx(bar, kTile);
    tma_load_5d((k ? s_k : s_v) + (g % kStages) * kTile, k ? &maps.k : &maps.v, bar, 0,
                (n_hi_at - 1 - it) * kBlockN, 0, hk_at, b_at);
  };
  auto load_stream_q = [&](const StreamAt& at) {
    const int t = at.keyed % Cfg::kQTiles, use = at.keyed / Cfg::kQTiles;
    if (use > 0) mbar_wait(bar_q_empty(t), (use - 1) & 1);
    mbar_expect_tx(bar_q(t), kQTile);
    tma_load_5d(s_q + t * kQTile, &maps.q, bar_q(t), 0, at.job.m0(), 0, at.job.h(), at.job.b());
  };
  // v4: key tile `it` of a job (its Q first where it is the job's first) found by stream_at
  auto load_stream_found = [&](bool k, int g, const StreamAt& at) {
    if (k && at.it == 0) load_stream_q(at);
    load_stream_kv(k, g, at.job.hk(), at.job.b(), at.job.n_hi(), at.it);
  };
  auto load_k = [&](int g) {
    if constexpr (kStream)
      load_stream_found(true, g, stream_at(0, g, 0));
    else
      load_kv(g, s_k, &maps.k, bar_full_k(g % kStages));
  };
  auto load_v = [&](int g) {
    if constexpr (kStream)
      load_stream_found(false, g, stream_at(0, g, 0));
    else
      load_kv(g, s_v, &maps.v, bar_full_v(g % kStages));
  };

  if (kProducerWg && wg == 0) {
    // ---------------- producer (v1) ----------------
    regs_decrease<24>();
    if (tid == 0 && total_iters > 0) {  // no keys: no copies (none may land after the exit)
      load_q();
      // stream index g's K, then its V, each once its stage's last use is released
      auto produce = [&](int g, auto&& copy) {
        const uint32_t parity = ((g / kStages) & 1) ^ 1;
        mbar_wait(bar_empty_k(g % kStages), parity);
        copy(true);
        mbar_wait(bar_empty_v(g % kStages), parity);
        copy(false);
      };
      if constexpr (kStream) {
        // v5: the block's jobs in order, each keyed job's Q into the ring (waiting for its slot's
        // last O store) and then its key tiles — so the next job's Q and first K/V land under the
        // current job's last GEMMs and stores
        int g = 0, keyed = 0;
        for (int j = 0; j < n_jobs; ++j) {
          const JobEntry e = jobs[j];
          const int n = e.n_iters();
          if (n == 0) continue;
          load_stream_q(StreamAt{e, 0, keyed});
          for (int it = 0; it < n; ++it, ++g)
            produce(g, [&](bool k) { load_stream_kv(k, g, e.hk(), e.b(), e.n_hi(), it); });
          ++keyed;
        }
      } else {
        for (int it = 0; it < total_iters; ++it)
          produce(it, [&](bool k) { k ? load_k(it) : load_v(it); });
      }
    }
  } else {
    // ---------------- consumers ----------------
    if constexpr (kProducerWg) regs_increase<240>();
    const int cw = wg - Cfg::kFirstConsumerWg;  // consumer warpgroup 0 / 1: rows [64·cw, +64)
    const int ltid = tid - 128 * wg;            // thread within the warpgroup
    // v2: the thread that issues the copies (consumer warpgroup 1 trails in the ping-pong)
    const bool issuer = !kProducerWg && tid == 128;
    if (issuer && total_iters > 0) {  // no keys: no copies (none may land after the exit)
      load_q();
      for (int g = 0; g < min(total_iters, kStages); ++g) {
        load_k(g);
        load_v(g);
      }
    }
    // v2: once this thread's warpgroup has released stream index g's K (V) stage, wait for the
    // other warpgroup's release and refill the stage with index g + kStages.
    auto refill_k = [&](int g) {
      if (issuer && g + kStages < total_iters) {
        mbar_wait(bar_empty_k(g % kStages), (g / kStages) & 1);
        load_k(g + kStages);
      }
      if constexpr (!kProducerWg) __syncwarp();
    };
    auto refill_v = [&](int g) {
      if (issuer && g + kStages < total_iters) {
        mbar_wait(bar_empty_v(g % kStages), (g / kStages) & 1);
        load_v(g + kStages);
      }
      if constexpr (!kProducerWg) __syncwarp();
    };
    // v4: once stream index g (key tile `it` of job j, jb, with `keyed` keyed jobs before it) is
    // released, the copy of index g + kStages: inside job j from the job's own fields, as v2's
    // copies are; past its end through the job table
    auto refill_stream = [&](bool k, int g, int j, const Job& jb, int it, int keyed) {
      if (issuer && g + kStages < total_iters) {
        mbar_wait(k ? bar_empty_k(g % kStages) : bar_empty_v(g % kStages), (g / kStages) & 1);
        const int ahead = it + kStages;
        if (ahead < jb.keys.n_iters)
          load_stream_kv(k, g + kStages, jb.hk, jb.b, jb.keys.n_hi, ahead);
        else
          load_stream_found(k, g + kStages, stream_at(j + 1, ahead - jb.keys.n_iters, keyed + 1));
      }
      __syncwarp();
    };
    // the consumers' waits: v1 and v5 run them in a setmaxnreg region, where only the trap behind
    // a call keeps ptxas from holding the consumers to 168 registers (kernel SDK)
    auto consumer_wait = [](uint32_t bar, uint32_t parity) {
      if constexpr (kProducerWg)
        mbar_wait_trap_out_of_line(bar, parity);
      else
        mbar_wait(bar, parity);
    };
    const int warp_in_wg = ltid / 32, lane = ltid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const float scale = p.scale != 0.0f ? p.scale : rsqrtf(static_cast<float>(D));
    const ScoreMap smap = score_map(p, scale);
    const int wg_row0 = 64 * cw;  // within the block

    // scheduler barriers 1 (consumer 0's turn) and 2 (consumer 1's turn)
    const int my_bar = 1 + cw, other_bar = 2 - cw;
#ifdef HK_FLASH_TRACE
    unsigned long long* const trace_at = ltid == 0 ? trace_row(p, cw, kFwdTracePhases) : nullptr;
#define HK_FWD_STAMP(gi, k) trace_stamp(trace_at, gi, kFwdTracePhases, k)
#define HK_FWD_BLOCK(slot) trace_block(trace_at, slot)
    HK_FWD_BLOCK(kTraceSm);
    HK_FWD_BLOCK(kTraceStart);
#else
#define HK_FWD_BLOCK(slot) \
  do {                     \
  } while (0)
#define HK_FWD_STAMP(gi, k) \
  do {                      \
  } while (0)
#endif
    int turns_left = total_iters;
    auto take_turn = [&] { named_sync(my_bar, 256); };
    auto pass_turn = [&] {
      --turns_left;
      if (cw == 0 || turns_left > 0) named_arrive(other_bar, 256);
    };
    if (cw == 0 && total_iters > 0) named_arrive(my_bar, 256);  // consumer 0 starts

    // v4 with O stored by TMA: the Q slot whose O this warpgroup stored last; its storing thread
    // waits for the store's reads at the start of the next job (the store has long run by then)
    // and frees the slot for the ring
    int stored_q_slot = -1;
    auto release_stored_q = [&] {
      if constexpr (kStream) {
        if (stored_q_slot >= 0 && ltid == 0) {
          bulk_wait_read_all();
          mbar_arrive(bar_q_empty(stored_q_slot));
        }
        stored_q_slot = -1;
      }
    };
    // One query tile, every per-tile value local to it (a one-tile block compiles as the
    // single-tile kernel always did).
    // t: the block's tile (v1-v3) or job index (v4); g0: its first stream index; q_slot, q_use:
    // its Q tile in the ring and how many times that slot was filled before
    auto query_tile = [&](int t, const Job& jb, int g0, int q_slot, int q_use) {
      const TileKeys tk = jb.keys;
      const int m0 = tk.m0, valid_rows = tk.valid_rows, n_hi = tk.n_hi, n_iters = tk.n_iters;
      const int h = jb.h, b = jb.b;
      const SeqInfo& seq = jb.seq;
      const int wg_rows_valid = valid_rows - wg_row0;  // may be ≤ 0 (nothing to write)
      const uint32_t s_q_tile = s_q + q_slot * kQTile;
      const bool last_job = kStream ? t == n_jobs - 1 : t == n_tiles - 1;
      // the K (k) or V copy once key tile `it` of this tile (v4: job) is released
      auto refill_at = [&](bool k, int it) {
        if constexpr (kProducerWg)
          return;  // v1, v5: the producer warpgroup refills
        else if constexpr (kStream)
          refill_stream(k, g0 + it, t, jb, it, q_use * Cfg::kQTiles + q_slot);
        else if (k)
          refill_k(g0 + it);
        else
          refill_v(g0 + it);
      };
      // v4, O stored from registers: this job's last S has read its Q tile, so the ring may
      // refill the slot (by TMA the slot holds O until its store has read it: release_stored_q)
      auto release_q = [&](int it) {
        if constexpr (kStream) {
          if (!maps.o_by_tma && it == n_iters - 1) mbar_arrive(bar_q_empty(q_slot));
        }
      };

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

      // v4: each chain's descriptors are one base in uniform registers (warp-uniform by a
      // broadcast) plus a constant a wgmma, since its Q slot and stages follow job entries the
      // compiler cannot prove uniform. (The same in v1-v3 measured no different on the H200,
      // 2026-12-04: v2 456-467 against 456-472 TF/s at B8 × S2048, so they keep the plain form.)
      constexpr bool kUniformDesc = kStream;
      const uint64_t q_desc =
          kUniformDesc ? uniform_desc(make_desc(s_q_tile + wg_row0 * 128, 16, 1024)) : 0;
      auto issue_s = [&](float(&s)[kNS], int stage) {
        const uint32_t k_tile = s_k + stage * kTile;
        const uint64_t k_desc = kUniformDesc ? uniform_desc(make_desc(k_tile, 16, 1024)) : 0;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t within = (kk % 4) * 32;
          const uint64_t da =
              kUniformDesc
                  ? desc_add(q_desc, (kk / 4) * kQBox + within)
                  : make_desc(s_q_tile + (kk / 4) * kQBox + within + wg_row0 * 128, 16, 1024);
          const uint64_t db = kUniformDesc ? desc_add(k_desc, (kk / 4) * kBox + within)
                                           : make_desc(k_tile + (kk / 4) * kBox + within, 16, 1024);
          wgmma_ss<kBlockN, T>(s, da, db, kk > 0 ? 1 : 0);
        }
        wgmma_commit();
      };
      auto issue_pv = [&](int stage) {
        const uint32_t v_tile = s_v + stage * kTile;
        const uint64_t v_desc = kUniformDesc ? uniform_desc(make_desc(v_tile, kBox, 1024)) : 0;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          const uint64_t db = kUniformDesc ? desc_add(v_desc, kk * 16 * 128)
                                           : make_desc(v_tile + kk * 16 * 128, kBox, 1024);
          wgmma_rs<D, T>(o, pa[kk], db);
        }
        wgmma_commit();
      };
      // Softcaps and masks S, then exponentiates it in place (the scale inside exp2: one FFMA per
      // element); returns the per-row rescale factors.
      const float sl2 = smap.scale_log2;
      // returns whether any row of the warp moved its reference max (O then needs alpha)
      auto softmax = [&](float(&s)[kNS], int n_block, float(&alpha)[2]) -> bool {
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
        float mx[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = -INFINITY;
#pragma unroll
          for (int j = 0; j < kBlockN / 8; ++j)
            mx[r] = fmaxf(mx[r], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
        }
        // v2/v3: a row's reference max moves only when the tile's max passes it by more than
        // kRescaleLog2: until then P (≤ 2^kRescaleLog2) and the sums stay well inside f32 and
        // bf16, and O needs no rescale (alpha 1) — O's 64 multiplies a tile sat between the P·V
        // wait and the next GEMM issue. O / l and lse use the same reference, so the result is
        // the same up to rounding. Each thread first tests its own scores, so the quad's shuffles
        // run only in a tile where a row of the warp moves: on the H200 a softmax overlapping the
        // other warpgroup's stalled wgmma issue took 2-3× its exponentials' MUFU time, and
        // leaving out the four shuffles made v2 7-10 % faster. The producer-warpgroup layouts keep
        // the exact running max at head dim 64 (the lazy form measured 6 % slower in v1 there).
        bool moved = true;
        if constexpr (Cfg::kLazyMax) {
          bool want = false;
#pragma unroll
          for (int r = 0; r < 2; ++r) want = want || mx[r] * sl2 > m_row[r] + kRescaleLog2;
          moved = __any_sync(0xffffffffu, want);
        }
        if (moved) {
#pragma unroll
          for (int r = 0; r < 2; ++r) mx[r] = quad_max(mx[r]);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float tile_max = mx[r] * sl2;
          const bool move = !Cfg::kLazyMax || (moved && tile_max > m_row[r] + kRescaleLog2);
          const float m_new = !Cfg::kLazyMax ? fmaxf(m_row[r], tile_max)
                              : move         ? tile_max
                                             : m_row[r];
          const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
          alpha[r] = move ? fast_exp2(m_row[r] - m_ref) : 1.0f;
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
        return moved;
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

      if (n_iters == 0) release_stored_q();
      if (n_iters > 0) {
        consumer_wait(bar_q(q_slot), q_use & 1);
        float s[kNS];
        // first key tile: S only
        consumer_wait(bar_full_k(g0 % kStages), (g0 / kStages) & 1);
        take_turn();
        issue_s(s, g0 % kStages);
        if (t == 0) HK_FWD_BLOCK(kTraceFirstS);
        pass_turn();
        release_stored_q();  // before this thread's first refill (the issuer may wait on it)
        wgmma_wait<0>();
        fence_regs(s);
        release_q(0);
        mbar_arrive(bar_empty_k(g0 % kStages));
        refill_at(true, 0);
        {
          float alpha[2];
          softmax(s, n_hi - 1, alpha);
        }
        to_pa(s);
        for (int it = 1; it < n_iters; ++it) {
          const int gi = g0 + it;
          const int stage = gi % kStages, prev = (gi - 1) % kStages;
          const uint32_t parity = (gi / kStages) & 1, prev_parity = ((gi - 1) / kStages) & 1;
          HK_FWD_STAMP(gi, 0);
          consumer_wait(bar_full_k(stage), parity);
          HK_FWD_STAMP(gi, 1);
          take_turn();
          HK_FWD_STAMP(gi, 2);
          issue_s(s, stage);
          HK_FWD_STAMP(gi, 3);
          consumer_wait(bar_full_v(prev), prev_parity);
          HK_FWD_STAMP(gi, 4);
          issue_pv(prev);
          pass_turn();
          HK_FWD_STAMP(gi, 5);
          wgmma_wait<1>();  // S done, P·V may still run
          fence_regs(s);
          release_q(it);
          HK_FWD_STAMP(gi, 6);
          mbar_arrive(bar_empty_k(stage));
          refill_at(true, it);
          HK_FWD_STAMP(gi, 7);
          float alpha[2];
          const bool rescale = softmax(s, n_hi - 1 - it, alpha);
          HK_FWD_STAMP(gi, 8);
          wgmma_wait<0>();  // P·V done: O and the old P may be touched again
          fence_regs(o);
          fence_pa();
          HK_FWD_STAMP(gi, 9);
          mbar_arrive(bar_empty_v(prev));
          refill_at(false, it - 1);
          HK_FWD_STAMP(gi, 10);
          if (rescale) {  // warp-uniform
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
              o[4 * j + 0] *= alpha[0];
              o[4 * j + 1] *= alpha[0];
              o[4 * j + 2] *= alpha[1];
              o[4 * j + 3] *= alpha[1];
            }
          }
          to_pa(s);
          HK_FWD_STAMP(gi, 11);
        }
        HK_FWD_STAMP(g0 + n_iters, 0);  // the period's end of the tile's last key tile
        const int g_last = g0 + n_iters - 1;
        const int last_stage = g_last % kStages;
        consumer_wait(bar_full_v(last_stage), (g_last / kStages) & 1);
        issue_pv(last_stage);
        wgmma_wait<0>();
        fence_regs(o);
        fence_pa();
        mbar_arrive(bar_empty_v(last_stage));
        refill_at(false, n_iters - 1);
      }
      if (last_job) HK_FWD_BLOCK(kTraceEpilogue);

        // epilogue: O / l, lse
#pragma unroll
      for (int r = 0; r < 2; ++r) l_row[r] = quad_sum(l_row[r]);
      float inv[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) inv[r] = l_row[r] > 0.0f ? 1.0f / l_row[r] : 0.0f;
      if (p.lse != nullptr && t4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp_in_wg * 16 + g + 8 * r;  // within the warpgroup
          if (row >= wg_rows_valid) continue;
          p.lse[lse_offset(p, b, seq.q_row0, m0 + wg_row0 + row, h)] =
              l_row[r] > 0.0f ? (m_row[r] + __log2f(l_row[r])) * kLn2 : INFINITY;
        }
      }
      if (maps.o_by_tma && (!kStream || n_iters > 0)) {  // v4: a job without keys has no slot
        // This warpgroup's last S has completed, so its 64 rows of the Q tile are free: O goes
        // there in the 128-byte swizzle's layout, and one TMA store a 64-column block writes it
        // (rows past the sequence skipped by the map). With scattered 4-byte stores from
        // registers — 64 a thread, each warp store touching 8 rows — a block at S = 2048 lived
        // ~3,600 cycles past its last P·V, with these ~3,000 (trace, H200, 2026-12-04).
        if (wg_rows_valid > 0) {  // warpgroup-uniform
          // stmatrix: lane 8m + i addresses row i of 8×8 matrix m = (row half m & 1, 8-column
          // group 2jp + (m >> 1)); each lane's word of matrix m is its accumulator pair there
          const int mat = lane >> 3, i = lane & 7;
          const uint32_t row_at =
              s_q_tile + static_cast<uint32_t>(wg_row0 + warp_in_wg * 16 + 8 * (mat & 1) + i) * 128;
#pragma unroll
          for (int jp = 0; jp < D / 16; ++jp) {
            uint32_t w[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const int j = 2 * jp + (m >> 1), r = m & 1;
              w[m] = pack2<T>(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
            }
            const int jj = 2 * jp + (mat >> 1);
            const uint32_t at = row_at + (jj / 8) * kQBox + (((jj % 8) ^ i) << 4);
            stmatrix_x4(at, w[0], w[1], w[2], w[3]);
          }
          fence_proxy_async();
          named_sync(3 + cw, 128);  // the warpgroup's rows are in shared memory
          if (ltid == 0) {
#pragma unroll
            for (int c = 0; c < D / 64; ++c)
              tma_store_5d(&maps.o, s_q_tile + c * kQBox + wg_row0 * 128, 0, m0 + wg_row0, c, h, b);
            bulk_commit();
          }
        }
        stored_q_slot = q_slot;
      } else {
        T* out = static_cast<T*>(p.out);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp_in_wg * 16 + g + 8 * r;  // within the warpgroup
          if (row >= wg_rows_valid) continue;
          T* dst = out + row_offset(p.out_strides, b, seq.q_row0, m0 + wg_row0 + row, h);
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) =
                pack2<T>(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
        }
      }
    };
    if constexpr (kStream) {
      int g0 = 0, keyed = 0;
      for (int j = 0; j < n_jobs; ++j) {
        const Job jb = job_at(j);
        query_tile(j, jb, g0, keyed % Cfg::kQTiles, keyed / Cfg::kQTiles);
        if (jb.keys.n_iters > 0) ++keyed;
        g0 += jb.keys.n_iters;
      }
    } else {
      for (int t = 0; t < n_tiles; ++t)
        query_tile(t, Job{h, b, hk, seq, t == 0 ? keys0 : keys1}, t == 0 ? 0 : iters0, t, 0);
    }
    // the O stores' reads of shared memory end before the block's shared memory does
    if (maps.o_by_tma && ltid == 0) bulk_wait_read_all();
    HK_FWD_BLOCK(kTraceEnd);
#undef HK_FWD_STAMP
#undef HK_FWD_BLOCK
  }  // consumers
#endif
}

}  // namespace hk_flash
