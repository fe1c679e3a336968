// flash_attn/bwd_sm80.cuh — the mma.sync flash-attention backward (the FA2 algorithm).
//
// Three steps, all stream-ordered, scratch only in the caller's workspace:
//   1. bwd_preprocess: Di = Σ_d dO·O per (row, head) in f32 (and a zeroed f32 dq accumulator).
//   2. bwd_dkdv: a block owns kBlockN keys of one kv head and walks every query block of every
//      head of its GQA group that can see them (so dk/dv are summed over the group in registers,
//      in a fixed order: deterministic). Per query block, with P = exp2(S − lse):
//        dV += Pᵀ·dO,  dP = dO·Vᵀ,  dS = P∘(dP − Di) (∘ (1 − tanh²) under softcap),  dK += dSᵀ·Q,
//      and, in the default mode, dQ += dS·K through f32 atomics into the accumulator (dS goes
//      through shared memory to change the warp partition). At head dim 256 the accumulators of
//      a warp's 16 keys would not fit, so two warps split the head dim and add their partial
//      Sᵀ / dPᵀ through shared memory.
//   3. default: dq = scale·accumulator (bwd_convert_dq). Deterministic: bwd_dq, a block per query
//      block that walks its keys and accumulates dq in registers (S and dP computed again: the
//      price of no atomics).
#pragma once

#include <type_traits>

#include "flash_attn/device_common.cuh"

namespace hk_flash {

template <int kKeyWarps_, int kDWarps_, int kStagesQ_>
struct BwdConfig {
  static constexpr int kKeyWarps = kKeyWarps_;
  static constexpr int kDWarps = kDWarps_;
  static constexpr int kStagesQ = kStagesQ_;
  static constexpr int kWarps = kKeyWarps * kDWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = 16 * kKeyWarps;
  static constexpr int kBlockM = 64;
  static_assert(kWarps % 4 == 0, "the dq product splits 64 query rows over 4 warps");
};
template <int D>
using BwdDkdv = BwdConfig<(D <= 128 ? 8 : 4), (D <= 128 ? 1 : 2), (D <= 128 ? 2 : 1)>;

template <int D, class Cfg>
constexpr size_t bwd_dkdv_smem_bytes() {
  constexpr size_t kv = size_t(2) * Cfg::kBlockN * D * 2;
  constexpr size_t qdo = size_t(Cfg::kStagesQ) * 2 * Cfg::kBlockM * D * 2;
  constexpr size_t rows = size_t(Cfg::kStagesQ) * 2 * Cfg::kBlockM * 4;
  constexpr size_t ds = size_t(Cfg::kBlockN) * Cfg::kBlockM * 2;
  constexpr size_t red = Cfg::kDWarps > 1 ? size_t(Cfg::kWarps) * 64 * 32 * 4 : 0;
  return kv + qdo + rows + ds + red;
}

__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// ---- 1. Di = Σ dO·O (and zero the dq accumulator) ----------------------------------------------
template <class T, int D>
__global__ void __launch_bounds__(256)
    flash_bwd_preprocess_kernel(const BackwardParams p, float* di, float* dq_accum) {
  // (a tiled dq accumulator, dq_tiled_index, is cleared by the caller instead: pass null)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = blockIdx.x * 8 + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(p, b);
  if (s >= seq.S) return;
  const T* o = static_cast<const T*>(p.out) + row_offset(p.out_strides, b, seq.q_row0, s, h);
  const T* dout = static_cast<const T*>(p.dout) + row_offset(p.dout_strides, b, seq.q_row0, s, h);
  float acc = 0.0f;
  for (int d = lane * 2; d < D; d += 64) {
    const float2 a = unpack2<T>(*reinterpret_cast<const uint32_t*>(o + d));
    const float2 c = unpack2<T>(*reinterpret_cast<const uint32_t*>(dout + d));
    acc += a.x * c.x + a.y * c.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) di[di_offset(p, b, seq.q_row0, s, h)] = acc;
  if (dq_accum != nullptr) {
    float* row = dq_accum + dq_accum_offset(p, b, seq.q_row0, s, h);
    for (int d = lane; d < D; d += 32) row[d] = 0.0f;
  }
}

// ---- 3a. dq = scale · accumulator --------------------------------------------------------------
template <class T, int D>
__global__ void __launch_bounds__(256)
    flash_bwd_convert_dq_kernel(const BackwardParams p, const float* dq_accum, float scale,
                                bool tiled) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = blockIdx.x * 8 + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(p, b);
  if (s >= seq.S) return;
  T* dst = static_cast<T*>(p.dq) + row_offset(p.dq_strides, b, seq.q_row0, s, h);
  if (tiled) {  // columns d, d + 1 are adjacent there too
    for (int d = lane * 2; d < D; d += 64) {
      const float2 v = *reinterpret_cast<const float2*>(dq_accum + dq_tiled_index(p, b, s, h, d));
      *reinterpret_cast<uint32_t*>(dst + d) = pack2<T>(v.x * scale, v.y * scale);
    }
    return;
  }
  const float* src = dq_accum + dq_accum_offset(p, b, seq.q_row0, s, h);
  for (int d = lane * 2; d < D; d += 64)
    *reinterpret_cast<uint32_t*>(dst + d) = pack2<T>(src[d] * scale, src[d + 1] * scale);
}

