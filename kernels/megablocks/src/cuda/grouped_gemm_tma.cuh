// grouped_gemm_tma.cuh — the Hopper (sm_90a) grouped GEMMs of the experts with TMA copies and a
// warp-specialised pipeline: the same M-grouped and K-grouped problems, parameters, tile walk and
// per-pair epilogues as grouped_gemm.cuh / grouped_gemm_sm90.cuh, for bf16 (moe_cuda.cu picks them
// with HK_MEGABLOCKS_GEMM=tma; f16 and the router's GEMMs keep the wgmma kernels). Not for the CPU
// emulation of the device (TMA and wgmma cannot be emulated).
//
// Why another kernel set: the wgmma kernels copy with cp.async from every thread and synchronise
// the block once per k-tile, so the tensor cores wait on the copies' issue and the barrier (they
// reach ~50 % of the dense rate, docs/performance.md). Here the copies need no thread's time:
//   - 384 threads: warpgroup 0 the producer (setmaxnreg down to 56 registers), warpgroups 1 and 2
//     the consumers (up to 224), 64 tile rows each;
//   - tiles 128 × 256 × 64, four stages (48 KB each) in a ring of "full" mbarriers (the copies'
//     bytes complete them) and "empty" ones (each consumer warp arrives once it is done reading);
//     the consumers keep one wgmma group in flight (m64n256k16, both operands in shared memory);
//   - persistent: one block an SM walks the tiles; the producer runs ahead into the next tile's
//     stages while the consumers store the last one.
// Every operand is a TMA tensor copy into the 128-byte swizzle the wgmma descriptors read, issued
// by one producer thread: the experts' weights and the expert-sorted activations, x and dy
// included (moe_cuda.cu copies their rows in expert order first). Token rows gathered inside the
// GEMMs (cp.async from the 128 producer threads, arriving on the stage's barrier) took ~1.0 µs a
// k-tile on the H200 against ~0.7 for whole-tile TMA copies, and one TMA copy a gathered row was
// 2–5× slower still (TMA issue-bound). Epilogues store through a plane by TMA too (Plane).
// Maps (all 4-D for the SDK's tma_load_4d; moe_cuda.cu encodes them per call on the host):
//   activations [rows][cols]       dims {cols, rows, 1, 1}; boxes {64, 128} (M-grouped A tile)
//                                  or {64, 64} (K-grouped tile)
//   weights     [E][rows][cols]    dims {cols, rows, E, 1}; boxes {64, 128} (K-major B: [N][K])
//                                  or {64, 64} (MN-major B: [K][N])
// Requirements: those of the other kernel sets (contiguous dimensions multiples of 8, 16-byte
// aligned) and fewer than 2^31 rows.
#pragma once

#include <cuda.h>

#include "grouped_gemm.cuh"
#include "grouped_gemm_sm90.cuh"  // smem_addr, swizzled: the same 128-byte swizzle
#include "hk/kernel_sdk_sm90.cuh"

