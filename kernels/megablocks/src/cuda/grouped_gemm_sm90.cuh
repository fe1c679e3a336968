// grouped_gemm_sm90.cuh — the Hopper (sm_90a) path of the grouped GEMMs: the M-grouped and
// K-grouped problems, parameters and epilogues of grouped_gemm.cuh, computed with wgmma
// (m64n128k16, both operands from shared memory) instead of mma.sync. moe_cuda.cu picks it on
// sm_90 (the default there; HK_MEGABLOCKS_GEMM=mma keeps the mma.sync kernels). Not for the CPU
// emulation of the device (wgmma cannot be emulated).
//
// Tiles 128×128×64, 256 threads = 2 warpgroups, warpgroup w owning C rows [64w, 64w + 64) × all
// 128 columns (64 f32 accumulators per thread). All threads copy the operands with cp.async (16
// bytes each) into shared tiles laid out exactly as TMA's 128-byte swizzle writes them, which is
// what the wgmma descriptors (hk/kernel_sdk_sm90.cuh make_desc) read. cp.async rather than TMA
// because the activations' rows are gathered through the token permutation (no tensor map
// describes them); one copy path for both operands keeps the kernel simple. Layouts:
//   K-major  [rows][64 K]          128 bytes a row; 16-byte chunk c of row r at chunk c ^ (r % 8)
//   MN-major [64 K][128 MN]        two boxes [64 K][64 MN] (8 KB apart), the same swizzle in each
// Descriptors as fwd_sm90.cuh / bwd_sm90.cuh use them (GPU-tested there): K-major (LBO 16, SBO
// 1024, +32 bytes per k16 step), MN-major (LBO = the box stride, SBO 1024, +2048 bytes per k16).
// Pipeline (grouped_gemm.cuh cp_async_pipeline): 3 stages (96 KB), so two blocks share an SM and
// one's barriers and epilogue overlap the other's wgmma. Per k-tile: wait for this thread's copies
// of the tile, fence.proxy.async (its generic-proxy writes become visible to wgmma's async proxy),
// __syncthreads (everyone's copies landed, everyone's wgmma of the previous tile done), wgmma
// fence / 4 × wgmma / commit, the copies of tile + 2 into the stage freed last iteration (while
// the wgmma run), wait 0.
// Requirements as grouped_gemm.cuh's (contiguous dimensions multiples of 8, 16-byte aligned).
#pragma once

#include "grouped_gemm.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace megablocks::cuda::sm90 {

namespace wg = hk::sdk::cuda::sm90;

inline constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3, kThreads = 256;
inline constexpr uint32_t kTileBytes = kBM * kBK * 2;    // one operand's tile (128 × 64 16-bit)
inline constexpr uint32_t kBoxBytes = kBK * 128;         // MN-major: [64 K][64 MN]
inline constexpr uint32_t kStageBytes = 2 * kTileBytes;  // A then B
inline constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + the 1024-byte realignment
inline constexpr int kChunks = kBM * kBK / 8 / kThreads;         // 16-byte copies per operand
static_assert(kBM == cuda::kBM, "the routing sizes the M tiles (tile offsets) in kBM rows");
static_assert(kBN == 128, "the SwiGLU column interleave and the wgmma shape assume 128 columns");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Byte offset of 16-byte chunk `chunk` (0..7) of 128-byte row `row` in a swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Copies k-tile [k0, k0 + 64) of K-major rows into `tile`: this thread's slot c is tile row
// tid / 8 + 32c (stored at rows[c], ok[c]: it exists), chunk tid % 8; the rest zero-filled.
template <class T>
__device__ __forceinline__ void load_k_major(uint32_t tile, const T* const (&rows)[kChunks],
                                             const bool (&ok)[kChunks], const T* fallback,
                                             int64_t k0, int64_t k) {
  const int chunk = threadIdx.x % 8;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int r = threadIdx.x / 8 + 32 * c;
    const bool valid = ok[c] && k0 + chunk * 8 < k;
    cp_async16_shared(tile + swizzled(r, chunk), valid ? rows[c] + k0 + chunk * 8 : fallback,
                      valid);
  }
}

// Copies rows [r, r + 64) (those below r_end, gathered through op.gather when set) and columns
// [mn0, mn0 + 128) (those below mn_end) of a row-stored operand into an MN-major tile.
template <class T>
__device__ __forceinline__ void load_mn_major(uint32_t tile, const Operand<T>& op, const T* base,
                                              int64_t r, int64_t r_end, int64_t mn0,
                                              int64_t mn_end) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int idx = threadIdx.x + c * kThreads;
    const int kr = idx / 16, mc = idx % 16;  // k row, 8-column chunk (two boxes of 8)
    const bool ok = r + kr < r_end && mn0 + mc * 8 < mn_end;
    const int64_t stored = ok ? (op.gather ? op.gather[r + kr] : r + kr) : 0;
    cp_async16_shared(tile + (mc / 8) * kBoxBytes + swizzled(kr, mc % 8),
                      ok ? base + stored * op.ld + mn0 + mc * 8 : op.ptr, ok);
  }
}

