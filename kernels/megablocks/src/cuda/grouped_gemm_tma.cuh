// grouped_gemm_tma.cuh — the Hopper (sm_90a) grouped GEMMs of the experts with TMA copies and a
// warp-specialised pipeline: the same M-grouped and K-grouped problems, parameters, tile walk and
// per-pair epilogues as grouped_gemm.cuh / grouped_gemm_sm90.cuh, for bf16 (moe_cuda.cu picks them
// with HK_MEGABLOCKS_GEMM=tma; f16 and the router's GEMMs keep the wgmma kernels). Not for the CPU
// emulation of the device (TMA and wgmma cannot be emulated).
//
// Why another kernel set: the wgmma kernels copy with cp.async from every thread and synchronise
// the block once per k-tile, so the tensor cores wait on the copies' issue and the barrier (they
// reach ~50 % of the dense rate, docs/performance.md). Here the copies need no thread's time:
//   - 384 threads: warpgroup 0 the producer (setmaxnreg down to 40 registers; its first warp
//     issues every copy), warpgroups 1 and 2 the consumers (up to 232), 64 tile rows each;
//   - tiles 128 × 256 × 64, four stages (48 KB each) in a ring of "full" mbarriers (the copies'
//     bytes complete them) and "empty" ones (each consumer warp arrives once it is done reading);
//     the consumers keep one wgmma group in flight (m64n256k16, both operands in shared memory);
//   - persistent: one block an SM walks the tiles; the producer runs ahead into the next tile's
//     stages while the consumers store the last one.
// Copies are TMA tensor copies into the 128-byte swizzle the wgmma descriptors read. Rows that
// are gathered through an index (the tokens of the permutation) are copied one row a copy: a box
// of 64 elements × 1 row into that row's place in the tile; the swizzle follows the shared
// address, so the tile is the one a whole-tile copy would have written. Rows past a group's end
// are copied from a row past the tensor's end, which TMA fills with zeros and still counts (the
// K-grouped reduction needs them zero; the M-grouped kernel masks them at the store).
// Maps (all 4-D for the SDK's tma_load_4d; moe_cuda.cu encodes them per call on the host):
//   activations [rows][cols]       dims {cols, rows, 1, 1}; boxes {64, 128} (M-grouped A tile),
//                                  {64, 64} (K-grouped tile), {64, 1} (one row)
//   weights     [E][rows][cols]    dims {cols, rows, E, 1}; boxes {64, 128} (K-major B: [N][K])
//                                  or {64, 64} (MN-major B: [K][N])
// Requirements: those of the other kernel sets (contiguous dimensions multiples of 8, 16-byte
// aligned) and fewer than 2^31 rows.
#pragma once

#include <cuda.h>

#include "grouped_gemm.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace megablocks::cuda::tma {

namespace wg = hk::sdk::cuda::sm90;

inline constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
inline constexpr int kConsumerWarps = 8;
inline constexpr uint32_t kRowBytes = kBK * 2;            // one 64-element row of a tile
inline constexpr uint32_t kBoxBytes = 64 * kRowBytes;     // a [64][64] box
inline constexpr uint32_t kATileBytes = kBM * kRowBytes;  // A: 128 rows (K-major) or 2 boxes
inline constexpr uint32_t kBTileBytes = kBN * kRowBytes;  // B: 256 rows (K-major) or 4 boxes
inline constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;
inline constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* realignment */ + 128 /* bars */;
inline constexpr int kSwigluCols = kBN / 2;  // a SwiGLU tile: 128 gate columns, then their up
static_assert(kBM == cuda::kBM, "the routing sizes the M tiles (tile offsets) in kBM rows");

struct MGroupedMaps {
  CUtensorMap a;       // rows of A: whole tiles ({64, 128} boxes) or, gathered, one row a copy
  CUtensorMap b;       // the experts' weights, K-major ({64, 128} boxes) or MN-major ({64, 64})
  int32_t a_rows = 0;  // rows of A's tensor (a row coordinate past them reads zeros)
};

