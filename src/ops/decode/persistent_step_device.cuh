// Internal: the device pieces of the persistent batch-1 decode step (step_persistent_sm90.cu) that
// its benchmark probes share (bench/ops: hk_bench_split_step, hk_bench_persistent_step through
// decode_step_probe.cuh) — grid-wide counters, the loads of data other blocks write during the
// launch, bf16 helpers, a block's rows of a split, the tensor-core row products and the tagged
// fixed-point accumulator element. Header-only, sm_90, nvcc; no launch, no host code, no shape
// beyond what the callers pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hk/kernel_sdk_sm90.cuh"

namespace hk::decode::persistent {

using bf16 = __nv_bfloat16;

// ---- grid-wide counters -----------------------------------------------------------------------
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A wait that never ends (a protocol bug, or a grid not co-resident) traps after ~4 million polls
// (seconds; a real wait is microseconds), so a launch fails instead of hanging the GPU.
__device__ __forceinline__ void count_tries(uint32_t& tries) {
  if (++tries > (1u << 22)) __trap();
}
// An mbarrier phase, with the same watchdog (the SDK's mbar_wait allows 2^24 tries, each of which
// may suspend the thread for a while: minutes, were a persistent step's protocol broken).
__device__ __forceinline__ void wait_phase(uint32_t bar, uint32_t parity) {
  for (uint32_t tries = 0; !hk::sdk::cuda::sm90::mbar_try_wait(bar, parity);) count_tries(tries);
}
__device__ __forceinline__ void wait_count(const unsigned* c, unsigned target) {
  for (uint32_t tries = 0; load_acquire(c) < target;) count_tries(tries);
}
// The block's arrival on a counter: the caller's barrier before it orders the block's stores and
// reductions before this add.
__device__ __forceinline__ void release_add(unsigned* c) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(c), "r"(1u) : "memory");
}
// An arrival that orders nothing: a count others may wait on before they check what they read by
// other means (the deterministic sums' tags).
__device__ __forceinline__ void relaxed_add(unsigned* c) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(c), "r"(1u) : "memory");
}

// ---- loads of what other blocks write this launch -----------------------------------------------
// Behind a counter: from L2 (.cg), volatile with a memory clobber so the compiler keeps them after
// the wait and the barrier.
__device__ __forceinline__ uint4 load_cg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint2 load_cg8(const void* p) {
  uint2 v;
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float load_cg_bf16(const bf16* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u16 %0, [%1];\n" : "=h"(v) : "l"(p) : "memory");
  return __bfloat162float(__ushort_as_bfloat16(v));
}
// Polled with no counter before them (tagged data): relaxed at gpu scope, not the weak .cg loads
// above, so each word is read whole and fresh.
__device__ __forceinline__ uint4 load_relaxed16(const void* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void load_relaxed_2x64(const void* p, unsigned long long& a,
                                                  unsigned long long& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];\n"
               : "=l"(a), "=l"(b)
               : "l"(p)
               : "memory");
}