namespace megablocks::cuda::tma {

namespace wg = hk::sdk::cuda::sm90;
using sm90::smem_addr;
using sm90::swizzled;

inline constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
inline constexpr int kConsumerWarps = 8, kProducerThreads = 128;
inline constexpr uint32_t kRowBytes = kBK * 2;            // one 64-element row of a tile
inline constexpr uint32_t kBoxBytes = 64 * kRowBytes;     // a [64][64] box
inline constexpr uint32_t kATileBytes = kBM * kRowBytes;  // A: 128 rows (K-major) or 2 boxes
inline constexpr uint32_t kBTileBytes = kBN * kRowBytes;  // B: 256 rows (K-major) or 4 boxes
inline constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;
// A consumer warpgroup's staging plane for the epilogue (Plane): 64 rows of 128 16-bit values,
// two swizzled [64][64] boxes. Four stages and two such planes fill the 227 KB a block may have.
inline constexpr int kPlaneCols = 128;
inline constexpr uint32_t kStagedBytes = 2 * kBoxBytes;
inline constexpr int kSmemBytes =
    kStages * kStageBytes + 2 * kStagedBytes + 1024 /* realignment */ + 384 /* bars, infos */;
inline constexpr int kSwigluCols = kBN / 2;  // a SwiGLU tile: 128 gate columns, then their up
static_assert(kBM == cuda::kBM, "the routing sizes the M tiles (tile offsets) in kBM rows");

struct MGroupedMaps {
  CUtensorMap a;  // rows of A, whole tiles ({64, 128} boxes)
  CUtensorMap b;  // the experts' weights, K-major ({64, 128} boxes) or MN-major ({64, 64})
  // The outputs' TMA stores ({64, 64} boxes): Store: out; SwigluForward: gate, up (null in
  // inference), act.
  CUtensorMap out[3];
};

struct KGroupedMaps {
  CUtensorMap a_tile;  // [rows][M]: {64, 64} boxes
  CUtensorMap b_tile;  // [rows][N]: {64, 64} boxes
  CUtensorMap out;     // [groups][M][N]: {64, 64} boxes (TMA stores; unused when accumulating)
};

// The block's shared memory: the stages from the first 1024-byte boundary (swizzle atoms), the
// two consumer warpgroups' staging planes, then the mbarriers. full(s): the copies of stage s
// landed; empty(s): the consumers are done with it.
struct Ring {
  uint32_t base, bars;
  __device__ explicit Ring(const unsigned char* raw)
      : base((smem_addr(raw) + 1023u) & ~1023u),
        bars(base + kStages * kStageBytes + 2 * kStagedBytes) {}
  __device__ uint32_t stage(int s) const { return base + s * kStageBytes; }
  __device__ uint32_t staged(int cw) const {
    return base + kStages * kStageBytes + cw * kStagedBytes;
  }
  __device__ uint32_t full(int s) const { return bars + 8 * s; }
  __device__ uint32_t empty(int s) const { return bars + 8 * (kStages + s); }
  // The tile a stage's k-tile belongs to, written by the producer with a tile's first k-tile:
  // the consumers read it there instead of looking the tile up in global memory themselves (a
  // binary search over the experts' tile offsets: ~2 µs of dependent loads a tile, with the
  // tensor cores idle).
  __device__ uint32_t info(int s) const { return bars + 16 * kStages + 32 * s; }
  __device__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        wg::mbar_init(full(s), 1);
        wg::mbar_init(empty(s), kConsumerWarps);
      }
      wg::fence_barrier_init();
    }
    __syncthreads();
  }
};

// The `use`-th k-tile through the ring: its stage and the phase parity of that pass.
struct Slot {
  int stage;
  uint32_t parity;
  __device__ explicit Slot(int use) : stage(use % kStages), parity((use / kStages) & 1) {}
};
// A tile's description as the producer hands it to the consumers (four 64-bit values).
struct TileInfo {
  int64_t v[4];
};
__device__ __forceinline__ void put_info(const Ring& ring, int stage, const TileInfo& t) {
  auto* dst = reinterpret_cast<int64_t*>(__cvta_shared_to_generic(ring.info(stage)));
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[i] = t.v[i];
}
__device__ __forceinline__ TileInfo get_info(const Ring& ring, int stage) {
  const auto* src = reinterpret_cast<const int64_t*>(__cvta_shared_to_generic(ring.info(stage)));
  TileInfo t;
#pragma unroll
  for (int i = 0; i < 4; ++i) t.v[i] = src[i];
  return t;
}