struct KGroupedMaps {
  CUtensorMap a_tile, a_row;  // [rows][M]: {64, 64} boxes (unused when gathered) and one-row ones
  CUtensorMap b_tile, b_row;  // [rows][N]: likewise
  int32_t a_rows = 0, b_rows = 0;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The block's shared memory: the stages from the first 1024-byte boundary (swizzle atoms), then
// the mbarriers. full(s): the copies of stage s landed; empty(s): the consumers are done with it.
struct Ring {
  uint32_t base, bars;
  __device__ explicit Ring(const unsigned char* raw)
      : base((smem_addr(raw) + 1023u) & ~1023u), bars(base + kStages * kStageBytes) {}
  __device__ uint32_t stage(int s) const { return base + s * kStageBytes; }
  __device__ uint32_t full(int s) const { return bars + 8 * s; }
  __device__ uint32_t empty(int s) const { return bars + 8 * (kStages + s); }
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

// The producer's side of one k-tile: waits for its stage to be free (the `use`-th pass over the
// ring), announces the stage's bytes on its full barrier; lane 0 of the producer warp alone.
struct Slot {
  int stage;
  uint32_t parity;
  __device__ explicit Slot(int use) : stage(use % kStages), parity((use / kStages) & 1) {}
};
__device__ __forceinline__ Slot acquire(const Ring& ring, int use) {
  const Slot s(use);
  if (use >= kStages) wg::mbar_wait(ring.empty(s.stage), s.parity ^ 1);
  if (threadIdx.x == 0) wg::mbar_expect_tx(ring.full(s.stage), kStageBytes);
  __syncwarp();
  return s;
}

// The consumers' k-loop of one tile: waits for each stage, issues its 4 wgmma (m64n256k16) into
// acc, keeps one group in flight and releases a stage once the group reading it is done.
// `desc(stage_addr, kk)` gives the (A, B) descriptors of step kk.
template <class T, int TransA, int TransB, class Desc>
__device__ __forceinline__ void consume(const Ring& ring, int& use, int num_k_tiles,
                                        const Desc& desc, float (&acc)[128]) {
  const bool lane0 = threadIdx.x % 32 == 0;
  for (int kt = 0; kt < num_k_tiles; ++kt, ++use) {
    const Slot s(use);
    wg::mbar_wait(ring.full(s.stage), s.parity);
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
  if (num_k_tiles > 0 && lane0) wg::mbar_arrive(ring.empty(Slot(use - 1).stage));
  if (num_k_tiles == 0) {
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  }
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

  if (threadIdx.x < 128) {  // ---- producer
    wg::regs_decrease<40>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const MTile at = m_tile(p.groups, tile, n_tiles);
      int32_t src[kBM / 32];  // gathered: the stored row of tile rows lane + 32i
#pragma unroll
      for (int i = 0; i < kBM / 32; ++i) {
        const int64_t r = at.m0 + lane + 32 * i;
        src[i] = p.a.gather && r < at.m_end ? p.a.gather[r] : maps.a_rows;
      }
      for (int kt = 0; kt < num_k_tiles; ++kt, ++use) {
        const Slot s = acquire(ring, use);
        const uint32_t a = ring.stage(s.stage), b = a + kATileBytes, bar = ring.full(s.stage);
        const int k0 = kt * kBK;
        if (p.a.gather) {
#pragma unroll
          for (int i = 0; i < kBM / 32; ++i)
            wg::tma_load_4d(a + (lane + 32 * i) * kRowBytes, &maps.a, bar, k0, src[i], 0, 0);
        } else if (lane == 0) {
          wg::tma_load_4d(a, &maps.a, bar, k0, static_cast<int>(at.m0), 0, 0);
        }
        if (lane != 0) continue;
        const int g = at.g;
        if constexpr (LB == Major::K) {  // two [128 rows][64 K] boxes
          const int r0 =
              kSwiglu ? static_cast<int>(at.nt * kSwigluCols) : static_cast<int>(at.nt * kBN);
          const int r1 = kSwiglu ? static_cast<int>(p.n) + r0 : r0 + 128;  // SwiGLU: the up rows
          wg::tma_load_4d(b, &maps.b, bar, k0, r0, g, 0);
          wg::tma_load_4d(b + 128 * kRowBytes, &maps.b, bar, k0, r1, g, 0);
        } else {  // four [64 K][64 N] boxes
#pragma unroll
          for (int c = 0; c < kBN / 64; ++c)
            wg::tma_load_4d(b + c * kBoxBytes, &maps.b, bar, static_cast<int>(at.nt * kBN) + 64 * c,
                            k0, g, 0);
        }
      }
    }
    return;
  }

  // ---- consumers
  wg::regs_increase<232>();
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
  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const MTile at = m_tile(p.groups, tile, n_tiles);
    float acc[128];
    consume<T, 0, LB == Major::MN ? 1 : 0>(ring, use, num_k_tiles, desc, acc);

    if constexpr (E == Epi::Store || E == Epi::StoreF32) {
      using Out = std::conditional_t<E == Epi::Store, T, float>;
      const int64_t n0 = at.nt * kBN;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = at.m0 + f.row0 + 8 * r;
        if (row >= at.m_end) continue;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          const int64_t col = n0 + 8 * j + f.col0;
          if (col < p.n)
            epi_store<Out>(p.epi, p.n, row, col, acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
        }
      }
    } else if constexpr (E == Epi::SwigluForward) {
      with_activation(p.epi.activation, [&](auto kind) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = at.m0 + f.row0 + 8 * r;
          if (row >= at.m_end) continue;
#pragma unroll
          for (int j = 0; j < kSwigluCols / 8; ++j) {  // accumulators j: gate, j + 16: its up
            const int64_t col = at.nt * kSwigluCols + 8 * j + f.col0;
            if (col >= p.n) continue;  // I % 8 == 0: col + 1 < I too
            const float gate[2] = {acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]};
            const int ju = j + kSwigluCols / 8;
            const float up[2] = {acc[4 * ju + 2 * r], acc[4 * ju + 2 * r + 1]};
            epi_swiglu_forward<decltype(kind)::value>(p.epi, row, col, gate, up);
          }
        }
      });
    } else {  // SwigluBackward: acc = d(act) / weight
      // The saved gate/up pairs are read through the non-coherent path (read-only for the
      // kernel), eight column blocks at a time before their stores, so no load waits behind a
      // store it might alias (grouped_gemm.cuh load_gate_up says why that matters).
      const int64_t n0 = at.nt * kBN, I = p.epi.inter;
      const int lane = threadIdx.x % 32;
      with_activation(p.epi.activation, [&](auto kind) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = at.m0 + f.row0 + 8 * r;
          float part = 0.0f;
          if (row < at.m_end) {
            const float w = round_as<T>(p.epi.row_weight[row]);
            const T* gu = p.epi.gate_up + row * 2 * I;
#pragma unroll
            for (int j0 = 0; j0 < kBN / 8; j0 += 8) {
              uint32_t g[8], u[8];
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                const int64_t col = n0 + 8 * (j0 + j) + f.col0;
                const bool ok = col < p.n;
                g[j] = ok ? __ldg(reinterpret_cast<const unsigned int*>(gu + col)) : 0u;
                u[j] = ok ? __ldg(reinterpret_cast<const unsigned int*>(gu + I + col)) : 0u;
              }
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                const int64_t col = n0 + 8 * (j0 + j) + f.col0;
                if (col >= p.n) continue;
                const int jj = j0 + j;
                const float d[2] = {acc[4 * jj + 2 * r], acc[4 * jj + 2 * r + 1]};
                GateUp<T> saved;
                memcpy(saved.g, &g[j], sizeof g[j]);
                memcpy(saved.u, &u[j], sizeof u[j]);
                epi_swiglu_backward<decltype(kind)::value>(p.epi, row, col, w, d, saved, part);
              }
            }
          }
          // A row's 256 columns are held by the four lanes of one quad: sum in a fixed order.
          part += __shfl_xor_sync(0xffffffffu, part, 1);
          part += __shfl_xor_sync(0xffffffffu, part, 2);
          if (lane % 4 == 0 && row < at.m_end) p.epi.partial[row * n_tiles + at.nt] = part;
        }
      });
    }
  }
