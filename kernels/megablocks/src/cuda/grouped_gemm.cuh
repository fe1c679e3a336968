// grouped_gemm.cuh — the grouped GEMMs of the cuda variant: one launch computes a GEMM per expert
// over that expert's rows, with the group sizes read from device memory (no host sync, no
// per-expert launch), on tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate).
//
// Two shapes of grouping:
//   M-grouped  C[rows of group g] = A[rows of g] · op(B_g): the activations' rows are grouped
//              (sorted by expert, optionally gathered through an index array, e.g. the tokens),
//              B_g is expert g's weight, K-major ([N, K], "x·Wᵀ") or MN-major ([K, N], "x·W").
//              A persistent grid walks the tiles; the tile count and each tile's expert come
//              from the group tile offsets on the device (routing.h tile_expert).
//   K-grouped  C_g = Σ_{rows r of group g} A[r]ᵀ ⊗ B[r]: the weight gradients, whose reduction
//              runs over the group's rows; both operands are row-stored (MN-major), either may be
//              gathered. The grid (tiles of C × groups) is fixed; a group without rows writes
//              zeros.
// Tiles: 128×128×32, 8 warps (2×4, 64×32 each), a 4-stage cp.async pipeline, padded shared rows
// (conflict-free ldmatrix). Requirements (checked by the caller): every contiguous dimension
// (K-major K, MN-major M/N) is a multiple of 8 elements and 16-byte aligned; other edges are
// predicated (zero-filled loads, masked stores).
//
// Epilogues (M-grouped): store C (T or f32); the fused SwiGLU of the gate_up GEMM (B's rows
// interleaved so one thread holds gate and up of the same column: writes act(gate)·up and,
// training, the pre-activations); the SwiGLU backward of the d(act) GEMM (reads the saved
// pre-activations and the routing weight, writes d(gate ‖ up), weight·act(gate)·up, and each
// row's partial of d(weight), reduced deterministically per tile).
//
// The Hopper wgmma kernels of the same problems (grouped_gemm_sm90.cuh, the default on sm_90)
// share what is here besides the mma.sync main loop: parameters, the M-grouped tile walk, the
// cp.async pipeline and the per-pair epilogues.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "device_compat.cuh"  // ptx.cuh, or the CPU emulation of the device (see there)
#include "hk/kernel_sdk_cuda.cuh"
#include "routing.h"