// Which queries of a sequence can see keys [n0, n1): rows [m_lo, m_hi).
__device__ __forceinline__ int2 query_rows_seeing(const Params& p, const SeqInfo& seq, int n0,
                                                  int n1) {
  const int shift = seq.T - seq.S;  // query s's diagonal key is s + shift
  int m_lo = 0, m_hi = seq.S;
  if (p.causal) m_lo = max(0, n0 - shift);                                       // s + shift ≥ n0
  if (p.window_left >= 0) m_hi = min(m_hi, n1 - 1 - shift + p.window_left + 1);  // lo(s) ≤ n1-1
  if (n1 <= seq.key_start) m_hi = 0;
  return make_int2(m_lo, max(m_lo, m_hi));
}

// ---- 2. dK, dV (and dQ by atomics) -------------------------------------------------------------
template <class T, int D, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    flash_bwd_dkdv_sm80_kernel(const BackwardParams p, const float* di, float* dq_accum) {
  constexpr int kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM, kStagesQ = Cfg::kStagesQ;
  constexpr int kRowBytes = D * 2;
  constexpr int kDW = D / Cfg::kDWarps;  // head-dim columns of a warp's dK/dV
  constexpr int kQT = kBlockM / 8;       // 8-query tiles of Sᵀ
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_k = smem_u32(smem);
  const uint32_t s_v = s_k + kBlockN * kRowBytes;
  const uint32_t s_q = s_v + kBlockN * kRowBytes;  // [stage][Q | dO]
  constexpr uint32_t kQTile = kBlockM * kRowBytes;
  float* s_rows = reinterpret_cast<float*>(smem + 2 * kBlockN * kRowBytes +
                                           kStagesQ * 2 * kQTile);  // [stage][lse | Di]
  unsigned char* ds_ptr = reinterpret_cast<unsigned char*>(s_rows + kStagesQ * 2 * kBlockM);
  const uint32_t s_ds = smem_u32(ds_ptr);
  float* s_red = reinterpret_cast<float*>(ds_ptr + kBlockN * kBlockM * 2);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = warp % Cfg::kKeyWarps, dw = warp / Cfg::kKeyWarps;
  const int g = lane >> 2, t4 = lane & 3;
  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = p.heads_q / p.heads_kv;
  const SeqInfo seq = seq_info(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.T) return;
  const float scale = p.scale != 0.0f ? p.scale : rsqrtf(static_cast<float>(D));
  const ScoreMap smap = score_map(p, scale);
  const bool with_dq = dq_accum != nullptr;

  const int2 mrange = query_rows_seeing(p, seq, n0, min(seq.T, n0 + kBlockN));
  const int m_first = mrange.x / kBlockM;
  const int m_blocks = mrange.y > mrange.x ? (mrange.y + kBlockM - 1) / kBlockM - m_first : 0;
  const int n_iters = m_blocks * group;

  // K and V once (first commit group, with the first Q/dO stage)
  {
    const int valid = min(kBlockN, seq.T - n0);
    const T* k = static_cast<const T*>(p.k) + row_offset(p.k_strides, b, seq.k_row0, n0, hk);
    const T* v = static_cast<const T*>(p.v) + row_offset(p.v_strides, b, seq.k_row0, n0, hk);
    load_tile_async<T, D>(s_k, k, p.k_strides.row, kBlockN, valid, tid, Cfg::kThreads);
    load_tile_async<T, D>(s_v, v, p.v_strides.row, kBlockN, valid, tid, Cfg::kThreads);
  }
  auto load_q = [&](int it, int stage) {
    const int h = hk * group + it / m_blocks;
    const int m0 = (m_first + it % m_blocks) * kBlockM;
    const int valid = min(kBlockM, seq.S - m0);
    const T* q = static_cast<const T*>(p.q) + row_offset(p.q_strides, b, seq.q_row0, m0, h);
    const T* dout =
        static_cast<const T*>(p.dout) + row_offset(p.dout_strides, b, seq.q_row0, m0, h);
    const uint32_t dst = s_q + stage * 2 * kQTile;
    load_tile_async<T, D>(dst, q, p.q_strides.row, kBlockM, valid, tid, Cfg::kThreads);
    load_tile_async<T, D>(dst + kQTile, dout, p.dout_strides.row, kBlockM, valid, tid,
                          Cfg::kThreads);
    float* rows = s_rows + stage * 2 * kBlockM;
    for (int r = tid; r < kBlockM; r += Cfg::kThreads) {
      const bool ok = r < valid;
      rows[r] = ok ? p.lse_in[lse_offset(p, b, seq.q_row0, m0 + r, h)] * kLog2e : INFINITY;
      rows[kBlockM + r] = ok ? di[di_offset(p, b, seq.q_row0, m0 + r, h)] : 0.0f;
    }
  };
  for (int s = 0; s < kStagesQ - 1; ++s) {
    if (s < n_iters) load_q(s, s);
    cp_async_commit();
  }

  // keys of this thread's two accumulator rows (Sᵀ rows = keys)
  const int key_a = n0 + kw * 16 + g;
  float dk[kDW / 8][4], dv[kDW / 8][4];
#pragma unroll
  for (int i = 0; i < kDW / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;

  for (int it = 0; it < n_iters; ++it) {
    const int stage = it % kStagesQ;
    if constexpr (kStagesQ == 1) {
      __syncthreads();  // everyone is done with the previous tile
      load_q(it, 0);
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      cp_async_wait<kStagesQ - 2>();
    }
    __syncthreads();
    if constexpr (kStagesQ > 1) {
      if (it + kStagesQ - 1 < n_iters) load_q(it + kStagesQ - 1, (it + kStagesQ - 1) % kStagesQ);
      cp_async_commit();
    }
    const int h = hk * group + it / m_blocks;
    const int m0 = (m_first + it % m_blocks) * kBlockM;
    const uint32_t q_tile = s_q + stage * 2 * kQTile, do_tile = q_tile + kQTile;
    const float* lse_rows = s_rows + stage * 2 * kBlockM;
    const float* di_rows = lse_rows + kBlockM;

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ over this warp's head-dim range
    float st[kQT][4], dpt[kQT][4];
#pragma unroll
    for (int i = 0; i < kQT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kDW / 16; ++kk) {
      const int chunk = dw * (kDW / 8) + 2 * kk;
      uint32_t ak[4], av[4];
      const int arow = kw * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldmatrix_x4(ak, s_k + tile_offset(arow, chunk + (lane >> 4), kRowBytes));
      ldmatrix_x4(av, s_v + tile_offset(arow, chunk + (lane >> 4), kRowBytes));
#pragma unroll
      for (int jq = 0; jq < kQT / 2; ++jq) {
        const int brow = 16 * jq + (lane & 7) + (lane >> 4) * 8;
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, q_tile + tile_offset(brow, chunk + ((lane >> 3) & 1), kRowBytes));
        ldmatrix_x4(bo, do_tile + tile_offset(brow, chunk + ((lane >> 3) & 1), kRowBytes));
        mma16816<T>(st[2 * jq], ak, bq[0], bq[1]);
        mma16816<T>(st[2 * jq + 1], ak, bq[2], bq[3]);
        mma16816<T>(dpt[2 * jq], av, bo[0], bo[1]);
        mma16816<T>(dpt[2 * jq + 1], av, bo[2], bo[3]);
      }
    }
    if constexpr (Cfg::kDWarps > 1) {  // add the partner warp's half of the head dim
      float* mine = s_red + warp * 64 * 32;
      float* other = s_red + (kw + (1 - dw) * Cfg::kKeyWarps) * 64 * 32;
#pragma unroll
      for (int i = 0; i < kQT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          mine[(i * 4 + e) * 32 + lane] = st[i][e];
          mine[(32 + i * 4 + e) * 32 + lane] = dpt[i][e];
        }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kQT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          st[i][e] += other[(i * 4 + e) * 32 + lane];
          dpt[i][e] += other[(32 + i * 4 + e) * 32 + lane];
        }
    }
    // P and dS (in place: st ← P, dpt ← dS); softcap and masks branch once per tile. hi is
    // smallest for the first query, lo largest for the last.
    const bool need_mask = n0 + kBlockN > key_range(p, seq, m0).hi ||
                           n0 < key_range(p, seq, min(m0 + kBlockM, seq.S) - 1).lo;
    const float sl2 = smap.scale_log2;
    auto probabilities = [&](auto softcap_tag, auto mask_tag) {
      constexpr bool kCap = decltype(softcap_tag)::value, kMask = decltype(mask_tag)::value;
#pragma unroll
      for (int i = 0; i < kQT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = 8 * i + 2 * t4 + (e & 1);  // query row in the tile
          float x = st[i][e];
          if constexpr (kCap) x = smap.cap(x);
          if constexpr (kMask) {
            const int key = key_a + 8 * (e >> 1);
            const KeyRange kr = key_range(p, seq, min(m0 + qi, seq.S - 1));
            if (key < kr.lo || key >= kr.hi) x = -INFINITY;
          }
          const float pr = fast_exp2(fmaf(x, sl2, -lse_rows[qi]));
          float ds = pr * (dpt[i][e] - di_rows[qi]);
          if constexpr (kCap) {
            const float th = x / smap.cap_out;
            ds = pr > 0.0f ? ds * (1.0f - th * th) : 0.0f;
          }
          st[i][e] = pr;
          dpt[i][e] = ds;
        }
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if (smap.softcap())
      need_mask ? probabilities(Yes{}, Yes{}) : probabilities(Yes{}, No{});
    else
      need_mask ? probabilities(No{}, Yes{}) : probabilities(No{}, No{});
      // dV += Pᵀ·dO, dK += dSᵀ·Q
#pragma unroll
    for (int kq = 0; kq < kBlockM / 16; ++kq) {
      uint32_t ap[4], as[4];
      ap[0] = pack2<T>(st[2 * kq][0], st[2 * kq][1]);
      ap[1] = pack2<T>(st[2 * kq][2], st[2 * kq][3]);
      ap[2] = pack2<T>(st[2 * kq + 1][0], st[2 * kq + 1][1]);
      ap[3] = pack2<T>(st[2 * kq + 1][2], st[2 * kq + 1][3]);
      as[0] = pack2<T>(dpt[2 * kq][0], dpt[2 * kq][1]);
      as[1] = pack2<T>(dpt[2 * kq][2], dpt[2 * kq][3]);
      as[2] = pack2<T>(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]);
      as[3] = pack2<T>(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3]);
#pragma unroll
      for (int jd = 0; jd < kDW / 16; ++jd) {
        const int brow = 16 * kq + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int chunk = dw * (kDW / 8) + 2 * jd + (lane >> 4);
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, do_tile + tile_offset(brow, chunk, kRowBytes));
        ldmatrix_x4_trans(bq, q_tile + tile_offset(brow, chunk, kRowBytes));
        mma16816<T>(dv[2 * jd], ap, bo[0], bo[1]);
        mma16816<T>(dv[2 * jd + 1], ap, bo[2], bo[3]);
        mma16816<T>(dk[2 * jd], as, bq[0], bq[1]);
        mma16816<T>(dk[2 * jd + 1], as, bq[2], bq[3]);
      }
    }
    if (with_dq) {
      // dSᵀ → shared [key][query], then dQ[64 × D] = dS·K split over the block's warps
      if (dw == 0) {
#pragma unroll
        for (int i = 0; i < kQT; ++i)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int key = kw * 16 + g + 8 * r;
            *reinterpret_cast<uint32_t*>(ds_ptr + tile_offset(key, i, kBlockM * 2) + 4 * t4) =
                pack2<T>(dpt[i][2 * r], dpt[i][2 * r + 1]);
          }
      }
      __syncthreads();
      constexpr int kParts = Cfg::kWarps / 4;
      constexpr int kDQ = D / kParts;  // head-dim columns of a warp's dQ
      const int qt = warp % 4, part = warp / 4;
      float dq[kDQ / 8][4];