// Accumulates one 128×128 tile over `num_k_tiles` k-tiles: `load(stage_addr, kt)` issues the
// copies of k-tile kt (A at stage_addr, B at stage_addr + kTileBytes). LA / LB: the operands'
// shared layouts (K-major or MN-major, as the copies wrote them).
template <class T, Major LA, Major LB, class Load>
__device__ __forceinline__ void wgmma_main_loop(uint32_t smem, int num_k_tiles, const Load& load,
                                                float (&acc)[64]) {
  const int warpgroup = threadIdx.x / 128;
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  auto load_stage = [&](int stage, int kt) { load(smem + stage * kStageBytes, kt); };
  // this thread's cp.async writes (generic proxy) before the wgmma reads (async proxy)
  auto publish = [] { wg::fence_proxy_async(); };
  auto compute = [&](int stage) {
    const uint32_t a = smem + stage * kStageBytes, b = a + kTileBytes;
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t da =
          LA == Major::K
              ? wg::make_desc(a + warpgroup * 64 * 128 + kk * 32, 16, 1024)
              : wg::make_desc(a + warpgroup * kBoxBytes + kk * 16 * 128, kBoxBytes, 1024);
      const uint64_t db = LB == Major::K ? wg::make_desc(b + kk * 32, 16, 1024)
                                         : wg::make_desc(b + kk * 16 * 128, kBoxBytes, 1024);
      wg::wgmma_ss<kBN, T, LA == Major::MN ? 1 : 0, LB == Major::MN ? 1 : 0>(acc, da, db, 1);
    }
    wg::wgmma_commit();
  };
  auto retire = [&] {
    wg::wgmma_wait<0>();  // this warpgroup's reads of the stage are done
    wg::fence_regs(acc);
  };
  cp_async_pipeline<kStages>(num_k_tiles, load_stage, publish, compute, retire);
}

// Where thread's accumulator acc[4j + 2r + q] sits in the 128×128 tile (m64nNk16 layout):
// row 64·warpgroup + 16·warp + lane/4 + 8r, column 8j + 2·(lane % 4) + q.
struct Fragment {
  int row0, col0;
  __device__ Fragment() {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    row0 = (threadIdx.x / 128) * 64 + warp * 16 + lane / 4;
    col0 = 2 * (lane % 4);
  }
};