// The producer's side of one k-tile: waits for its stage to be free, then arrives on the full
// barrier announcing the bytes of its TMA copies. `first`: this is the tile's first k-tile, whose
// stage carries `info` (written before the arrival that publishes it).
__device__ __forceinline__ Slot acquire(const Ring& ring, int use, uint32_t tma_bytes, bool first,
                                        TileInfo info) {
  const Slot s(use);
  if (use >= kStages) wg::mbar_wait(ring.empty(s.stage), s.parity ^ 1);
  if (first) put_info(ring, s.stage, info);
  wg::mbar_expect_tx(ring.full(s.stage), tma_bytes);
  return s;
}
// The consumers' k-loop of one tile: waits for each stage, issues its 4 wgmma (m64n256k16) into
// acc, keeps one group in flight and releases a stage once the group reading it is done.
// `desc(stage_addr, kk)` gives the (A, B) descriptors of step kk. The tile's first stage carries
// its TileInfo: first(info) returns the tile's k-tile count (0: the producer sent one stage with
// no copies, for a group without rows; acc is then left as it is and the caller stores zeros:
// zeroing the accumulators here, outside the wgmma, made ptxas serialise every wgmma of the
// kernel, C7515). prepare(stage_addr, kt) runs once the stage landed and before its wgmma (the
// K-grouped kernel zeroes rows past a group's end there).
template <class T, int TransA, int TransB, class Desc, class First, class Prepare>
__device__ __forceinline__ void consume(const Ring& ring, int& use, const Desc& desc,
                                        const First& first, const Prepare& prepare,
                                        float (&acc)[128]) {
  const bool lane0 = threadIdx.x % 32 == 0;
  int num_k_tiles = 1;
  {
    const Slot s(use);
    wg::mbar_wait(ring.full(s.stage), s.parity);
    num_k_tiles = first(get_info(ring, s.stage));
    if (num_k_tiles == 0) {
      if (lane0) wg::mbar_arrive(ring.empty(s.stage));
      ++use;
      return;
    }
  }
  for (int kt = 0; kt < num_k_tiles; ++kt, ++use) {
    const Slot s(use);
    if (kt > 0) wg::mbar_wait(ring.full(s.stage), s.parity);
    prepare(ring.stage(s.stage), kt);
    wg::fence_regs(acc);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const auto d = desc(ring.stage(s.stage), kk);
      wg::wgmma_ss<kBN, T, TransA, TransB>(acc, d.a, d.b, kt > 0 || kk > 0 ? 1 : 0);
    }
    wg::wgmma_commit();
    wg::fence_regs(acc);
    wg::wgmma_wait<1>();  // the previous k-tile's group is done: its stage is free
    if (kt > 0 && lane0) wg::mbar_arrive(ring.empty(Slot(use - 1).stage));
  }
  wg::wgmma_wait<0>();
  wg::fence_regs(acc);
  if (lane0) wg::mbar_arrive(ring.empty(Slot(use - 1).stage));
}

struct Descs {
  uint64_t a, b;
};

// Where a consumer thread's accumulator acc[4j + 2r + q] sits in the 128 × 256 tile (m64n256k16
// layout): row 64·(warpgroup − 1) + 16·warp + lane/4 + 8r, column 8j + 2·(lane % 4) + q.
struct Fragment {
  int row0, col0;
  __device__ Fragment() {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    row0 = (threadIdx.x / 128 - 1) * 64 + warp * 16 + lane / 4;
    col0 = 2 * (lane % 4);
  }
};

