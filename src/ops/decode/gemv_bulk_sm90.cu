// Decode GEMV for 1–8 rows of x whose weight rows are staged whole in shared memory before the
// kernel waits on its predecessor: the small-batch path of decode::gemv (gemv_cuda.cu picks it).
//
// Why a second gemv: at batch 1 a layer's products stream 4–13 MB each, a few tens of KB an SM.
// The mma.sync gemv holds only its first chunks in registers before the PDL wait and reads the rest
// after it, so every launch pays memory round trips on the step's critical path; its 16-row tiles
// leave half the SMs idle for o_proj and down (64 tiles), and its 2–4 blocks an SM leave no room
// for the next launch's blocks to start early. Here a block owns 8–32 weight rows — as few blocks
// as cover the SMs once, so the next launch's block fits beside this one and stages its own
// weights while this one computes. One thread copies the block's rows (and the RMSNorm weight)
// into shared memory with 1-D bulk copies on an mbarrier as the block starts; after the wait only
// x is read from global memory, into shared memory too (normalised there when the RMSNorm prologue
// is fused). The products run on tensor cores with x as the 16-row operand (rows m..15 are zero)
// and each 8-row group of W as the 8-column one; the k order inside a 32-wide chunk is permuted
// identically for both (a dot product does not notice), so every lane reads 16 contiguous bytes of
// each. Each of the 8 warps takes every eighth chunk; their partial sums are added in a fixed order
// (deterministic). Prologue and SwiGLU epilogue have the mma.sync gemv's semantics and rounding
// points (decode_kernels.h). Not here: more than 8 rows of x, f32, launches whose weights do not
// fit in shared memory across the SMs in one pass (lm_head), devices before sm_90
// (bulk_groups names which; gemv then takes the mma.sync kernel).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "hk/kernel_sdk_sm90.cuh"
#include "ops/decode/decode_common.cuh"
#include "ops/decode/gemv_args.cuh"

namespace hk::decode::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kGroupRows = 8;        // weight rows of one n-tile of the mma
constexpr int kMaxGroups = 4;        // n-tiles a block (up to 32 weight rows)
constexpr int kMaxRows = 8;          // rows of x (the mma's m is 16; rows past m are zero)
constexpr int kRowPadBytes = 64;     // after each staged row: rows land 64 bytes apart in the banks
constexpr int kMaxPrologueK = 2048;  // the prologue keeps a row's k/256 16-byte pieces in registers
// A block's shared memory: with the next kernel's block beside it (PDL), both stay resident.
constexpr size_t kSmemBudget = 128 * 1024;

// Dynamic shared memory of one block: two mbarriers, the staged weight rows (one set, or gate then
// up; the warps' partial sums reuse them once the products are done), the RMSNorm weight, x, and
// with the prologue the rows' scales.
struct BulkLayout {
  uint32_t row_bytes = 0, w = 0, norm_w = 0, x = 0, scale = 0, total = 0;
  __host__ __device__ BulkLayout(int m, int k, bool prologue, int sets, int groups) {
    row_bytes = uint32_t(k) * 2 + kRowPadBytes;
    w = 128;
    const uint32_t staged = uint32_t(sets * groups * kGroupRows) * row_bytes;
    const uint32_t partials = uint32_t(kWarps * sets * groups) * 64 * 4;
    norm_w = w + (staged > partials ? staged : partials);
    x = norm_w + (prologue ? uint32_t(k) * 2 : 0u);
    scale = x + uint32_t(m) * row_bytes;
    total = scale + (prologue ? uint32_t(kMaxRows) * 4 : 0u);
  }
};

// One 16-byte piece (eight values) of a row normalised: x·r rounded to T, times the norm weight —
// the mma.sync gemv's prologue rounding.
template <class T>
__device__ __forceinline__ uint4 normalised_piece(const uint4& x, float r, const uint4& w) {
  uint4 o;
  uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
  for (int e = 0; e < 4; ++e)
    ow[e] = pack2<T>(round_as<T>(lane_value<T>(x, 2 * e) * r) * lane_value<T>(w, 2 * e),
                     round_as<T>(lane_value<T>(x, 2 * e + 1) * r) * lane_value<T>(w, 2 * e + 1));
  return o;
}