#endif
}

// ---- K-grouped (weight gradients) ---------------------------------------------------------------
// C_g[m, n] = Σ_{rows r of g} A[r][m] · B[r][n]; tiles 128 (M) × 256 (N), a persistent walk over
// (group, M tile, N tile). A k-tile is 64 rows: whole [64][64] boxes when it lies inside the
// group and A is not gathered, else one copy a row, rows past the group's end read as zeros (so
// they add nothing, whatever B holds there: B's rows are finite data or zeros).
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
  auto at_of = [&](int64_t tile) {
    At t;
    t.g = static_cast<int>(tile / per_group);
    const int64_t rest = tile % per_group;
    t.m0 = rest / n_tiles * kBM;
    t.n0 = rest % n_tiles * kBN;
    t.r0 = p.groups.offsets[t.g];
    t.r1 = p.groups.offsets[t.g + 1];
    t.num_k_tiles = static_cast<int>(ceil_div(t.r1 - t.r0, kBK));
    return t;
  };
  int use = 0;

  if (threadIdx.x < 128) {  // ---- producer
    wg::regs_decrease<40>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
      const At t = at_of(tile);
      for (int kt = 0; kt < t.num_k_tiles; ++kt, ++use) {
        const Slot s = acquire(ring, use);
        const uint32_t a = ring.stage(s.stage), b = a + kATileBytes, bar = ring.full(s.stage);
        const int64_t r = t.r0 + static_cast<int64_t>(kt) * kBK;
        // The stored rows of k-rows lane and lane + 32 (or past the tensor: zeros).
        auto stored = [&](const Operand<T>& op, int32_t rows, int i) -> int32_t {
          const int64_t row = r + lane + 32 * i;
          if (row >= t.r1) return rows;
          return op.gather ? op.gather[row] : static_cast<int32_t>(row);
        };
        const bool whole = r + kBK <= t.r1;
        if (p.a.gather || !whole) {
          const int32_t rows[2] = {stored(p.a, maps.a_rows, 0), stored(p.a, maps.a_rows, 1)};
#pragma unroll
          for (int c = 0; c < kBM / 64; ++c)
#pragma unroll
            for (int i = 0; i < 2; ++i)
              wg::tma_load_4d(a + c * kBoxBytes + (lane + 32 * i) * kRowBytes, &maps.a_row, bar,
                              static_cast<int>(t.m0) + 64 * c, rows[i], 0, 0);
        } else if (lane == 0) {
#pragma unroll
          for (int c = 0; c < kBM / 64; ++c)
            wg::tma_load_4d(a + c * kBoxBytes, &maps.a_tile, bar, static_cast<int>(t.m0) + 64 * c,
                            static_cast<int>(r), 0, 0);
        }
        if (p.b.gather) {
          const int32_t rows[2] = {stored(p.b, maps.b_rows, 0), stored(p.b, maps.b_rows, 1)};
#pragma unroll
          for (int c = 0; c < kBN / 64; ++c)
#pragma unroll
            for (int i = 0; i < 2; ++i)
              wg::tma_load_4d(b + c * kBoxBytes + (lane + 32 * i) * kRowBytes, &maps.b_row, bar,
                              static_cast<int>(t.n0) + 64 * c, rows[i], 0, 0);
        } else if (lane == 0) {
#pragma unroll
          for (int c = 0; c < kBN / 64; ++c)
            wg::tma_load_4d(b + c * kBoxBytes, &maps.b_tile, bar, static_cast<int>(t.n0) + 64 * c,
                            static_cast<int>(r), 0, 0);
        }
      }
    }
    return;
  }

  // ---- consumers
  wg::regs_increase<232>();
  const int cw = threadIdx.x / 128 - 1;
  const Fragment f;
  auto desc = [&](uint32_t stage, int kk) {
    const uint32_t a = stage, b = stage + kATileBytes;
    Descs d;
    d.a = wg::make_desc(a + cw * kBoxBytes + kk * 16 * kRowBytes, kBoxBytes, 1024);
    d.b = wg::make_desc(b + kk * 16 * kRowBytes, kBoxBytes, 1024);
    return d;
  };
  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const At t = at_of(tile);
    float acc[128];
    consume<T, 1, 1>(ring, use, t.num_k_tiles, desc, acc);
    T* out = p.out + static_cast<int64_t>(t.g) * p.m_store * p.n;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = t.m0 + f.row0 + 8 * r;
      if (row >= p.m_store) continue;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const int64_t col = t.n0 + 8 * j + f.col0;
        if (col >= p.n) continue;  // N % 8 == 0: col + 1 < N too
        epi_k_grouped(out + row * p.n + col, acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1],
                      p.accumulate);
      }
    }
  }
#endif
}

}  // namespace megablocks::cuda::tma
