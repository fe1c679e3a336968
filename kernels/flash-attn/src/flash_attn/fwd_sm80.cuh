// flash_attn/fwd_sm80.cuh — the mma.sync flash-attention forward (the FA2 algorithm), every
// feature.
//
// A block owns 16·kRowWarps query rows of one head and walks its visible key tiles from the last
// to the first (so the one tile that needs the causal mask comes first), kStages deep through
// cp.async. Each warp holds 16 rows: S = Q·Kᵀ in registers (m16n8k16, K as the col operand via
// ldmatrix), the online softmax in the log2 domain, then the S accumulators become P's A fragments
// without a trip through shared memory and O += P·V (V through ldmatrix.trans).
//
// Decode form (kDecode): rows are (query, head-of-the-kv-group) pairs of one kv head, so a GQA
// group reads its K/V once; the kKeyWarps warps of a block take different keys of each tile, and
// the gridDim.x blocks of a row tile take different tiles (split-KV). Partial (max, sum, O) are
// combined first across warps through shared memory, then across the splits: with p.workspace
// null the splits are one thread-block cluster, combined through distributed shared memory (no
// scratch, no second launch, but at most 16 blocks a kv head, packed two an SM); otherwise each
// block writes its partial to p.workspace and flash_decode_combine_kernel, launched behind it,
// combines them (the splits then spread over every SM).
//
// Not here: backward (bwd_sm80.cuh), the Hopper kernel (fwd_sm90.cuh), host dispatch (api.cu).
#pragma once

#include <cooperative_groups.h>

#include <cfloat>

#include "flash_attn/device_common.cuh"
#include "flash_attn/launch.h"  // decode_slot_floats: the partials' layout