// kGroups: n-tiles of 8 weight rows a block (host: as few blocks as cover the SMs once, so the
// next launch's blocks fit beside them and stage their weights while this one computes).
// kNormSpread: the prologue's rows scaled by every thread rather than by each row's warp (at up to
// norm_spread_rows() rows).
template <class T, bool kPrologue, bool kPair, int kGroups, bool kNormSpread>
__global__ void __launch_bounds__(kThreads) gemv_bulk_kernel(const GemvArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace hk::sdk::cuda::sm90;
  constexpr int kSets = kPair ? 2 : 1;
  constexpr int kTileRows = kGroups * kGroupRows;
  extern __shared__ __align__(128) unsigned char smem[];
  const BulkLayout lay(a.m, a.k, kPrologue, kSets, kGroups);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar_w = base, bar_norm = base + 8;
  const int tile = blockIdx.x;
  const int s = kPair ? 0 : segment_of(a, tile);
  const int r0 = (tile - a.tile_begin[s]) * kTileRows;
  const int k = a.k, rows_here = min(kTileRows, a.n[s] - r0);
  const uint32_t k_bytes = uint32_t(k) * 2;

  trace_point(a, 0);
  // The weights depend on no kernel: copied before the wait, so they stream while the
  // predecessor finishes.
  if (threadIdx.x == 0) {
    mbar_init(bar_w, 1);
    mbar_init(bar_norm, 1);
    fence_barrier_init();
    if constexpr (kPrologue) {
      mbar_expect_tx(bar_norm, k_bytes);
      bulk_load(base + lay.norm_w, a.prologue.norm_weight, k_bytes, bar_norm);
    }
    mbar_expect_tx(bar_w, uint32_t(kSets * rows_here) * k_bytes);
#pragma unroll
    for (int q = 0; q < kSets; ++q) {
      const char* w = static_cast<const char*>(a.w[kPair ? q : s]) + int64_t(r0) * k_bytes;
      for (int r = 0; r < rows_here; ++r)
        bulk_load(base + lay.w + uint32_t(q * kTileRows + r) * lay.row_bytes,
                  w + int64_t(r) * k_bytes, k_bytes, bar_w);
    }
  }
  trace_point(a, 1);
  __syncthreads();  // the mbarriers are initialised before any thread waits on them
  grid_wait();
  grid_launch_dependents();
  trace_point(a, 2);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* xs = reinterpret_cast<T*>(smem + lay.x);
  const int x_stride = int(lay.row_bytes / 2);  // elements
  if constexpr (kPrologue) {
    // x = rms_norm(residual + delta): one warp a row, every 16-byte piece of the row loaded before
    // any is used (one round trip), the sum rounded as ops::add and written back by block 0.
    constexpr int kPieces = kMaxPrologueK / 256;
    if (warp < a.m) {
      const int row = warp;
      const T* res = static_cast<const T*>(a.prologue.residual) + row * a.prologue.residual_stride;
      const T* del = a.prologue.delta
                         ? static_cast<const T*>(a.prologue.delta) + row * a.prologue.delta_stride
                         : nullptr;
      uint4 v[kPieces], d[kPieces];
#pragma unroll
      for (int i = 0; i < kPieces; ++i) {
        const int c = lane * 8 + 256 * i;
        v[i] = c < k ? load_ro16(res + c) : zero16();
        d[i] = del && c < k ? load_ro16(del + c) : zero16();
      }
      T* out = a.prologue.residual_out && del && blockIdx.x == 0
                   ? static_cast<T*>(a.prologue.residual_out) + row * a.prologue.residual_out_stride
                   : nullptr;
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < kPieces; ++i) {
        const int c = lane * 8 + 256 * i;
        if (c >= k) continue;
        if (del) {
          uint32_t* w = reinterpret_cast<uint32_t*>(&v[i]);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            w[e] = pack2<T>(lane_value<T>(v[i], 2 * e) + lane_value<T>(d[i], 2 * e),
                            lane_value<T>(v[i], 2 * e + 1) + lane_value<T>(d[i], 2 * e + 1));
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float f = lane_value<T>(v[i], e);
          ss += f * f;
        }
        if (out) *reinterpret_cast<uint4*>(out + c) = v[i];
      }
      trace_point(a, 7, ss);
      ss = warp_sum(ss);
      if constexpr (kNormSpread) {
        // the summed row into shared memory as it stands and its scale beside it; every thread
        // then normalises a share of the pieces in place
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
          const int c = lane * 8 + 256 * i;
          if (c < k) *reinterpret_cast<uint4*>(xs + row * x_stride + c) = v[i];
        }
        if (lane == 0)
          reinterpret_cast<float*>(smem + lay.scale)[row] =
              rsqrtf(ss / static_cast<float>(k) + a.prologue.eps);
      } else {
        const float r = rsqrtf(ss / static_cast<float>(k) + a.prologue.eps);
        mbar_wait(bar_norm, 0);
        trace_point(a, 8, r);
        const T* nw = reinterpret_cast<const T*>(smem + lay.norm_w);
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
          const int c = lane * 8 + 256 * i;
          if (c >= k) continue;
          const uint4 wv = *reinterpret_cast<const uint4*>(nw + c);
          *reinterpret_cast<uint4*>(xs + row * x_stride + c) = normalised_piece<T>(v[i], r, wv);
        }
        trace_point(a, 9);
      }
    }
    if constexpr (kNormSpread) {
      __syncthreads();
      mbar_wait(bar_norm, 0);
      trace_point(a, 8);
      const T* nw = reinterpret_cast<const T*>(smem + lay.norm_w);
      const float* scale = reinterpret_cast<const float*>(smem + lay.scale);
      for (int i = threadIdx.x; i < a.m * (k / 8); i += kThreads) {
        const int row = i / (k / 8), c = (i % (k / 8)) * 8;
        uint4* at = reinterpret_cast<uint4*>(xs + row * x_stride + c);
        const uint4 xv = *at, wv = *reinterpret_cast<const uint4*>(nw + c);
        *at = normalised_piece<T>(xv, scale[row], wv);
      }
      trace_point(a, 9);
    }
  } else {
    // x rows into shared memory: every thread's 16-byte pieces loaded at once
    const int pieces = a.m * (k / 8);
    for (int i = threadIdx.x; i < pieces; i += kThreads) {
      const int row = i / (k / 8), c = (i % (k / 8)) * 8;
      *reinterpret_cast<uint4*>(xs + row * x_stride + c) =
          load_ro16(static_cast<const T*>(a.x) + row * a.x_stride + c);
    }
  }
  __syncthreads();
  trace_point(a, 3);
  mbar_wait(bar_w, 0);
  trace_point(a, 4);

  // A (x): rows g and g + 8 of the 16; only g < m exist. B (W): column g = weight row g of each
  // 8-row group; one x fragment serves every group and set.
  const int g = lane >> 2, t = lane & 3;
  const bool x_ok = g < a.m;
  const T* xr = xs + (x_ok ? g : 0) * x_stride + t * 8;
  const unsigned char* wr = smem + lay.w + g * lay.row_bytes + t * 16;
  float acc[kSets][kGroups][4];