// ---- per-thread asynchronous copies (sm_80 form): 16 bytes global → shared, waited for by the
// issuing thread (cp.async.wait_all), then visible to the block after its barrier ---------------
__device__ __forceinline__ void copy_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// ---- bf16 ---------------------------------------------------------------------------------------
__device__ __forceinline__ void bf16x4(uint2 v, float (&f)[4]) {
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}
__device__ __forceinline__ void bf16x8(uint4 v, float (&f)[8]) {
  float lo[4], hi[4];
  bf16x4(make_uint2(v.x, v.y), lo);
  bf16x4(make_uint2(v.z, v.w), hi);
  for (int i = 0; i < 4; ++i) f[i] = lo[i], f[4 + i] = hi[i];
}
// x rounded to bf16 and back
__device__ __forceinline__ float bf(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// ---- splits -------------------------------------------------------------------------------------
// The first of a block's rows when n rows are split over `grid` blocks (32-bit division where the
// product fits: a 64-bit one is a long instruction sequence, and a step calls this every phase).
__host__ __device__ __forceinline__ int64_t row_begin(int64_t n, int block, int grid) {
  const int64_t product = n * block;
  if (product < (int64_t(1) << 32)) return int64_t(uint32_t(product) / uint32_t(grid));
  return product / grid;
}
// The attention + o_proj phase's rows: head h's head_dim rows of W_oᵀ over blocks [⌊grid·h/H⌋,
// ⌊grid·(h+1)/H⌋), so a block attends one head (closed form: a search loop with 64-bit divisions
// was ~14 % of the probe's instructions).
__host__ __device__ inline void attend_rows(int block, int grid, int heads, int head_dim, int& head,
                                            int64_t& r0, int64_t& r1) {
  head = min((heads * (block + 1) - 1) / grid, heads - 1);
  const int first = grid * head / heads, m = grid * (head + 1) / heads - first;
  r0 = int64_t(head) * head_dim + head_dim * (block - first) / m;
  r1 = int64_t(head) * head_dim + head_dim * (block - first + 1) / m;
}

// ---- row products on the tensor cores -----------------------------------------------------------
// D += A·B, m16n8k16, bf16 in, f32 accumulate
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// Two chunks' 8 rows of kRowBytes / 2 bf16 (rows g and g + 8 of the MMA's A) times x (bf16 in
// shared memory, every B column a copy of it), an MMA a 16 of them. Lane (g = lane / 4, q = lane %
// 4) loads 16 bytes of its row in each 64-byte block (and of x): fragment positions map to k in
// that order for A and B alike, so the sum is unchanged; odd g take each 128-byte pair's blocks in
// the other order, so a quarter warp's two rows fall in different banks (column n = g & 1 of the
// result is then the one whose orders match). Row g's sums (lanes q == 0): the first chunk's, then
// the second's. k blocks [j0, j0 + kSpan) of 32 elements (bytes [64·j0, 64·(j0 + kSpan)) of each
// row) of the same product; j0 even, so each block's swizzle parity is that of its place in the
// span. kPairs pairs of chunks (chunks[2p], chunks[2p + 1]) at once, their MMA chains interleaved
// (2·kPairs independent chains; each pair's sums the same bits whatever kPairs): pair p's in y[2p],
// y[2p + 1].
template <int kRowBytes, int kSpan, int kPairs>
__device__ __forceinline__ void rows_mma_pairs(const unsigned char* const (&chunks)[2 * kPairs],
                                               const unsigned char* x, int lane, int j0,
                                               float (&y)[2 * kPairs]) {
  static_assert(kSpan % 2 == 0, "a span keeps the 128-byte pairs whole");
  const int g = lane / 4, q = lane % 4, odd = g & 1;
  const int sw = odd ? 64 : 0;  // block j at j·64 + sw (even j), j·64 − sw (odd j)
  const int row = g * kRowBytes + q * 16 + sw + j0 * 64;
  const unsigned char* xv = x + q * 16 + sw + j0 * 64;
  float d[kPairs][2][4] = {};
#pragma unroll
  for (int j = 0; j < kSpan; ++j) {
    const int off = j * 64 - ((j & 1) ? 2 * sw : 0);
    const uint4 xx = *reinterpret_cast<const uint4*>(xv + off);
    uint4 wa[kPairs], wb[kPairs];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      wa[p] = *reinterpret_cast<const uint4*>(chunks[2 * p] + row + off);
      wb[p] = *reinterpret_cast<const uint4*>(chunks[2 * p + 1] + row + off);
    }
#pragma unroll
    for (int p = 0; p < kPairs; ++p)
      mma_16816(d[p][0], wa[p].x, wb[p].x, wa[p].y, wb[p].y, xx.x, xx.y);
#pragma unroll
    for (int p = 0; p < kPairs; ++p)
      mma_16816(d[p][1], wa[p].z, wb[p].z, wa[p].w, wb[p].w, xx.z, xx.w);
  }
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    y[2 * p] = odd ? d[p][0][1] + d[p][1][1] : d[p][0][0] + d[p][1][0];
    y[2 * p + 1] = odd ? d[p][0][3] + d[p][1][3] : d[p][0][2] + d[p][1][2];
  }
}
template <int kK>
__device__ __forceinline__ void rows_mma(const unsigned char* chunk_a, const unsigned char* chunk_b,
                                         const unsigned char* x, int lane, float& ya, float& yb) {
  float y[2];
  rows_mma_pairs<kK * 2, kK / 32, 1>({chunk_a, chunk_b}, x, lane, 0, y);
  ya = y[0], yb = y[1];
}
// rows_mma's results for chunks i and i + 1 (`two`) of kRowsPerChunk rows each, handed to
// sink(row, y) by lanes q == 0 for the rows below `rows`.
template <int kRowsPerChunk, class Sink>
__device__ __forceinline__ void sink_pair(int lane, int i, int rows, bool two, float ya, float yb,
                                          Sink&& sink) {
  const int g = lane / 4;
  if (lane % 4 == 0 && i * kRowsPerChunk + g < rows) sink(i * kRowsPerChunk + g, ya);
  if (lane % 4 == 0 && two && (i + 1) * kRowsPerChunk + g < rows)
    sink((i + 1) * kRowsPerChunk + g, yb);
}
// Split-K: a thread's 4 columns of every row of a chunk (`w` at the thread's columns, rows
// kRowBytes apart) times that row's input c[r], added into acc.
template <int kRowsPerChunk, int kRowBytes>
__device__ __forceinline__ void add_chunk_columns(const unsigned char* w, const float* c,
                                                  float (&acc)[4]) {
#pragma unroll
  for (int r = 0; r < kRowsPerChunk; ++r) {
    float f[4];
    bf16x4(*reinterpret_cast<const uint2*>(w + r * kRowBytes), f);
    for (int e = 0; e < 4; ++e) acc[e] = fmaf(f[e], c[r], acc[e]);
  }
}