// ---- M-grouped ---------------------------------------------------------------------------------
template <class T, Major LB, Epi E>
__global__ void __launch_bounds__(kThreads, 2) m_grouped_gemm(const MGroupedParams<T> p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms: 1024 B
  constexpr bool kSwiglu = E == Epi::SwigluForward;
  constexpr int kSwigluCols = kBN / 2;  // a SwiGLU tile: 64 gate columns, then their 64 up ones
  const int64_t n_tiles = kSwiglu ? ceil_div(p.n, kSwigluCols) : ceil_div(p.n, kBN);
  const int64_t total = p.groups.tile_offsets[p.groups.count] * n_tiles;
  const int tid = threadIdx.x;
  const int num_k_tiles = static_cast<int>(ceil_div(p.k, kBK));
  const Fragment f;

  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const MTile at = m_tile(p.groups, tile, n_tiles);  // rows [at.m0, at.m_end) of group at.g
    const int64_t n0 = at.nt * kBN;
    const T* b_base = p.b.ptr + at.g * p.b.group_stride;

    // This thread copies the same A rows (and K-major B rows) in every k-tile: resolve them once.
    const T* a_row[kChunks];
    bool a_ok[kChunks];
    const T* b_row[kChunks];
    bool b_ok[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int r = tid / 8 + 32 * c;
      a_ok[c] = at.m0 + r < at.m_end;
      const int64_t stored = a_ok[c] ? (p.a.gather ? p.a.gather[at.m0 + r] : at.m0 + r) : 0;
      a_row[c] = p.a.ptr + stored * p.a.ld;
      if constexpr (LB == Major::K) {
        int64_t row;
        if constexpr (kSwiglu) {  // tile column r: gate of i, or (r ≥ 64) up of i
          const int64_t i = at.nt * kSwigluCols + r % kSwigluCols;
          b_ok[c] = i < p.n;
          row = r >= kSwigluCols ? p.n + i : i;
        } else {
          row = n0 + r;
          b_ok[c] = row < p.n;
        }
        b_row[c] = b_base + (b_ok[c] ? row : 0) * p.b.ld;
      }
    }
    auto load = [&](uint32_t stage, int kt) {
      const int64_t k0 = static_cast<int64_t>(kt) * kBK;
      load_k_major(stage, a_row, a_ok, p.a.ptr, k0, p.k);
      if constexpr (LB == Major::K)
        load_k_major(stage + kTileBytes, b_row, b_ok, p.b.ptr, k0, p.k);
      else
        load_mn_major(stage + kTileBytes, p.b, b_base, k0, p.k < p.b_rows ? p.k : p.b_rows, n0,
                      p.n);
    };
    float acc[64];
    wgmma_main_loop<T, Major::K, LB>(smem, num_k_tiles, load, acc);

    // ---- epilogue (registers to global memory; only the SwiGLU backward stages its saved
    // gate/up through the free stages)
    if constexpr (E == Epi::Store || E == Epi::StoreF32) {
      using Out = std::conditional_t<E == Epi::Store, T, float>;
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
          for (int j = 0; j < kSwigluCols / 8; ++j) {  // accumulators j: gate, j + 8: its up
            const int64_t col = at.nt * kSwigluCols + 8 * j + f.col0;
            if (col >= p.n) continue;  // I % 8 == 0: col + 1 < I too
            const float gate[2] = {acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]};
            const int ju = j + kSwigluCols / 8;
            const float up[2] = {acc[4 * ju + 2 * r], acc[4 * ju + 2 * r + 1]};
            epi_swiglu_forward<decltype(kind)::value>(p.epi, row, col, gate, up);
          }
        }
      });
    } else {  // SwigluBackward: acc = d(act) / weight, i.e. dy·down_w for rows of the tile
      // The tile's saved gate and up columns into the (now free) stages, coalesced, all in
      // flight at once; rows padded by 16 bytes so a warp's 8 rows of a fragment hit 32 banks.
      constexpr int kLd = kBN + 8, kRowChunks = kBN / 8;
      static_assert(2 * kBM * kLd * sizeof(T) <= kStages * kStageBytes, "saved tile fits");
      T* saved = reinterpret_cast<T*>(smem_raw + (smem - smem_addr(smem_raw)));
      const int64_t I = p.epi.inter;
      for (int i = tid; i < kBM * 2 * kRowChunks; i += kThreads) {
        const int local = i / (2 * kRowChunks), c = i % (2 * kRowChunks);
        const int part = c / kRowChunks, chunk = c % kRowChunks;  // part 0: gate, 1: up
        const int64_t row = at.m0 + local, col = n0 + 8 * chunk;
        const bool ok = row < at.m_end && col < p.n;  // I % 8 == 0: whole chunks
        cp_async16_shared(smem + ((part * kBM + local) * kLd + 8 * chunk) * sizeof(T),
                          ok ? p.epi.gate_up + row * 2 * I + part * I + col : p.epi.gate_up, ok);
      }
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      const int lane = tid % 32;
      with_activation(p.epi.activation, [&](auto kind) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int local = f.row0 + 8 * r;
          const int64_t row = at.m0 + local;
          float part = 0.0f;
          if (row < at.m_end) {
            const float w = round_as<T>(p.epi.row_weight[row]);
#pragma unroll
            for (int j = 0; j < kBN / 8; ++j) {
              const int64_t col = n0 + 8 * j + f.col0;
              if (col >= p.n) continue;
              const float d[2] = {acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]};
              const T* g = saved + local * kLd + 8 * j + f.col0;
              epi_swiglu_backward<decltype(kind)::value>(p.epi, row, col, w, d,
                                                         gate_up_pair(g, g + kBM * kLd), part);
            }
          }
          // A row's 128 columns are held by the four lanes of one quad: sum them in a fixed order.
          part += __shfl_xor_sync(0xffffffffu, part, 1);
          part += __shfl_xor_sync(0xffffffffu, part, 2);
          if (lane % 4 == 0 && row < at.m_end) p.epi.partial[row * n_tiles + at.nt] = part;
        }
      });
      __syncthreads();  // the next tile's copies overwrite the saved tile
    }
  }
#endif
}

// ---- K-grouped (weight gradients) ---------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(kThreads, 2) k_grouped_gemm(const KGroupedParams<T> p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const int g = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM,
                n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t r0 = p.groups.offsets[g], r1 = p.groups.offsets[g + 1];
  const int num_k_tiles = static_cast<int>(ceil_div(r1 - r0, kBK));
  auto load = [&](uint32_t stage, int kt) {
    const int64_t r = r0 + static_cast<int64_t>(kt) * kBK;
    load_mn_major(stage, p.a, p.a.ptr, r, r1, m0, p.m);
    load_mn_major(stage + kTileBytes, p.b, p.b.ptr, r, r1, n0, p.n);
  };
  float acc[64];
  wgmma_main_loop<T, Major::MN, Major::MN>(smem, num_k_tiles, load, acc);

  const Fragment f;
  const int64_t at = static_cast<int64_t>(g) * p.m_store * p.n;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = m0 + f.row0 + 8 * r;
    if (row >= p.m_store) continue;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int64_t col = n0 + 8 * j + f.col0;
      if (col >= p.n) continue;  // N % 8 == 0: col + 1 < N too
      if (p.out_f32)             // split-K partials, summed by the caller
        *reinterpret_cast<float2*>(p.out_f32 + at + row * p.n + col) =
            make_float2(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
      else
        epi_k_grouped(p.out + at + row * p.n + col, acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1],
                      p.accumulate);
    }
  }
#endif
}

}  // namespace megablocks::cuda::sm90