namespace hk_flash {

template <int kRowWarps_, int kKeyWarps_, int kWarpKeys_, int kStages_, bool kDecode_>
struct FwdConfig {
  static constexpr int kRowWarps = kRowWarps_;
  static constexpr int kKeyWarps = kKeyWarps_;
  static constexpr int kWarpKeys = kWarpKeys_;  // keys of a tile each warp takes
  static constexpr int kStages = kStages_;
  static constexpr bool kDecode = kDecode_;
  static constexpr int kWarps = kRowWarps * kKeyWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kRowWarps;
  static constexpr int kBlockN = kWarpKeys * kKeyWarps;
  static_assert(kWarpKeys % 16 == 0, "keys per warp must be a multiple of 16");
  static_assert(!kDecode || kRowWarps == 1, "the decode form has one row tile per block");
};

// Prefill / batch shapes: 4 row warps, one key group; tiles sized to the head dim's registers.
template <int D>
using FwdPrefill = FwdConfig<4, 1,
                             (D <= 64    ? 128
                              : D <= 128 ? 64
                                         : 32),
                             2, false>;
// Decode shapes: 16 packed rows, the warps of a block splitting each key tile. A block is bound by
// the latency of its per-tile chain (ldmatrix → mma → softmax → mma), so what it streams grows
// with the warps that run such chains side by side and the tiles in flight. Through the workspace
// the splits are independent blocks, one an SM: eight warps on 128-key tiles three deep for long
// splits, four warps on 64-key tiles six deep (three at head dim 256) for short ones (api.cu
// decode_split; H200, batch 1, 16/8 heads, D128: 32768 keys 40.0 µs against 42.8 and 43.4 for four
// warps six and three deep; 4096 keys 12.7 µs four warps six deep against 13.3 for eight).
// The cluster form stays four warps three deep (two at 256) so two blocks fit an SM and eight
// 16-block clusters (batch 1, eight kv heads) are resident at once; six deep, only nine-block
// clusters were all resident and the call got slower (67 against 54 µs at 32768 keys).
template <int D>
using FwdDecode = FwdConfig<1, 4, 16, (D <= 128 ? 6 : 3), true>;
template <int D>
using FwdDecodeWide = FwdConfig<1, 8, 16, 3, true>;
template <int D>
using FwdDecodeCluster = FwdConfig<1, 4, 16, (D <= 128 ? 3 : 2), true>;

template <class T, int D, class Cfg>
constexpr size_t fwd_smem_bytes() {
  constexpr size_t q = size_t(Cfg::kBlockM) * D * 2;
  constexpr size_t kv = size_t(Cfg::kStages) * 2 * Cfg::kBlockN * D * 2;
  constexpr size_t combine = Cfg::kDecode ? size_t(Cfg::kKeyWarps + 1) * (16 * D + 32) * 4 : 0;
  return q + (kv > combine ? kv : combine);
}

template <class T, int D, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) flash_fwd_sm80_kernel(const Params p) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kWN = Cfg::kWarpKeys;
  constexpr int kStages = Cfg::kStages;
  constexpr int kRowBytes = D * 2;
  constexpr int kDT = D / 8;    // 8-column tiles of O
  constexpr int kNT = kWN / 8;  // 8-key tiles of S per warp
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_q = smem_u32(smem);
  const uint32_t smem_kv = smem_q + kBlockM * kRowBytes;
  constexpr uint32_t kTileBytes = kBlockN * kRowBytes;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rw = warp % Cfg::kRowWarps, kw = warp / Cfg::kRowWarps;
  const int b = blockIdx.z;
  const int group = p.heads_q / p.heads_kv;
  // Decode runs behind the kernel that wrote q, the new cache row or the cache lengths (PDL,
  // launch_sm80.cuh): wait for it before the first load. The workspace form's combine kernel may
  // be scheduled now (it is small and waits for this grid anyway); the cluster form lets its
  // successor (the decode step's next product) launch only once its keys are read, since that
  // kernel's blocks, resident early, would take the shared memory this grid's blocks still need
  // (measured on the H200: an early trigger cost batch 8 at 2048+128 tokens 9 %).
  if constexpr (Cfg::kDecode) {
    if (!p.cache_settled) grid_wait();  // settled: after the prefetch below
    if (p.workspace != nullptr) grid_launch_dependents();
  }
  const SeqInfo seq = seq_info(p, b);

  // Rows of this block: prefill = query rows of head h; decode = packed (query, head) pairs.
  int h_fixed = 0, hk = 0, row_begin = 0, valid_rows = 0;
  if constexpr (Cfg::kDecode) {
    const int tiles = (p.seqlen_q * group + kBlockM - 1) / kBlockM;
    hk = blockIdx.y / tiles;
    row_begin = (blockIdx.y % tiles) * kBlockM;  // packed row index
    valid_rows = min(kBlockM, seq.S * group - row_begin);
  } else {
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int m_block = m_blocks - 1 - static_cast<int>(blockIdx.x);  // heaviest (causal) first
    h_fixed = blockIdx.y;
    hk = h_fixed / group;
    row_begin = m_block * kBlockM;
    valid_rows = min(kBlockM, seq.S - row_begin);
  }
  if (valid_rows <= 0) return;   // uniform over a decode cluster (same rows, same batch)
  auto row_query = [&](int r) {  // query index s and head of block row r (clamped to valid rows)
    const int rr = row_begin + min(r, valid_rows - 1);
    if constexpr (Cfg::kDecode) return make_int2(rr / group, hk * group + rr % group);
    return make_int2(rr, h_fixed);
  };
  const float scale = p.scale != 0.0f ? p.scale : rsqrtf(static_cast<float>(D));
  const ScoreMap smap = score_map(p, scale);

  const KeyRange first = key_range(p, seq, row_query(0).x);
  const KeyRange last = key_range(p, seq, row_query(kBlockM - 1).x);
  int n_lo = first.lo / kBlockN;
  int n_hi = (last.hi + kBlockN - 1) / kBlockN;
  if (last.hi <= first.lo) n_hi = n_lo;  // nothing visible
  if constexpr (Cfg::kDecode) {
    const int splits = gridDim.x, split = blockIdx.x;
    const int per = (n_hi - n_lo + splits - 1) / splits;
    const int lo = n_lo + split * per;
    n_hi = min(n_hi, lo + per);
    n_lo = min(lo, n_hi);
  }

  const T* k_base = static_cast<const T*>(p.k) + row_offset(p.k_strides, b, seq.k_row0, 0, hk);
  const T* v_base = static_cast<const T*>(p.v) + row_offset(p.v_strides, b, seq.k_row0, 0, hk);
  if constexpr (Cfg::kDecode) {
    if (p.cache_settled) {
      // this block's K and V rows into L2 while the predecessor finishes (the new row, which it
      // writes, is read again after the wait: L2 holds the written line, not a stale one)
      constexpr int kLines = kRowBytes / 128;
      const int key_lo = n_lo * kBlockN, key_hi = min(n_hi * kBlockN, seq.T);
      for (int i = tid; i < (key_hi - key_lo) * kLines; i += Cfg::kThreads) {
        const int key = key_lo + i / kLines, line = (i % kLines) * 64;
        prefetch_l2(k_base + int64_t(key) * p.k_strides.row + line);
        prefetch_l2(v_base + int64_t(key) * p.v_strides.row + line);
      }
      grid_wait();
    }
  }
  auto load_kv = [&](int n_block, int stage) {
    const int key0 = n_block * kBlockN;
    const int valid = min(kBlockN, seq.T - key0);
    const uint32_t k_dst = smem_kv + stage * 2 * kTileBytes;
    load_tile_async<T, D>(k_dst, k_base + key0 * p.k_strides.row, p.k_strides.row, kBlockN, valid,
                          tid, Cfg::kThreads);
    load_tile_async<T, D>(k_dst + kTileBytes, v_base + key0 * p.v_strides.row, p.v_strides.row,
                          kBlockN, valid, tid, Cfg::kThreads);
  };

  // Q tile (rows beyond the valid ones zero-filled) joins the first commit group.
  {
    constexpr int kChunks = D / 8;
    const T* q = static_cast<const T*>(p.q);
    for (int i = tid; i < kBlockM * kChunks; i += Cfg::kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool valid = r < valid_rows;
      const int2 sh = row_query(r);
      const T* src = q + row_offset(p.q_strides, b, seq.q_row0, sh.x, sh.y) + c * 8;
      cp_async16(smem_q + tile_offset(r, c, kRowBytes), valid ? src : q, valid);
    }
  }
  const int n_iters = n_hi - n_lo;
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iters) load_kv(n_hi - 1 - s, s);
    cp_async_commit();
  }

  // Per-thread rows: g and g + 8 of the warp's 16; their queries' visible ranges.
  const int g = lane >> 2, t4 = lane & 3;
  KeyRange rng[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) rng[r] = key_range(p, seq, row_query(rw * 16 + g + 8 * r).x);
  const int lo_max = last.lo, hi_min = first.hi;

  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.0f, 0.0f};

  for (int it = 0; it < n_iters; ++it) {
    const int n_block = n_hi - 1 - it;
    const int stage = it % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < n_iters) load_kv(n_block - (kStages - 1), (it + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t k_tile = smem_kv + stage * 2 * kTileBytes;
    const uint32_t v_tile = k_tile + kTileBytes;
    const int key_local0 = kw * kWN;
    // S = Q·Kᵀ over this warp's kWN keys
    float s[kNT][4];
#pragma unroll
    for (int i = 0; i < kNT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_q + tile_offset(rw * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                          2 * kk + (lane >> 4), kRowBytes));
#pragma unroll
      for (int jn = 0; jn < kNT / 2; ++jn) {
        uint32_t bk[4];
        ldmatrix_x4(bk, k_tile + tile_offset(key_local0 + 16 * jn + (lane & 7) + (lane >> 4) * 8,
                                             2 * kk + ((lane >> 3) & 1), kRowBytes));
        mma16816<T>(s[2 * jn], a, bk[0], bk[1]);
        mma16816<T>(s[2 * jn + 1], a, bk[2], bk[3]);
      }
    }
    // softcap (natural units), mask, then the online softmax with the scale inside exp2
    const int key0 = n_block * kBlockN + key_local0;
    const bool need_mask = n_block * kBlockN < lo_max || (n_block + 1) * kBlockN > hi_min;
    if (smap.softcap()) {
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[i][e] = smap.cap(s[i][e]);
    }
    if (need_mask) {
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = key0 + 8 * i + 2 * t4 + (e & 1);
          const KeyRange& kr = rng[e >> 1];
          if (j < kr.lo || j >= kr.hi) s[i][e] = -INFINITY;
        }
    }
    const float sl2 = smap.scale_log2;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < kNT; ++i) mx = fmaxf(mx, fmaxf(s[i][2 * r], s[i][2 * r + 1]));
      mx = quad_max(mx) * sl2;
      const float m_new = fmaxf(m_row[r], mx);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = fast_exp2(m_row[r] - m_ref);
      m_row[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kNT; ++i) {
        s[i][2 * r] = fast_exp2(fmaf(s[i][2 * r], sl2, -m_ref));
        s[i][2 * r + 1] = fast_exp2(fmaf(s[i][2 * r + 1], sl2, -m_ref));
        sum += s[i][2 * r] + s[i][2 * r + 1];
      }
      l_row[r] = l_row[r] * alpha + sum;