namespace megablocks::cuda {

using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::round_as;
using hk::sdk::cuda::to_f32;

inline constexpr int kBM = 128, kBK = 32, kStages = 4, kThreads = 256;
inline constexpr int kWarpsN = 4, kWTM = 64, kMFrag = 4;
inline constexpr int kPad = 8;

// The N extent of a tile: 128 (warp tiles 64×32; 2 blocks per SM) or 256 (64×64 warp tiles: more
// MMAs per fragment load, 1 block per SM). The SwiGLU GEMM covers BN/2 intermediate columns per
// tile (gate and up of each).
template <int BN>
struct TileN {
  static constexpr int kBN = BN;
  static constexpr int kWTN = BN / kWarpsN;
  static constexpr int kNFrag = kWTN / 8;
  static constexpr int kSwigluCols = BN / 2;
  static constexpr int kMinBlocks = BN == 128 ? 2 : 1;
};

enum class Major { K, MN };

// A tile's shared layout: K-major [rows][BK + pad], MN-major [BK][rows + pad].
template <Major L, int Rows>
struct Smem {
  static constexpr int kLd = L == Major::K ? kBK + kPad : Rows + kPad;
  static constexpr int kElems = L == Major::K ? Rows * kLd : kBK * kLd;
  __device__ static int at(int mn, int k) { return L == Major::K ? mn * kLd + k : k * kLd + mn; }
};

template <Major LA, Major LB, int BN>
constexpr int smem_bytes() {
  return kStages * (Smem<LA, kBM>::kElems + Smem<LB, BN>::kElems) * 2;
}

// Two adjacent elements as one 32-bit store (col even, row stride even) or two scalar ones.
template <class T>
__device__ __forceinline__ void store_pair(T* p, float v0, float v1, bool both, bool aligned) {
  if (both && aligned) {
    if constexpr (sizeof(T) == 2) {
      const T pair[2] = {from_f32<T>(v0), from_f32<T>(v1)};
      uint32_t word;
      memcpy(&word, pair, sizeof word);  // not a cast: the array and the word may not alias
      *reinterpret_cast<uint32_t*>(p) = word;
    } else {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    }
    return;
  }
  p[0] = from_f32<T>(v0);
  if (both) p[1] = from_f32<T>(v1);
}

// ---- operands ---------------------------------------------------------------------------------
template <class T>
struct Operand {
  const T* ptr = nullptr;
  int64_t ld = 0;                   // elements between stored rows
  int64_t group_stride = 0;         // elements between the groups' matrices (weights); 0: shared
  const int32_t* gather = nullptr;  // stored row of each logical row (activations); null: identity
};

// Groups: rows [offsets[g], offsets[g + 1]); M-grouped tiles [tile_offsets[g], tile_offsets[g+1]).
struct Groups {
  const int64_t* offsets = nullptr;
  const int64_t* tile_offsets = nullptr;
  int32_t count = 0;
};

enum class Epi { Store, StoreF32, SwigluForward, SwigluBackward };

template <class T>
struct EpiArgs {
  // Store / StoreF32: C[row, col] at out[row·ld + col]
  void* out = nullptr;
  int64_t ld = 0;
  // SwiGLU: I columns; gate_up [rows, 2I] (forward: written when non-null; backward: read),
  // act [rows, I] (forward: act(gate)·up; backward: weight·act(gate)·up), dgate_up [rows, 2I],
  // row weights f32 [rows] (backward), partial f32 [rows, n_tiles] (backward: d(weight) parts)
  int64_t inter = 0;
  uint32_t activation = 0;
  T* gate_up = nullptr;
  T* act = nullptr;
  T* dgate_up = nullptr;
  const float* row_weight = nullptr;
  float* partial = nullptr;
};

// Tile `tile` of an M-grouped walk over `n_tiles` column tiles (both kernel sets walk the same
// device-side list): its group g, rows [m0, m_end) of the group (kBM at most) and column tile nt.
struct MTile {
  int64_t nt, m0, m_end;
  int32_t g;
};
__device__ __forceinline__ MTile m_tile(const Groups& groups, int64_t tile, int64_t n_tiles) {
  const int64_t mt = tile / n_tiles;
  const int32_t g = tile_expert(groups.tile_offsets, groups.count, mt);
  return {tile % n_tiles, groups.offsets[g] + (mt - groups.tile_offsets[g]) * kBM,
          groups.offsets[g + 1], g};
}

// ---- the epilogues, per pair of adjacent columns (col, col + 1) of one row ---------------------
// Shared by these mma.sync kernels and the wgmma ones (grouped_gemm_sm90.cuh), which differ only
// in which thread holds which accumulators; so both paths round and store identically.

// Store / StoreF32: C[row, col..col+1] of an N-column output (col + 1 may be past N).
template <class Out, class T>
__device__ __forceinline__ void epi_store(const EpiArgs<T>& e, int64_t n, int64_t row, int64_t col,
                                          float v0, float v1) {
  store_pair(static_cast<Out*>(e.out) + row * e.ld + col, v0, v1, col + 1 < n, (e.ld % 2) == 0);
}

// Calls f(std::integral_constant<uint32_t, kind>{}) for the activation `kind` (any other value:
// SiLU, as act() reads it), so a SwiGLU epilogue is compiled once per activation with the choice
// folded. A run-time switch inside the unrolled per-pair loops cut them into a basic block per
// pair, and the d(act) epilogue (two transcendental functions a pair) ran one pair at a time.
template <class F>
__device__ __forceinline__ void with_activation(uint32_t kind, const F& f) {
  switch (kind) {
    case hk::kActivationGELU:
      f(std::integral_constant<uint32_t, hk::kActivationGELU>{});
      break;
    case hk::kActivationGELUTanh:
      f(std::integral_constant<uint32_t, hk::kActivationGELUTanh>{});
      break;
    default:
      f(std::integral_constant<uint32_t, hk::kActivationSiLU>{});
  }
}

// SwigluForward: the gate and up accumulators of intermediate columns col, col + 1 (I % 8 == 0,
// so both exist): writes act(gate)·up and, training, the rounded pre-activations.
// One column's SwiGLU forward: the rounded pre-activations g, u and a = act(g)·u (as stored).
struct SwigluForwardValue {
  float g, u, a;
};
template <uint32_t kAct, class T>
__device__ __forceinline__ SwigluForwardValue swiglu_forward_value(float gate, float up) {
  SwigluForwardValue v;
  v.g = round_as<T>(gate);
  v.u = round_as<T>(up);
  v.a = round_as<T>(round_as<T>(act(kAct, v.g)) * v.u);
  return v;
}
template <uint32_t kAct, class T>
__device__ __forceinline__ void epi_swiglu_forward(const EpiArgs<T>& e, int64_t row, int64_t col,
                                                   const float (&gate)[2], const float (&up)[2]) {
  const int64_t I = e.inter;
  float g[2], u[2], a[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const SwigluForwardValue v = swiglu_forward_value<kAct, T>(gate[q], up[q]);
    g[q] = v.g, u[q] = v.u, a[q] = v.a;
  }
  if (e.gate_up) {
    store_pair(e.gate_up + row * 2 * I + col, g[0], g[1], true, true);
    store_pair(e.gate_up + row * 2 * I + I + col, u[0], u[1], true, true);
  }
  store_pair(e.act + row * I + col, a[0], a[1], true, true);
}

// The saved pre-activations (gate, up) of intermediate columns col, col + 1 of a row, for the
// SwiGLU backward, read from `gate` and `up` (global or shared memory). The epilogues read them
// before any of the stores of the same row: to the compiler the stores may alias these loads
// (same element type, no restrict), so interleaved, each load waited a global-memory round trip
// behind the previous pair's stores — that made the d(act) GEMM epilogue-bound (125 TF/s on both
// kernel sets, H200). The mma.sync kernel loads a row's pairs into registers first; the wgmma
// one stages the tile's through shared memory (its 64 accumulators leave no registers for them).
template <class T>
struct GateUp {
  T g[2], u[2];
};
template <class T>
__device__ __forceinline__ GateUp<T> gate_up_pair(const T* gate, const T* up) {
  GateUp<T> s;
  if constexpr (sizeof(T) == 2) {  // col even: 32-bit aligned
    const uint32_t g = *reinterpret_cast<const uint32_t*>(gate);
    const uint32_t u = *reinterpret_cast<const uint32_t*>(up);
    memcpy(s.g, &g, sizeof g);
    memcpy(s.u, &u, sizeof u);
  } else {
    s.g[0] = gate[0], s.g[1] = gate[1], s.u[0] = up[0], s.u[1] = up[1];
  }
  return s;
}
template <class T>
__device__ __forceinline__ GateUp<T> load_gate_up(const EpiArgs<T>& e, int64_t row, int64_t col) {
  const T* gu = e.gate_up + row * 2 * e.inter + col;
  return gate_up_pair(gu, gu + e.inter);
}

// One column's SwiGLU backward: d = d(act)/weight, routing weight w (rounded), the saved
// pre-activations g and u: d(gate), d(up) and w·act; adds the column's term of d(weight) to part.
struct SwigluBackwardValue {
  float dg, du, aw;
};
template <uint32_t kAct, class T>
__device__ __forceinline__ SwigluBackwardValue swiglu_backward_value(float w, float d, float g,
                                                                     float u, float& part) {
  const float s = round_as<T>(act(kAct, g));
  const float a = round_as<T>(s * u);
  part += d * a;
  const float da = w * d;
  return {da * u * act_grad(kAct, g), da * s, w * a};
}

// SwigluBackward: d = d(act)/weight of intermediate columns col, col + 1 of a row with routing
// weight w (rounded) and its saved pre-activations: writes d(gate ‖ up) and w·act; adds the
// pair's terms of d(weight) to the row's running part (in column order).
template <uint32_t kAct, class T>
__device__ __forceinline__ void epi_swiglu_backward(const EpiArgs<T>& e, int64_t row, int64_t col,
                                                    float w, const float (&d)[2],
                                                    const GateUp<T>& saved, float& part) {
  const int64_t I = e.inter;
  float dg[2], du[2], aw[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const SwigluBackwardValue v =
        swiglu_backward_value<kAct, T>(w, d[q], to_f32(saved.g[q]), to_f32(saved.u[q]), part);
    dg[q] = v.dg, du[q] = v.du, aw[q] = v.aw;
  }
  T* dgu = e.dgate_up + row * 2 * I;
  store_pair(dgu + col, dg[0], dg[1], true, true);
  store_pair(dgu + I + col, du[0], du[1], true, true);
  store_pair(e.act + row * I + col, aw[0], aw[1], true, true);
}

// K-grouped: C_g[row, col..col+1] (N % 8 == 0), added to what is there when accumulating.
template <class T>
__device__ __forceinline__ void epi_k_grouped(T* dst, float v0, float v1, bool accumulate) {
  if (accumulate) {
    v0 += to_f32(dst[0]);
    v1 += to_f32(dst[1]);
  }
  store_pair(dst, v0, v1, true, true);
}

// ---- the cp.async pipeline of both kernel sets
// --------------------------------------------------- K-tile kt goes to stage kt % Stages, Stages -
// 1 tiles ahead: `load(stage, kt)` issues its copies. Per k-tile, once this thread's copies of it
// have landed: `publish()` (the wgmma path's proxy fence), a barrier (every thread's copies landed,
// every thread done with tile kt - 1), `compute(stage)`, the copies of tile kt + Stages - 1 into
// the stage tile kt - 1 used, then `retire()`: whatever compute left in flight must be done reading
// its stage when retire returns (mma.sync: nothing, ldmatrix is synchronous; wgmma: the group is
// waited for there, so the tensor cores run while this thread resolves gathered rows and issues the
// next copies). Ends with every copy landed and every thread past the last tile.
template <int Stages, class Load, class Publish, class Compute, class Retire>
__device__ __forceinline__ void cp_async_pipeline(int num_k_tiles, const Load& load,
                                                  const Publish& publish, const Compute& compute,
                                                  const Retire& retire) {
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) {
    if (s < num_k_tiles) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < num_k_tiles; ++kt) {
    cp_async_wait<Stages - 2>();
    publish();
    __syncthreads();
    compute(kt % Stages);
    const int next = kt + Stages - 1;
    if (next < num_k_tiles) load(next % Stages, next);
    cp_async_commit();
    retire();
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages may now be reused (next tile, or the epilogue's scratch)
}

// ---- the shared main loop
// ------------------------------------------------------------------------ Accumulates A[m0..,
// k-range] · op(B)[.., n0..] of one tile into acc. `load(stage, kt)` issues the cp.async copies of
// k-tile kt into `stage`.
template <class T, Major LA, Major LB, int BN, class Load>
__device__ __forceinline__ void main_loop(T* smem, int num_k_tiles, const Load& load,
                                          float (&acc)[kMFrag][TileN<BN>::kNFrag][4]) {
  using SA = Smem<LA, kBM>;
  using SB = Smem<LB, BN>;
  constexpr int kNFrag = TileN<BN>::kNFrag;
  constexpr int kStage = SA::kElems + SB::kElems;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = (warp / kWarpsN) * kWTM, wn = (warp % kWarpsN) * TileN<BN>::kWTN;
  auto load_stage = [&](int stage, int kt) { load(smem + stage * kStage, kt); };
  auto compute = [&](int stage) {
    const T* As = smem + stage * kStage;
    const T* Bs = As + SA::kElems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[kMFrag][4], b[kNFrag][2];
#pragma unroll
      for (int i = 0; i < kMFrag; ++i) {
        if constexpr (LA == Major::K) {
          ldmatrix_x4(a[i], As + SA::at(wm + i * 16 + lane % 16, kk + (lane / 16) * 8));
        } else {
          ldmatrix_x4_trans(a[i], As + SA::at(wm + i * 16 + ((lane / 8) % 2) * 8,
                                              kk + lane % 8 + (lane / 16) * 8));
        }
      }
#pragma unroll
      for (int p = 0; p < kNFrag / 2; ++p) {
        uint32_t r[4];
        if constexpr (LB == Major::K) {
          ldmatrix_x4(
              r, Bs + SB::at(wn + p * 16 + lane % 8 + (lane / 16) * 8, kk + ((lane / 8) % 2) * 8));
        } else {
          ldmatrix_x4_trans(
              r, Bs + SB::at(wn + p * 16 + (lane / 16) * 8, kk + lane % 8 + ((lane / 8) % 2) * 8));
        }
        b[2 * p][0] = r[0];
        b[2 * p][1] = r[1];
        b[2 * p + 1][0] = r[2];
        b[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kMFrag; ++i)
#pragma unroll
        for (int j = 0; j < kNFrag; ++j) mma16816<T>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  };
  const auto nothing = [] {};
  cp_async_pipeline<kStages>(num_k_tiles, load_stage, nothing, compute, nothing);
}

// Copies rows [r, r + kBK) (those below `r_end`) of a row-stored operand, columns
// [mn0, mn0 + Rows) (those below `mn_end`), into an MN-major shared tile: 16-byte copies, rows
// gathered through op.gather when set, the rest zero-filled.
template <class T, int Rows>
__device__ __forceinline__ void load_mn_tile(T* tile, const Operand<T>& op, const T* base,
                                             int64_t r, int64_t r_end, int64_t mn0,
                                             int64_t mn_end) {
  using S = Smem<Major::MN, Rows>;
  constexpr int kChunks = Rows * kBK / 8 / kThreads;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int idx = threadIdx.x + c * kThreads;
    const int kr = idx / (Rows / 8), mc = (idx % (Rows / 8)) * 8;
    const bool ok = r + kr < r_end && mn0 + mc < mn_end;
    const int64_t stored = ok ? (op.gather ? op.gather[r + kr] : r + kr) : 0;
    cp_async16(tile + S::at(mc, kr), ok ? base + stored * op.ld + mn0 + mc : op.ptr, ok);
  }
}

// ---- M-grouped ---------------------------------------------------------------------------------
template <class T>
struct MGroupedParams {
  Operand<T> a;          // K-major activations [rows, K]
  Operand<T> b;          // weights: K-major [N, K] or MN-major [K, N], per group
  int64_t n = 0, k = 0;  // GEMM N (SwiGLU: I, the tile walk covers gate and up) and K
  int64_t b_rows = 0;    // MN-major B: rows of B that exist (K may be padded past them)
  Groups groups;
  EpiArgs<T> epi;
};

template <class T, Major LB, Epi E, int BN>
__global__ void __launch_bounds__(kThreads, TileN<BN>::kMinBlocks)
    m_grouped_gemm(const MGroupedParams<T> p) {
  MB_EXTERN_SHARED(unsigned char, smem_raw);
  T* smem = reinterpret_cast<T*>(smem_raw);
  using SA = Smem<Major::K, kBM>;
  using SB = Smem<LB, BN>;
  constexpr int kBN = BN, kWTN = TileN<BN>::kWTN, kNFrag = TileN<BN>::kNFrag;
  constexpr int kSwigluCols = TileN<BN>::kSwigluCols;
  constexpr int kBChunks = kBN * kBK / 8 / kThreads;  // 16-byte copies per thread per B tile
  constexpr bool kSwiglu = E == Epi::SwigluForward;
  const int64_t n_cols = kSwiglu ? 2 * ceil_div(p.n, kSwigluCols) * kSwigluCols : p.n;
  const int64_t n_tiles = ceil_div(n_cols, kBN);
  const int64_t total = p.groups.tile_offsets[p.groups.count] * n_tiles;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = (warp / kWarpsN) * kWTM, wn = (warp % kWarpsN) * kWTN;
  const int num_k_tiles = static_cast<int>(ceil_div(p.k, kBK));

  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const MTile at = m_tile(p.groups, tile, n_tiles);
    const int64_t nt = at.nt, m0 = at.m0, m_end = at.m_end;
    const int32_t g = at.g;
    const int64_t n0 = nt * kBN;
    const T* b_base = p.b.ptr + g * p.b.group_stride;

    // Each thread copies the same two A rows (and B rows) in every k-tile: resolve them once.
    const T* a_row[2];
    bool a_ok[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t r = m0 + (tid + c * kThreads) / (kBK / 8);
      a_ok[c] = r < m_end;
      const int64_t stored = a_ok[c] ? (p.a.gather ? p.a.gather[r] : r) : 0;
      a_row[c] = p.a.ptr + stored * p.a.ld;
    }
    const T* b_row[kBChunks];
    bool b_ok[kBChunks];
    if constexpr (LB == Major::K) {
#pragma unroll
      for (int c = 0; c < kBChunks; ++c) {
        const int nb = (tid + c * kThreads) / (kBK / 8);
        int64_t row;
        if constexpr (kSwiglu) {
          // Tile column nb: warp column block nb / kWTN holds kWTN/2 gate then kWTN/2 up columns
          // of the same intermediate indices, so one thread's accumulators pair gate with up.
          constexpr int half = kWTN / 2;
          const int64_t i = nt * kSwigluCols + (nb / kWTN) * half + (nb % half);
          b_ok[c] = i < p.n;
          row = (nb % kWTN) >= half ? p.n + i : i;
        } else {
          row = n0 + nb;
          b_ok[c] = row < p.n;
        }
        b_row[c] = b_base + (b_ok[c] ? row : 0) * p.b.ld;
      }
    }
    auto load = [&](T* stage, int kt) {
      const int64_t k0 = static_cast<int64_t>(kt) * kBK;
      T* As = stage;
      T* Bs = stage + SA::kElems;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int idx = tid + c * kThreads;
        const int r = idx / (kBK / 8), kc = (idx % (kBK / 8)) * 8;
        const bool ok = a_ok[c] && k0 + kc < p.k;
        cp_async16(As + SA::at(r, kc), ok ? a_row[c] + k0 + kc : p.a.ptr, ok);
      }
      if constexpr (LB == Major::K) {
#pragma unroll
        for (int c = 0; c < kBChunks; ++c) {
          const int idx = tid + c * kThreads;
          const int nb = idx / (kBK / 8), kc = (idx % (kBK / 8)) * 8;
          const bool ok = b_ok[c] && k0 + kc < p.k;
          cp_async16(Bs + SB::at(nb, kc), ok ? b_row[c] + k0 + kc : p.b.ptr, ok);
        }
      } else {
        load_mn_tile<T, kBN>(Bs, p.b, b_base, k0, p.k < p.b_rows ? p.k : p.b_rows, n0, p.n);
      }
    };

    float acc[kMFrag][kNFrag][4] = {};
    main_loop<T, Major::K, LB, BN>(smem, num_k_tiles, load, acc);

    // ---- epilogue
    if constexpr (E == Epi::Store || E == Epi::StoreF32) {
      using Out = std::conditional_t<E == Epi::Store, T, float>;
#pragma unroll
      for (int i = 0; i < kMFrag; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t row = m0 + wm + i * 16 + half * 8 + lane / 4;
          if (row >= m_end) continue;
#pragma unroll
          for (int j = 0; j < kNFrag; ++j) {
            const int64_t col = n0 + wn + j * 8 + 2 * (lane % 4);
            if (col >= p.n) continue;
            epi_store<Out>(p.epi, p.n, row, col, acc[i][j][2 * half], acc[i][j][2 * half + 1]);
          }
        }
    } else if constexpr (E == Epi::SwigluForward) {
      const int64_t I = p.n;
      with_activation(p.epi.activation, [&](auto kind) {
#pragma unroll
        for (int i = 0; i < kMFrag; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int64_t row = m0 + wm + i * 16 + half * 8 + lane / 4;
            if (row >= m_end) continue;
#pragma unroll
            for (int jj = 0; jj < kNFrag / 2; ++jj) {
              const int64_t col =
                  nt * kSwigluCols + (wn / kWTN) * (kWTN / 2) + jj * 8 + 2 * (lane % 4);
              if (col >= I) continue;  // I % 8 == 0: col + 1 < I too
              const float g[2] = {acc[i][jj][2 * half], acc[i][jj][2 * half + 1]};
              const float u[2] = {acc[i][jj + kNFrag / 2][2 * half],
                                  acc[i][jj + kNFrag / 2][2 * half + 1]};
              epi_swiglu_forward<decltype(kind)::value>(p.epi, row, col, g, u);
            }
          }
      });
    } else {  // SwigluBackward: acc = d(act) / weight, i.e. dy·down_w for rows of the tile
      const int64_t I = p.n;
      float* red = reinterpret_cast<float*>(smem_raw);  // [kBM][kWarpsN], the stages are free
      with_activation(p.epi.activation, [&](auto kind) {
#pragma unroll
        for (int i = 0; i < kMFrag; ++i)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int local = wm + i * 16 + half * 8 + lane / 4;
            const int64_t row = m0 + local;
            float part = 0.0f;
            if (row < m_end) {
              const float w = round_as<T>(p.epi.row_weight[row]);
              GateUp<T> saved[kNFrag];  // every load of the row before its first store
#pragma unroll
              for (int j = 0; j < kNFrag; ++j) {
                const int64_t col = n0 + wn + j * 8 + 2 * (lane % 4);
                if (col < I) saved[j] = load_gate_up(p.epi, row, col);
              }
#pragma unroll
              for (int j = 0; j < kNFrag; ++j) {
                const int64_t col = n0 + wn + j * 8 + 2 * (lane % 4);
                if (col >= I) continue;
                const float d[2] = {acc[i][j][2 * half], acc[i][j][2 * half + 1]};
                epi_swiglu_backward<decltype(kind)::value>(p.epi, row, col, w, d, saved[j], part);
              }
            }
            // The four lanes of a row hold disjoint columns: sum them, then one value per warp.
            part += __shfl_xor_sync(0xffffffffu, part, 1);
            part += __shfl_xor_sync(0xffffffffu, part, 2);
            if (lane % 4 == 0) red[local * kWarpsN + warp % kWarpsN] = part;
          }
      });
      __syncthreads();
      if (tid < kBM && m0 + tid < m_end) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarpsN; ++w) sum += red[tid * kWarpsN + w];  // fixed order
        p.epi.partial[(m0 + tid) * n_tiles + nt] = sum;
      }
    }
    __syncthreads();  // the epilogue's shared scratch is the next tile's first stage
  }
}