#pragma unroll
      for (int i = 0; i < kDQ / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, s_ds + tile_offset(16 * kk + (lane & 7) + (lane >> 4) * 8,
                                                2 * qt + ((lane >> 3) & 1), kBlockM * 2));
#pragma unroll
        for (int jd = 0; jd < kDQ / 16; ++jd) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk,
                            s_k + tile_offset(16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8,
                                              part * (kDQ / 8) + 2 * jd + (lane >> 4), kRowBytes));
          mma16816<T>(dq[2 * jd], a, bk[0], bk[1]);
          mma16816<T>(dq[2 * jd + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int s = m0 + 16 * qt + g + 8 * r;
        if (s >= seq.S) continue;
        float* dst = dq_accum + dq_accum_offset(p, b, seq.q_row0, s, h) + part * kDQ + 2 * t4;
#pragma unroll
        for (int i = 0; i < kDQ / 8; ++i)
          red_add_f32x2(dst + 8 * i, dq[i][2 * r], dq[i][2 * r + 1]);
      }
    }
  }
  cp_async_wait<0>();

  // dK·scale, dV → global (keys past the sequence end are not written)
  T* dkp = static_cast<T*>(p.dk);
  T* dvp = static_cast<T*>(p.dv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_a + 8 * r;
    if (key >= seq.T) continue;
    T* dk_row = dkp + row_offset(p.dk_strides, b, seq.k_row0, key, hk) + dw * kDW + 2 * t4;
    T* dv_row = dvp + row_offset(p.dv_strides, b, seq.k_row0, key, hk) + dw * kDW + 2 * t4;
#pragma unroll
    for (int i = 0; i < kDW / 8; ++i) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * i) =
          pack2<T>(dk[i][2 * r] * scale, dk[i][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_row + 8 * i) = pack2<T>(dv[i][2 * r], dv[i][2 * r + 1]);
    }
  }
}