#pragma unroll
      for (int i = 0; i < kDT; ++i) {
        o[i][2 * r] *= alpha;
        o[i][2 * r + 1] *= alpha;
      }
    }
    // O += P·V
#pragma unroll
    for (int kk = 0; kk < kWN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int jd = 0; jd < D / 16; ++jd) {
        uint32_t bv[4];
        ldmatrix_x4_trans(
            bv, v_tile + tile_offset(key_local0 + 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8,
                                     2 * jd + (lane >> 4), kRowBytes));
        mma16816<T>(o[2 * jd], a, bv[0], bv[1]);
        mma16816<T>(o[2 * jd + 1], a, bv[2], bv[3]);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) l_row[r] = quad_sum(l_row[r]);

  T* out = static_cast<T*>(p.out);
  if constexpr (!Cfg::kDecode) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rw * 16 + g + 8 * r;
      if (row >= valid_rows) continue;
      const int2 sh = row_query(row);
      const float inv = l_row[r] > 0.0f ? 1.0f / l_row[r] : 0.0f;
      T* dst = out + row_offset(p.out_strides, b, seq.q_row0, sh.x, sh.y);
#pragma unroll
      for (int i = 0; i < kDT; ++i)
        *reinterpret_cast<uint32_t*>(dst + 8 * i + 2 * t4) =
            pack2<T>(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
      if (p.lse != nullptr && t4 == 0)
        p.lse[lse_offset(p, b, seq.q_row0, sh.x, sh.y)] =
            l_row[r] > 0.0f ? (m_row[r] + __log2f(l_row[r])) * kLn2 : INFINITY;
    }
  } else {
    // ---- combine: warps, then the cluster ----
    if (p.workspace == nullptr) grid_launch_dependents();  // the keys are read
    constexpr int kSlot = decode_slot_floats(D);           // floats: O [16][D], m [16], l [16]
    float* slots = reinterpret_cast<float*>(smem + kBlockM * kRowBytes);
    __syncthreads();  // every warp is done with the K/V tiles this area overlays
    {
      float* mine = slots + kw * kSlot;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = g + 8 * r;
#pragma unroll
        for (int i = 0; i < kDT; ++i) {
          mine[row * D + 8 * i + 2 * t4] = o[i][2 * r];
          mine[row * D + 8 * i + 2 * t4 + 1] = o[i][2 * r + 1];
        }
        if (t4 == 0) {
          mine[16 * D + row] = m_row[r];
          mine[16 * D + 16 + row] = l_row[r];
        }
      }
    }
    __syncthreads();
    float* combined = slots + Cfg::kKeyWarps * kSlot;
    for (int idx = tid; idx < 16 * D + 16; idx += Cfg::kThreads) {
      const int row = idx < 16 * D ? idx / D : idx - 16 * D;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < Cfg::kKeyWarps; ++w) m = fmaxf(m, slots[w * kSlot + 16 * D + row]);
      const float m_ref = m == -INFINITY ? 0.0f : m;
      float acc = 0.0f;
      if (idx < 16 * D) {
#pragma unroll
        for (int w = 0; w < Cfg::kKeyWarps; ++w)
          acc += slots[w * kSlot + idx] * fast_exp2(slots[w * kSlot + 16 * D + row] - m_ref);
        combined[idx] = acc;
      } else {
#pragma unroll
        for (int w = 0; w < Cfg::kKeyWarps; ++w)
          acc += slots[w * kSlot + 16 * D + 16 + row] *
                 fast_exp2(slots[w * kSlot + 16 * D + row] - m_ref);
        combined[16 * D + row] = m;
        combined[16 * D + 16 + row] = acc;
      }
    }
    if (p.workspace != nullptr) {  // this split's partial, for flash_decode_combine_kernel
      __syncthreads();
      const int64_t slot = (int64_t(b) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
      float4* dst = reinterpret_cast<float4*>(static_cast<float*>(p.workspace) + slot * kSlot);
      const float4* src = reinterpret_cast<const float4*>(combined);
      for (int i = tid; i < kSlot / 4; i += Cfg::kThreads) dst[i] = src[i];
      return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int csize = static_cast<int>(cluster.num_blocks());
    const int crank = static_cast<int>(cluster.block_rank());
    auto part_of = [&](int c) {
      return csize > 1 ? cluster.map_shared_rank(combined, c) : combined;
    };
    if (csize > 1)
      cluster.sync();
    else
      __syncthreads();
#else
    constexpr int csize = 1, crank = 0;  // clusters need sm_90: one block per row tile
    auto part_of = [&](int) { return combined; };
    __syncthreads();
#endif
    // Every block finishes a slice of the (row, column) outputs. A thread gathers the csize
    // partials of its element with independent distributed-shared-memory loads, all issued before
    // any is used: one round trip to the other blocks, where a loop of dependent reads took csize
    // of them (~2 µs of a 15 µs call at 4096 keys).
    constexpr int kMaxCluster = 16;
    for (int idx = crank * Cfg::kThreads + tid; idx < valid_rows * D;
         idx += csize * Cfg::kThreads) {
      const int row = idx / D, d = idx % D;
      float pm[kMaxCluster], pl[kMaxCluster], po[kMaxCluster];
#pragma unroll
      for (int c = 0; c < kMaxCluster; ++c) {
        if (c < csize) {
          const float* part = part_of(c);
          pm[c] = part[16 * D + row];
          pl[c] = part[16 * D + 16 + row];
          po[c] = part[row * D + d];
        }
      }
      float m = -INFINITY;
#pragma unroll
      for (int c = 0; c < kMaxCluster; ++c)
        if (c < csize) m = fmaxf(m, pm[c]);
      const float m_ref = m == -INFINITY ? 0.0f : m;
      float l = 0.0f, acc = 0.0f;
#pragma unroll
      for (int c = 0; c < kMaxCluster; ++c) {
        if (c < csize) {
          const float w = fast_exp2(pm[c] - m_ref);
          l += pl[c] * w;
          acc += po[c] * w;
        }
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int2 sh = row_query(row);
      T* dst = out + row_offset(p.out_strides, b, seq.q_row0, sh.x, sh.y);
      dst[d] = hk::sdk::cuda::from_f32<T>(acc * inv);
      if (p.lse != nullptr && d == 0)
        p.lse[lse_offset(p, b, seq.q_row0, sh.x, sh.y)] =
            l > 0.0f ? (m + __log2f(l)) * kLn2 : INFINITY;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (csize > 1) cluster.sync();  // no block leaves while another still reads its slots
#endif
  }
}

// The split-KV decode's second kernel when the partials went through the workspace: block
// (row r, row tile, batch) combines the gridDim-x splits of the split kernel for row r — maxima,
// sums and O, in split order, so repeats are bit-identical — into out and lse; thread d owns
// column d. Launched with programmatic dependent launch behind the split kernel: it waits for
// that grid to finish (and its writes to be visible) before reading.
template <class T, int D>
__global__ void __launch_bounds__(D) flash_decode_combine_kernel(const Params p, int splits) {
  constexpr int kSlot = decode_slot_floats(D);
  grid_wait();
  const int r = blockIdx.x, b = blockIdx.z, d = threadIdx.x;
  const int group = p.heads_q / p.heads_kv;
  const SeqInfo seq = seq_info(p, b);
  const int tiles = (p.seqlen_q * group + 15) / 16;
  const int hk = blockIdx.y / tiles, row_begin = (blockIdx.y % tiles) * 16;
  const int valid_rows = min(16, seq.S * group - row_begin);
  if (r >= valid_rows) return;
  const float* parts = static_cast<const float*>(p.workspace) +
                       (int64_t(b) * gridDim.y + blockIdx.y) * splits * int64_t(kSlot);
  float m = -INFINITY;
  for (int c = 0; c < splits; ++c) m = fmaxf(m, parts[c * kSlot + 16 * D + r]);
  const float m_ref = m == -INFINITY ? 0.0f : m;
  float l = 0.0f, acc = 0.0f;
  for (int c = 0; c < splits; ++c) {
    const float* part = parts + c * kSlot;
    const float w = fast_exp2(part[16 * D + r] - m_ref);
    l += part[16 * D + 16 + r] * w;
    acc += part[r * D + d] * w;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const int rr = row_begin + r;
  const int s = rr / group, h = hk * group + rr % group;
  T* dst = static_cast<T*>(p.out) + row_offset(p.out_strides, b, seq.q_row0, s, h);
  dst[d] = hk::sdk::cuda::from_f32<T>(acc * inv);
  if (p.lse != nullptr && d == 0)
    p.lse[lse_offset(p, b, seq.q_row0, s, h)] = l > 0.0f ? (m + __log2f(l)) * kLn2 : INFINITY;
}

}  // namespace hk_flash