// ---- the staged epilogue ------------------------------------------------------------------------
// A consumer warpgroup writes 128 of its 64 × 256 results at a time as 16-bit values into its
// plane, two [64 rows][64 columns] boxes in TMA's 128-byte swizzle (16-byte chunk c of row r at
// chunk c ^ (r % 8): neither the fragments' stores, 8 rows a warp, nor the row-wise copies meet
// bank conflicts), and stores them by TMA: asynchronous, so the global writes overlap what
// follows, the next tile's k-loop included (the plane's next use waits only for TMA to have read
// it). A tile that ends a group copies its rows out with 16-byte stores instead (TMA would write
// the next group's rows too). Stored straight from the fragments, every store instruction wrote
// 8 rows × 16 bytes and the epilogue took ~5 µs a tile on the H200; through the plane with
// 16-byte row stores ~2.6 µs.
template <class T>
struct Plane {
  unsigned char* p;  // generic address of the plane
  uint32_t addr;     // its shared address
  int id;            // the warpgroup's named barrier
  __device__ Plane(unsigned char* raw, const Ring& ring, int cw)
      : p(raw + (ring.staged(cw) - smem_addr(raw))), addr(ring.staged(cw)), id(1 + cw) {}
  // Every thread of the warpgroup: the plane may be overwritten, or read back.
  __device__ void sync() const { wg::named_sync(id, 128); }
  // Byte offset of columns col.. (col % 8 + count ≤ 8) of row `row`.
  __device__ static uint32_t at(int row, int col) {
    return (col / 64) * kBoxBytes + swizzled(row, (col % 64) / 8) + (col % 8) * 2;
  }
  // Two values rounded to T, as the 32-bit word a pair is stored as.
  __device__ static uint32_t pack(float v0, float v1) {
    const T pair[2] = {from_f32<T>(v0), from_f32<T>(v1)};
    uint32_t word;
    memcpy(&word, pair, sizeof word);
    return word;
  }
  // Writes the words value(r, j) of the fragment's pairs in accumulator column blocks
  // [j0, j0 + 16) (rows lr0, lr0 + 8; plane column 8(j − j0) + col0), then: `whole` (every row
  // of the warpgroup is the output's), thread 0 of the warpgroup stores both boxes with
  // store(addr); else rows < `rows`, columns < `cols` (a multiple of 8), are copied out to
  // dst(row) (16-byte aligned).
  template <class Value, class Store, class Dst>
  __device__ void emit(const Fragment& f, int lr0, int j0, bool whole, int64_t rows, int64_t cols,
                       const Value& value, const Store& store, const Dst& dst) const {
    const int t = threadIdx.x % 128;
    if (t == 0) wg::bulk_wait_read_all();
    sync();
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int jl = 0; jl < kPlaneCols / 8; ++jl)
        *reinterpret_cast<uint32_t*>(p + at(lr0 + 8 * r, 8 * jl + f.col0)) = value(r, j0 + jl);
    if (whole) {
      wg::fence_proxy_async();  // the stores above before TMA reads them
      sync();
      if (t == 0) {
        store(addr);
        wg::bulk_commit();
      }
      return;
    }
    sync();
    for (int i = t; i < 64 * (kPlaneCols / 8); i += 128) {
      const int row = i / (kPlaneCols / 8), ch = i % (kPlaneCols / 8);
      if (row >= rows || ch * 8 >= cols) continue;
      *reinterpret_cast<uint4*>(dst(row) + ch * 8) =
          *reinterpret_cast<const uint4*>(p + at(row, ch * 8));
    }
  }
  // Thread 0 of the warpgroup, before the block exits: its TMA stores are complete.
  __device__ void drain() const {
    if (threadIdx.x % 128 == 0) wg::bulk_wait_all();
  }
};

// TMA stores of both boxes of a warpgroup's 128-column plane into output map `map` at column c0,
// row m0 (Plane::emit's `store`).
struct StoreBoxes {
  const CUtensorMap* map;
  int c0, m0, g;
  __device__ void operator()(uint32_t addr) const {
    wg::tma_store_4d(map, addr, c0, m0, g, 0);
    wg::tma_store_4d(map, addr + kBoxBytes, c0 + 64, m0, g, 0);
  }
};