// ---- 3b. deterministic dQ
// ------------------------------------------------------------------------
template <int D>
struct BwdDq {
  static constexpr int kBlockM = 64, kThreads = 128, kStages = 2;
  static constexpr int kBlockN = D <= 128 ? 64 : 32;
};
template <int D>
constexpr size_t bwd_dq_smem_bytes() {
  return size_t(2) * BwdDq<D>::kBlockM * D * 2 +
         size_t(BwdDq<D>::kStages) * 2 * BwdDq<D>::kBlockN * D * 2;
}

template <class T, int D>
__global__ void __launch_bounds__(128)
    flash_bwd_dq_sm80_kernel(const BackwardParams p, const float* di) {
  using Cfg = BwdDq<D>;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kRowBytes = D * 2, kNT = kBlockN / 8, kDT = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem), s_do = s_q + kBlockM * kRowBytes;
  const uint32_t s_kv = s_do + kBlockM * kRowBytes;
  constexpr uint32_t kTile = kBlockN * kRowBytes;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int m_block = m_blocks - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.heads_q / p.heads_kv);
  const SeqInfo seq = seq_info(p, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.S) return;
  const int valid_rows = min(kBlockM, seq.S - m0);
  const float scale = p.scale != 0.0f ? p.scale : rsqrtf(static_cast<float>(D));
  const ScoreMap smap = score_map(p, scale);

  const KeyRange first = key_range(p, seq, m0);
  const KeyRange last = key_range(p, seq, m0 + valid_rows - 1);
  const int n_lo = first.lo / kBlockN;
  const int n_hi = last.hi > first.lo ? (last.hi + kBlockN - 1) / kBlockN : n_lo;
  const int n_iters = n_hi - n_lo;

  load_tile_async<T, D>(s_q,
                        static_cast<const T*>(p.q) + row_offset(p.q_strides, b, seq.q_row0, m0, h),
                        p.q_strides.row, kBlockM, valid_rows, tid, Cfg::kThreads);
  load_tile_async<T, D>(
      s_do, static_cast<const T*>(p.dout) + row_offset(p.dout_strides, b, seq.q_row0, m0, h),
      p.dout_strides.row, kBlockM, valid_rows, tid, Cfg::kThreads);
  const T* k_base = static_cast<const T*>(p.k) + row_offset(p.k_strides, b, seq.k_row0, 0, hk);
  const T* v_base = static_cast<const T*>(p.v) + row_offset(p.v_strides, b, seq.k_row0, 0, hk);
  auto load_kv = [&](int n_block, int stage) {
    const int key0 = n_block * kBlockN, valid = min(kBlockN, seq.T - key0);
    const uint32_t dst = s_kv + stage * 2 * kTile;
    load_tile_async<T, D>(dst, k_base + key0 * p.k_strides.row, p.k_strides.row, kBlockN, valid,
                          tid, Cfg::kThreads);
    load_tile_async<T, D>(dst + kTile, v_base + key0 * p.v_strides.row, p.v_strides.row, kBlockN,
                          valid, tid, Cfg::kThreads);
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iters) load_kv(n_hi - 1 - s, s);
    cp_async_commit();
  }

  float lse_r[2], di_r[2];
  KeyRange rng[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    const int s = m0 + min(row, valid_rows - 1);
    rng[r] = key_range(p, seq, s);
    lse_r[r] = row < valid_rows ? p.lse_in[lse_offset(p, b, seq.q_row0, s, h)] * kLog2e : INFINITY;
    di_r[r] = row < valid_rows ? di[di_offset(p, b, seq.q_row0, s, h)] : 0.0f;
  }
  float dq[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (int it = 0; it < n_iters; ++it) {
    const int n_block = n_hi - 1 - it;
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < n_iters) load_kv(n_block - (kStages - 1), (it + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t k_tile = s_kv + (it % kStages) * 2 * kTile, v_tile = k_tile + kTile;

    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int arow = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      uint32_t aq[4], ao[4];
      ldmatrix_x4(aq, s_q + tile_offset(arow, 2 * kk + (lane >> 4), kRowBytes));
      ldmatrix_x4(ao, s_do + tile_offset(arow, 2 * kk + (lane >> 4), kRowBytes));
#pragma unroll
      for (int jn = 0; jn < kNT / 2; ++jn) {
        const int brow = 16 * jn + (lane & 7) + (lane >> 4) * 8;
        uint32_t bk[4], bv[4];
        ldmatrix_x4(bk, k_tile + tile_offset(brow, 2 * kk + ((lane >> 3) & 1), kRowBytes));
        ldmatrix_x4(bv, v_tile + tile_offset(brow, 2 * kk + ((lane >> 3) & 1), kRowBytes));
        mma16816<T>(s[2 * jn], aq, bk[0], bk[1]);
        mma16816<T>(s[2 * jn + 1], aq, bk[2], bk[3]);
        mma16816<T>(dp[2 * jn], ao, bv[0], bv[1]);
        mma16816<T>(dp[2 * jn + 1], ao, bv[2], bv[3]);
      }
    }
    const int key0 = n_block * kBlockN;
    const float sl2 = smap.scale_log2;
    const bool need_mask = key0 < last.lo || key0 + kBlockN > first.hi;
    auto gradients = [&](auto softcap_tag, auto mask_tag) {
      constexpr bool kCap = decltype(softcap_tag)::value, kMask = decltype(mask_tag)::value;
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float x = s[i][e];
          if constexpr (kCap) x = smap.cap(x);
          if constexpr (kMask) {
            const int key = key0 + 8 * i + 2 * t4 + (e & 1);
            if (key < rng[r].lo || key >= rng[r].hi) x = -INFINITY;
          }
          const float pr = fast_exp2(fmaf(x, sl2, -lse_r[r]));
          float ds = pr * (dp[i][e] - di_r[r]);
          if constexpr (kCap) {
            const float th = x / smap.cap_out;
            ds = pr > 0.0f ? ds * (1.0f - th * th) : 0.0f;
          }
          s[i][e] = ds;
        }
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if (smap.softcap())
      need_mask ? gradients(Yes{}, Yes{}) : gradients(Yes{}, No{});
    else
      need_mask ? gradients(No{}, Yes{}) : gradients(No{}, No{});
      // dQ += dS·K
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int jd = 0; jd < D / 16; ++jd) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, k_tile + tile_offset(16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                   2 * jd + (lane >> 4), kRowBytes));
        mma16816<T>(dq[2 * jd], a, bk[0], bk[1]);
        mma16816<T>(dq[2 * jd + 1], a, bk[2], bk[3]);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    if (row >= valid_rows) continue;
    T* dst = static_cast<T*>(p.dq) + row_offset(p.dq_strides, b, seq.q_row0, m0 + row, h);
#pragma unroll
    for (int i = 0; i < kDT; ++i)
      *reinterpret_cast<uint32_t*>(dst + 8 * i + 2 * t4) =
          pack2<T>(dq[i][2 * r] * scale, dq[i][2 * r + 1] * scale);
  }
}

}  // namespace hk_flash