// ---- K-grouped (weight gradients) ---------------------------------------------------------------
template <class T>
struct KGroupedParams {
  Operand<T> a;          // [rows, M] row-stored, optionally gathered
  Operand<T> b;          // [rows, N] row-stored, optionally gathered
  int64_t m = 0, n = 0;  // the operands' M and N (M may be padded past the rows of C)
  int64_t m_store = 0;   // C_g is [m_store, N]
  Groups groups;         // the reduction rows of each group
  T* out = nullptr;      // [G, M, N], C_g at out + g·M·N
  bool accumulate = false;
  float* out_f32 = nullptr;  // set: C_g in f32 there instead (wgmma kernels only: split-K parts)
};

inline constexpr int kKGroupedBN = 128;

template <class T>
__global__ void __launch_bounds__(kThreads, 2) k_grouped_gemm(const KGroupedParams<T> p) {
  MB_EXTERN_SHARED(unsigned char, smem_raw);
  T* smem = reinterpret_cast<T*>(smem_raw);
  constexpr int kBN = kKGroupedBN, kWTN = TileN<kBN>::kWTN, kNFrag = TileN<kBN>::kNFrag;
  using SA = Smem<Major::MN, kBM>;
  using SB = Smem<Major::MN, kBN>;
  const int g = blockIdx.z;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM,
                n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t r0 = p.groups.offsets[g], r1 = p.groups.offsets[g + 1];
  const int num_k_tiles = static_cast<int>(ceil_div(r1 - r0, kBK));
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = (warp / kWarpsN) * kWTM, wn = (warp % kWarpsN) * kWTN;

  auto load = [&](T* stage, int kt) {
    const int64_t r = r0 + static_cast<int64_t>(kt) * kBK;
    load_mn_tile<T, kBM>(stage, p.a, p.a.ptr, r, r1, m0, p.m);
    load_mn_tile<T, kBN>(stage + SA::kElems, p.b, p.b.ptr, r, r1, n0, p.n);
  };
  float acc[kMFrag][kNFrag][4] = {};
  main_loop<T, Major::MN, Major::MN, kBN>(smem, num_k_tiles, load, acc);

  T* out = p.out + static_cast<int64_t>(g) * p.m_store * p.n;
#pragma unroll
  for (int i = 0; i < kMFrag; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = m0 + wm + i * 16 + half * 8 + lane / 4;
      if (row >= p.m_store) continue;
#pragma unroll
      for (int j = 0; j < kNFrag; ++j) {
        const int64_t col = n0 + wn + j * 8 + 2 * (lane % 4);
        if (col >= p.n) continue;  // N % 8 == 0: col + 1 < N too
        epi_k_grouped(out + row * p.n + col, acc[i][j][2 * half], acc[i][j][2 * half + 1],
                      p.accumulate);
      }
    }
}

}  // namespace megablocks::cuda