// ---- M-grouped ---------------------------------------------------------------------------------
template <class T, Major LB, Epi E>
__global__ void __launch_bounds__(kThreads, 1)
    m_grouped_gemm(const __grid_constant__ MGroupedParams<T> p,
                   const __grid_constant__ MGroupedMaps maps) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Ring ring(smem_raw);
  ring.init();
  constexpr bool kSwiglu = E == Epi::SwigluForward;
  const int64_t n_tiles = kSwiglu ? ceil_div(p.n, kSwigluCols) : ceil_div(p.n, kBN);
  const int64_t total = p.groups.tile_offsets[p.groups.count] * n_tiles;
  const int num_k_tiles = static_cast<int>(ceil_div(p.k, kBK));
  int use = 0;  // k-tiles through the ring so far (the same count on both sides)

  if (threadIdx.x < kProducerThreads) {  // ---- producer: one thread issues every copy
    wg::regs_decrease<56>();
    if (threadIdx.x != 0) return;
    MTile next = blockIdx.x < total ? m_tile(p.groups, blockIdx.x, n_tiles) : MTile{};
    for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const MTile at = next;
      const TileInfo info{{at.m0, at.m_end, at.nt, at.g}};
      for (int kt = 0; kt < num_k_tiles; ++kt, ++use) {
        const Slot s = acquire(ring, use, kStageBytes, kt == 0, info);
        const uint32_t a = ring.stage(s.stage), b = a + kATileBytes, bar = ring.full(s.stage);
        const int k0 = kt * kBK, g = at.g;
        wg::tma_load_4d(a, &maps.a, bar, k0, static_cast<int>(at.m0), 0, 0);
        if constexpr (LB == Major::K) {  // two [128 rows][64 K] boxes
          const int r0 = static_cast<int>(at.nt * (kSwiglu ? kSwigluCols : kBN));
          const int r1 = kSwiglu ? static_cast<int>(p.n) + r0 : r0 + 128;  // SwiGLU: up rows
          wg::tma_load_4d(b, &maps.b, bar, k0, r0, g, 0);
          wg::tma_load_4d(b + 128 * kRowBytes, &maps.b, bar, k0, r1, g, 0);
        } else {  // four [64 K][64 N] boxes
#pragma unroll
          for (int c = 0; c < kBN / 64; ++c)
            wg::tma_load_4d(b + c * kBoxBytes, &maps.b, bar, static_cast<int>(at.nt * kBN) + 64 * c,
                            k0, g, 0);
        }
        // The next tile's lookup, while the stages ahead keep the consumers busy.
        if (kt == 0 && tile + gridDim.x < total) next = m_tile(p.groups, tile + gridDim.x, n_tiles);
      }
    }
    return;
  }

  // ---- consumers
  wg::regs_increase<224>();
  const int cw = threadIdx.x / 128 - 1;  // rows [64cw, 64cw + 64) of the tile
  const Fragment f;
  auto desc = [&](uint32_t stage, int kk) {
    const uint32_t a = stage, b = stage + kATileBytes;
    Descs d;
    d.a = wg::make_desc(a + cw * 64 * kRowBytes + kk * 32, 16, 1024);
    d.b = LB == Major::K ? wg::make_desc(b + kk * 32, 16, 1024)
                         : wg::make_desc(b + kk * 16 * kRowBytes, kBoxBytes, 1024);
    return d;
  };
  const Plane<T> plane(smem_raw, ring, cw);
  const int lr0 = f.row0 - 64 * cw;  // the fragment's first row in the warpgroup's plane
  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    MTile at;
    float acc[128];
    consume<T, 0, LB == Major::MN ? 1 : 0>(
        ring, use, desc,
        [&](const TileInfo& t) {
          at = MTile{t.v[2], t.v[0], t.v[1], static_cast<int32_t>(t.v[3])};
          return num_k_tiles;
        },
        [](uint32_t, int) {}, acc);
    const int64_t wg_m0 = at.m0 + 64 * cw;  // this warpgroup's rows [wg_m0, wg_m0 + 64)
    const int64_t wg_rows = at.m_end - wg_m0;

    const bool whole = wg_rows >= 64;  // TMA stores (else row by row: the group ends here)
    const int m0 = static_cast<int>(wg_m0);
    if constexpr (E == Epi::Store) {
      T* out = static_cast<T*>(p.epi.out);
#pragma unroll
      for (int h = 0; h < kBN / kPlaneCols; ++h) {
        const int64_t c0 = at.nt * kBN + kPlaneCols * h;
        plane.emit(
            f, lr0, 16 * h, whole, wg_rows, p.n - c0,
            [&](int r, int j) {
              return Plane<T>::pack(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
            },
            StoreBoxes{&maps.out[0], static_cast<int>(c0), m0, 0},
            [&](int row) { return out + (wg_m0 + row) * p.epi.ld + c0; });
      }
    } else if constexpr (E == Epi::SwigluForward) {
      // Training: the rounded gate pre-activations (accumulator blocks 0..15), then the up ones
      // (16..31); then act(gate)·up.
      const int64_t i0 = at.nt * kSwigluCols, I = p.epi.inter, cols = I - i0;
      T* gu = p.epi.gate_up;
      auto rounded = [&](int r, int j) {
        return Plane<T>::pack(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
      };
      if (gu) {
        plane.emit(f, lr0, 0, whole, wg_rows, cols, rounded,
                   StoreBoxes{&maps.out[0], static_cast<int>(i0), m0, 0},
                   [&](int row) { return gu + (wg_m0 + row) * 2 * I + i0; });
        plane.emit(f, lr0, 16, whole, wg_rows, cols, rounded,
                   StoreBoxes{&maps.out[1], static_cast<int>(i0), m0, 0},
                   [&](int row) { return gu + (wg_m0 + row) * 2 * I + I + i0; });
      }
      T* act_out = p.epi.act;
      with_activation(p.epi.activation, [&](auto kind) {
        constexpr uint32_t kAct = decltype(kind)::value;
        plane.emit(
            f, lr0, 0, whole, wg_rows, cols,
            [&](int r, int j) {  // accumulators j: gate, j + 16: its up
              const int ju = j + kSwigluCols / 8;
              const SwigluForwardValue v0 =
                  swiglu_forward_value<kAct, T>(acc[4 * j + 2 * r], acc[4 * ju + 2 * r]);
              const SwigluForwardValue v1 =
                  swiglu_forward_value<kAct, T>(acc[4 * j + 2 * r + 1], acc[4 * ju + 2 * r + 1]);
              return Plane<T>::pack(v0.a, v1.a);
            },
            StoreBoxes{&maps.out[2], static_cast<int>(i0), m0, 0},
            [&](int row) { return act_out + (wg_m0 + row) * I + i0; });
      });
      if (tile + gridDim.x >= total) plane.drain();  // (here: after the loop, ptxas spilled)
    }
  }
  if constexpr (E == Epi::Store) plane.drain();
#endif
}