// ---- the weight stream
// ---------------------------------------------------------------------------- A block's weight
// chunks in stream order: phase by phase, each phase's `segments` matrices (w[0], w[1], …: rows of
// kRowElems bf16), kRowsPerChunk rows at a time over the block's rows [r0, r1) of the phase, which
// rows_of(phase, r0, r1) gives (phases where the block has none are skipped).
template <class Phase, class RowsOf, int kRowsPerChunk, int kRowElems>
struct ChunkCursor {
  const Phase* phases;
  int n_phases;
  RowsOf rows_of;
  int p = 0, seg = 0, segments = 0;
  int64_t r = 0, r0 = 0, r1 = 0;
  const bf16* w = nullptr;  // the matrix being streamed (read once a segment, not a chunk)
  __device__ ChunkCursor(const Phase* ph, int n, RowsOf rows)
      : phases(ph), n_phases(n), rows_of(rows) {
    enter();
  }
  __device__ void enter() {  // the first non-empty chunk from phase p, matrix seg, row r0 on
    while (p < n_phases) {
      rows_of(phases[p], r0, r1);
      if (r1 > r0) break;
      ++p;
    }
    r = r0;
    if (p < n_phases) segments = phases[p].segments, w = phases[p].w[seg];
  }
  __device__ bool valid() const { return p < n_phases; }
  __device__ uint32_t bytes() const {
    return uint32_t(min(int64_t(kRowsPerChunk), r1 - r)) * kRowElems * 2;
  }
  __device__ const bf16* source() const { return w + r * kRowElems; }
  __device__ void advance() {
    r += kRowsPerChunk;
    if (r < r1) return;
    if (++seg < segments) {
      r = r0, w = phases[p].w[seg];
      return;
    }
    seg = 0, ++p;
    enter();
  }
};
// The consumers' position in the ring: the next chunk's slot and how many times the ring had
// wrapped before it (every consumer thread counts the same; kept by additions — a 64-bit division
// a chunk cost the probe more than the chunk's products).
struct RingPos {
  int slot;
  uint32_t use;
  __device__ uint32_t parity() const { return use & 1; }
  __device__ RingPos after(int slots) const {
    return slot + 1 == slots ? RingPos{0, use + 1} : RingPos{slot + 1, use};
  }
};