#pragma unroll
  for (int q = 0; q < kSets; ++q)
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[q][gi][r] = 0.0f;
  const int chunks = k / 32;
#pragma unroll 2
  for (int c = warp; c < chunks; c += kWarps) {
    const uint4 xv = x_ok ? *reinterpret_cast<const uint4*>(xr + c * 32) : zero16();
#pragma unroll
    for (int q = 0; q < kSets; ++q)
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) {
        const uint4 wv = *reinterpret_cast<const uint4*>(
            wr + (q * kTileRows + gi * kGroupRows) * lay.row_bytes + c * 64);
        mma16816<T>(acc[q][gi], xv.x, 0u, xv.y, 0u, wv.x, wv.y);
        mma16816<T>(acc[q][gi], xv.z, 0u, xv.w, 0u, wv.z, wv.w);
      }
  }

  // acc[q][gi][0..1] = C[x row g][weight rows 8gi + 2t, + 1] (acc[..][2..3]: the zero rows g + 8),
  // summed over the warps in a fixed order through the staging area the products are done with
  trace_point(a, 5);
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem + lay.w);
  constexpr int kPartials = kSets * kGroups * 64;
#pragma unroll
  for (int q = 0; q < kSets; ++q)
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        red[warp * kPartials + (q * kGroups + gi) * 64 + g * 8 + 2 * t + e] = acc[q][gi][e];
  __syncthreads();
  for (int i = threadIdx.x; i < kGroups * 64; i += kThreads) {
    const int gi = i >> 6, row = (i >> 3) & 7, col = gi * kGroupRows + (i & 7);
    if (row >= a.m || col >= rows_here) continue;
    float sum[kSets];
#pragma unroll
    for (int q = 0; q < kSets; ++q) {
      sum[q] = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum[q] += red[w * kPartials + q * kGroups * 64 + i];
    }
    store_output<T, kPair>(a, s, row, r0 + col, sum);
  }
  trace_point(a, 6);
#else
  (void)a;
#endif
}

// Rows of x up to which the RMSNorm prologue normalises with every thread (each row's warp sums
// it, then all 256 threads scale its pieces) instead of with each row's own warp. At one row that
// warp's normalisation was the prologue's longest step after the loads (0.48 of 1.8 µs on the
// H200, 2026-12-04; 0.23 spread); measured in one call, decode at 16+128 with the spread up to
// 0 / 1 / 4 rows: batch 1 1,503–1,509 / 1,525–1,527 / 1,526 tok/s, batch 2 2,821 / 2,824–2,827 /
// 2,843, batch 4 5,537–5,540 / 5,534–5,539 / 5,464–5,469 (batch 8 the same throughout) — so up to
// 2 rows. HK_DECODE_NORM_SPREAD_ROWS=N overrides it (0: never).
int norm_spread_rows() {
  static const int rows = [] {
    const char* v = std::getenv("HK_DECODE_NORM_SPREAD_ROWS");
    return v ? std::atoi(v) : 2;
  }();
  return rows;
}