// ---- K-grouped (weight gradients) ---------------------------------------------------------------
// C_g[m, n] = Σ_{rows r of g} A[r][m] · B[r][n]; tiles 128 (M) × 256 (N), a persistent walk over
// (group, M tile, N tile). A k-tile is 64 rows. Rows past the group's end must add nothing: TMA
// copies the next group's rows there (or zeros past the tensor), which the consumers overwrite
// with zeros in the tail k-tile before its wgmma (those rows may hold anything, an infinity
// included, and 0 · inf is not 0).
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    k_grouped_gemm(const __grid_constant__ KGroupedParams<T> p,
                   const __grid_constant__ KGroupedMaps maps) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Ring ring(smem_raw);
  ring.init();
  const int64_t m_tiles = ceil_div(p.m_store, kBM), n_tiles = ceil_div(p.n, kBN);
  const int64_t per_group = m_tiles * n_tiles, total = per_group * p.groups.count;
  struct At {
    int g;
    int64_t m0, n0, r0, r1;
    int num_k_tiles;
  };
  // The tile's group and C position from its index; its rows [r0, r1) from the group offsets
  // (global memory: the producer looks them up and hands them over with the first k-tile).
  auto place = [&](int64_t tile) {
    At t;
    t.g = static_cast<int>(tile / per_group);
    const int64_t rest = tile % per_group;
    t.m0 = rest / n_tiles * kBM;
    t.n0 = rest % n_tiles * kBN;
    return t;
  };
  auto with_rows = [](At t, int64_t r0, int64_t r1) {
    t.r0 = r0;
    t.r1 = r1;
    t.num_k_tiles = static_cast<int>(ceil_div(r1 - r0, kBK));
    return t;
  };
  auto at_of = [&](int64_t tile) {
    const At t = place(tile);
    return with_rows(t, p.groups.offsets[t.g], p.groups.offsets[t.g + 1]);
  };
  int use = 0;

  if (threadIdx.x < kProducerThreads) {  // ---- producer: one thread issues every copy
    wg::regs_decrease<56>();
    if (threadIdx.x != 0) return;
    At next = blockIdx.x < total ? at_of(blockIdx.x) : At{};
    for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const At t = next;
      const TileInfo info{{t.r0, t.r1, 0, 0}};
      // A group without rows still sends one stage (no copies) to carry its TileInfo.
      for (int kt = 0; kt < (t.num_k_tiles > 0 ? t.num_k_tiles : 1); ++kt, ++use) {
        const Slot s = acquire(ring, use, t.num_k_tiles > 0 ? kStageBytes : 0, kt == 0, info);
        if (t.num_k_tiles > 0) {
          const uint32_t a = ring.stage(s.stage), b = a + kATileBytes, bar = ring.full(s.stage);
          const int r = static_cast<int>(t.r0 + static_cast<int64_t>(kt) * kBK);
#pragma unroll
          for (int c = 0; c < kBM / 64; ++c)
            wg::tma_load_4d(a + c * kBoxBytes, &maps.a_tile, bar, static_cast<int>(t.m0) + 64 * c,
                            r, 0, 0);
#pragma unroll
          for (int c = 0; c < kBN / 64; ++c)
            wg::tma_load_4d(b + c * kBoxBytes, &maps.b_tile, bar, static_cast<int>(t.n0) + 64 * c,
                            r, 0, 0);
        }
        // The next tile's rows, while the stages ahead keep the consumers busy.
        if (kt == 0 && tile + gridDim.x < total) next = at_of(tile + gridDim.x);
      }
    }
    return;
  }

  // ---- consumers
  wg::regs_increase<224>();
  const int cw = threadIdx.x / 128 - 1;
  const Fragment f;
  auto desc = [&](uint32_t stage, int kk) {
    const uint32_t a = stage, b = stage + kATileBytes;
    Descs d;
    d.a = wg::make_desc(a + cw * kBoxBytes + kk * 16 * kRowBytes, kBoxBytes, 1024);
    d.b = wg::make_desc(b + kk * 16 * kRowBytes, kBoxBytes, 1024);
    return d;
  };
  const Plane<T> plane(smem_raw, ring, cw);
  const int lr0 = f.row0 - 64 * cw;
  // The tail k-tile's rows [valid, 64) of the TMA-copied operands' boxes become zeros, shared out
  // over both consumer warpgroups (B is read by both): stores, the proxy fence, then a barrier of
  // the 256 consumer threads before either warpgroup's wgmma reads them.
  auto zero_tail = [&](const At& t, uint32_t stage, int kt) {
    const int64_t valid = t.r1 - (t.r0 + static_cast<int64_t>(kt) * kBK);
    if (valid >= kBK) return;
    const int ct = threadIdx.x - kProducerThreads, chunks = (kBK - static_cast<int>(valid)) * 8;
    auto clear = [&](uint32_t box) {
      for (int i = ct; i < chunks; i += kConsumerWarps * 32) {
        const uint32_t at = box + (static_cast<uint32_t>(valid) + i / 8) * kRowBytes + (i % 8) * 16;
        *reinterpret_cast<uint4*>(__cvta_shared_to_generic(at)) = make_uint4(0, 0, 0, 0);
      }
    };
    for (int c = 0; c < kBM / 64; ++c) clear(stage + c * kBoxBytes);
    for (int c = 0; c < kBN / 64; ++c) clear(stage + kATileBytes + c * kBoxBytes);
    wg::fence_proxy_async();
    wg::named_sync(3, kConsumerWarps * 32);
  };
  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    At t = place(tile);
    float acc[128];
    consume<T, 1, 1>(
        ring, use, desc,
        [&](const TileInfo& info) {
          t = with_rows(t, info.v[0], info.v[1]);
          return t.num_k_tiles;
        },
        [&](uint32_t stage, int kt) { zero_tail(t, stage, kt); }, acc);
    T* out = p.out + static_cast<int64_t>(t.g) * p.m_store * p.n;
    if (!p.accumulate) {  // by TMA (accumulating rounds once, after the add: stored directly)
      const int64_t wg_m0 = t.m0 + 64 * cw;
      auto store = [&](const auto& value) {
#pragma unroll
        for (int h = 0; h < kBN / kPlaneCols; ++h) {
          const int c0 = static_cast<int>(t.n0 + kPlaneCols * h), m0 = static_cast<int>(wg_m0);
          // [groups][M][N]: TMA leaves out what lies past M or N.
          plane.emit(f, lr0, 16 * h, true, 0, 0, value, StoreBoxes{&maps.out, c0, m0, t.g},
                     [&](int) { return out; });
        }
      };
      if (t.num_k_tiles == 0)  // a group without rows: zeros
        store([](int, int) { return 0u; });
      else
        store([&](int r, int j) {
          return Plane<T>::pack(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
        });
      continue;
    }
    if (t.num_k_tiles == 0) continue;  // adds zeros
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = t.m0 + f.row0 + 8 * r;
      if (row >= p.m_store) continue;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const int64_t col = t.n0 + 8 * j + f.col0;
        if (col >= p.n) continue;  // N % 8 == 0: col + 1 < N too
        epi_k_grouped(out + row * p.n + col, acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1], true);
      }
    }
  }
  plane.drain();
#endif
}

}  // namespace megablocks::cuda::tma