// ---- a block's share of one head's attention
// ------------------------------------------------------ The scores of q (f32, shared memory)
// against cache_t K rows (bf16, kHeadDim each, in shared memory; positions before key_start masked)
// a thread a position, each thread reading its row's 16-byte pieces in a rotated order (no bank
// conflicts within a quarter warp) — or, kSwizzled, rows whose piece i lies at piece i ^ (t & 7),
// read in the same order by every thread, so q's pieces are broadcasts (a third of the shared
// memory wavefronts: q's rotated reads conflict two ways); the softmax; and the output dims d <
// rows from V (in shared memory, v_at(d, t) position t's value of dim d as f32; the caller picks
// the layout) a warp a dim: dims[d] = bf16(o / l) as f32, and out[d] as bf16 when out is not null.
// `scores` holds cache_t floats, `reduce` 2·kWarps; the kWarps·32 threads call it together (`sync`
// their barrier).
template <int kHeadDim, int kWarps, bool kSwizzled = false, class VAt, class Sync>
__device__ void attend_dims(const unsigned char* kbuf, const float* qs, VAt v_at, float* scores,
                            float* reduce, int cache_t, int key_start, float scale, int rows,
                            float* dims, bf16* out, Sync sync) {
  constexpr int kThreads = kWarps * 32, kPieces = kHeadDim / 8;
  static_assert((kPieces & (kPieces - 1)) == 0, "pieces rotate by a mask");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float m = -INFINITY;
  for (int t = tid; t < cache_t; t += kThreads) {
    const unsigned char* krow = kbuf + t * kHeadDim * 2;
    float sc[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int piece = kSwizzled ? i : (i + t) & (kPieces - 1);
      const int at = kSwizzled ? i ^ (t & 7) : piece;
      const uint4 kq = *reinterpret_cast<const uint4*>(krow + at * 16);
      const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&kq);
      const float4 qa = *reinterpret_cast<const float4*>(qs + piece * 8);
      const float4 qb = *reinterpret_cast<const float4*>(qs + piece * 8 + 4);
      const float2 k0 = __bfloat1622float2(e[0]), k1 = __bfloat1622float2(e[1]);
      const float2 k2 = __bfloat1622float2(e[2]), k3 = __bfloat1622float2(e[3]);
      sc[i & 1] += qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y;
      sc[i & 1] += qb.x * k2.x + qb.y * k2.y + qb.z * k3.x + qb.w * k3.y;
    }
    const float sv = t < key_start ? -INFINITY : (sc[0] + sc[1]) * scale;
    scores[t] = sv;
    m = fmaxf(m, sv);
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) reduce[warp] = m;
  sync();
  m = reduce[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, reduce[w]);
  float l = 0;
  for (int t = tid; t < cache_t; t += kThreads) l += (scores[t] = __expf(scores[t] - m));
  for (int o = 16; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) reduce[kWarps + warp] = l;
  sync();
  l = 0;
  for (int w = 0; w < kWarps; ++w) l += reduce[kWarps + w];
  for (int d = warp; d < rows; d += kWarps) {
    float o = 0;
    for (int t = lane; t < cache_t; t += 32) o += scores[t] * v_at(d, t);
    for (int s = 16; s > 0; s /= 2) o += __shfl_xor_sync(0xffffffffu, o, s);
    if (lane == 0) {
      dims[d] = bf(o / l);
      if (out != nullptr) out[d] = __float2bfloat16_rn(o / l);
    }
  }
}

// ---- the tagged fixed-point accumulator element -------------------------------------------------
// count·2^58 + Σ (2^50 + v·2^32) over its contributions, |v·2^32| < 2^50 (clamped), so ≤ 63
// contributions never carry into the count: a reader knows from the element itself that it is
// complete, and the integer sum does not depend on the order contributions land in.
constexpr float kFixedScale = 4294967296.f;  // 2^32
constexpr int kTagShift = 58, kMaxTagCount = 63;
constexpr long long kTagBias = 1ll << 50;
// The same with the count from bit `shift` for up to `most` contributions: 6 bits (the above) to
// 63, 7 bits to 127 (count·2^57, biases 2^49, |v| < 2^17), fewer copies needing more.
struct TagFormat {
  int shift;
  long long bias;
};
__host__ __device__ constexpr TagFormat tag_format(int most) {
  return most <= kMaxTagCount ? TagFormat{kTagShift, kTagBias} : TagFormat{57, 1ll << 49};
}
constexpr int kMaxTagCountWide = 127;
// `most` contributions, each in (0, 2·bias), never carry into the count, and the count fits above
// `shift`: the integer sum is exact and a reader reads completeness off the element itself
constexpr bool tag_format_holds(int most) {
  const TagFormat t = tag_format(most);
  const unsigned long long sum_bound =
      static_cast<unsigned long long>(most) * 2ull * static_cast<unsigned long long>(t.bias);
  return sum_bound <= (1ull << t.shift) && most < (1 << (64 - t.shift));
}
static_assert(tag_format_holds(kMaxTagCount) && tag_format_holds(kMaxTagCountWide),
              "tagged sums carry into their count");
__device__ __forceinline__ long long tagged_contribution(float v,
                                                         TagFormat t = tag_format(kMaxTagCount)) {
  long long f = llrintf(v * kFixedScale);
  f = max(-t.bias + 1, min(t.bias - 1, f));
  return (1ll << t.shift) + t.bias + f;
}
// The tag of a step's (bf16, tag) words: 1 … 65535, never the 0 of zeroed memory.
__device__ __forceinline__ unsigned step_tag(unsigned epoch) {
  return epoch % 65535u + 1u;
}

}  // namespace hk::decode::persistent