template <class T, bool kPrologue, bool kPair, int kGroups>
void launch_bulk(const GemvArgs& a, Stream stream) {
  const BulkLayout lay(a.m, a.k, kPrologue, kPair ? 2 : 1, kGroups);
  auto kernel = gemv_bulk_kernel<T, kPrologue, kPair, kGroups, false>;
  if constexpr (kPrologue)
    if (a.m <= norm_spread_rows()) kernel = gemv_bulk_kernel<T, kPrologue, kPair, kGroups, true>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), lay.total);
  launch(kernel, dim3(a.tile_begin[a.num_segments]), dim3(kThreads), lay.total, stream, a);
}

template <class T, bool kPrologue, bool kPair>
void launch_bulk_groups(const GemvArgs& a, int groups, Stream stream) {
  switch (groups) {
    case 1:
      return launch_bulk<T, kPrologue, kPair, 1>(a, stream);
    case 2:
      return launch_bulk<T, kPrologue, kPair, 2>(a, stream);
    case 3:
      return launch_bulk<T, kPrologue, kPair, 3>(a, stream);
    default:
      return launch_bulk<T, kPrologue, kPair, 4>(a, stream);
  }
}

template <class T>
void launch_bulk_dispatch(const GemvArgs& a, bool prologue, bool pair, int groups, Stream stream) {
  if (prologue)
    pair ? launch_bulk_groups<T, true, true>(a, groups, stream)
         : launch_bulk_groups<T, true, false>(a, groups, stream);
  else
    pair ? launch_bulk_groups<T, false, true>(a, groups, stream)
         : launch_bulk_groups<T, false, false>(a, groups, stream);
}

}  // namespace

// 8-row groups a block: as few blocks as cover the SMs once (within the shared-memory budget).
// 0 when the kernel cannot serve `p`, with the reason in *why (when asked): among them a launch
// whose weights do not fit on chip in one pass even at one group a block (lm_head), which
// streams better through the mma.sync gemv.
int bulk_groups(const GemvParams& p, std::string* why) {
  auto refuse = [&](const char* reason) {
    if (why) *why = reason;
    return 0;
  };
  if (p.dtype != DType::BF16 && p.dtype != DType::F16)
    return refuse("it takes bf16 or f16 weights");
  if (p.m < 1 || p.m > kMaxRows) return refuse("it takes 1 to 8 rows of x");
  if (p.has_prologue && p.k > kMaxPrologueK)
    return refuse("its RMSNorm prologue takes k up to 2048");
  if (!device_is_sm90_or_later()) return refuse("it needs sm_90 bulk copies");
  const int sets = p.epilogue == GemvEpilogue::SiluMul ? 2 : 1;
  const int segments = sets == 2 ? 1 : p.num_segments;
  auto blocks_of = [&](int rows) {
    int64_t blocks = 0;
    for (int s = 0; s < segments; ++s) blocks += (p.segments[s].n + rows - 1) / rows;
    return blocks;
  };
  const int64_t sms = device_sm_count();
  int groups =
      static_cast<int>(std::clamp<int64_t>((blocks_of(kGroupRows) + sms - 1) / sms, 1, kMaxGroups));
  auto fits = [&](int gr) {
    return BulkLayout(static_cast<int>(p.m), static_cast<int>(p.k), p.has_prologue, sets, gr)
               .total <= kSmemBudget;
  };
  while (groups > 1 && !fits(groups)) --groups;
  if (!fits(groups) || blocks_of(groups * kGroupRows) > 2 * sms) {
    if (why)
      *why = "the weights do not fit in shared memory across the SMs in one pass (at most " +
             std::to_string(kMaxGroups * kGroupRows) + " rows a block, " +
             std::to_string(kSmemBudget / 1024) + " KB)";
    return 0;
  }
  return groups;
}

void gemv_bulk(const GemvParams& p, int groups, Stream stream) {
  const GemvArgs a = gemv_args(p, groups * kGroupRows);
  const bool prologue = p.has_prologue, pair = p.epilogue == GemvEpilogue::SiluMul;
  if (p.dtype == DType::BF16)
    launch_bulk_dispatch<__nv_bfloat16>(a, prologue, pair, groups, stream);
  else
    launch_bulk_dispatch<__half>(a, prologue, pair, groups, stream);
}

}  // namespace hk::decode::detail
