// Decode products for 17–64 rows of x on Hopper: y[m, n] = x[m, :]·W[n, :] (+ b[n]) with wgmma
// (decode_kernels.h wide_gemv). At these batches cuBLASLt is latency-bound (~6–9 µs for products
// that stream in 2–3 µs) and the mma.sync gemv re-reads x from L2 for every 16 weight rows; here
// a block owns 64 weight rows, so x is read once per 64 rows, and the products run on the
// tensor cores' asynchronous path while the next tiles stream in.
//
// Block: one warpgroup (128 threads). Tile: 64 weight rows (wgmma M) × 64 x rows (wgmma N; rows of
// x past m are TMA's zero fill) × 64-wide k steps, four stages deep. Both operands are K-major
// 128-byte-swizzled boxes written by TMA (thread 0 issues them). The weights depend on no kernel,
// so the first stages' weight boxes are in flight before the PDL wait; the x boxes follow it.
// When the weight tiles are fewer than the SMs, K is split over a cluster of up to 8 blocks (one
// wave of blocks); each block leaves its f32 partial tile in shared memory and reduces a slice of
// the tile's weight rows by reading every block's partial over distributed shared memory in rank
// order — a fixed order, so results repeat bit for bit. Epilogues as gemv's (gemv_cuda.cu): bias,
// or the SwiGLU pair (gate and up tiles of the same rows in one block, out = round(silu(gate))·up).
// Not here: the RMSNorm prologue (rows of x come from TMA untouched), f32, more than 64 rows.
#include <cooperative_groups.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/kernel_sdk_sm90.cuh"
#include "ops/decode/decode_common.cuh"

namespace hk::decode {
namespace {
using namespace detail;
namespace wg = hk::sdk::cuda::sm90;
namespace cg = cooperative_groups;

constexpr int kRows = 64;    // weight rows per tile (wgmma M)
constexpr int kCols = 64;    // x rows per tile (wgmma N): the most m this path takes
constexpr int kBK = 64;      // k per stage: one 128-byte swizzle row of 16-bit values
constexpr int kMaxStages = 8;  // up to 128–192 KB in flight per block (one block an SM)
constexpr int kMaxSplits = 8;  // portable cluster size; splits are 1, 2, 4 or 8 (divide 64 rows)
constexpr int kThreads = 128;
constexpr uint32_t kBoxBytes = kRows * kBK * 2;  // one 64 × 64 16-bit box (weights or x)
constexpr int kPartLd = kRows + 4;               // partial rows: [x row][weight row], padded
static_assert(kCols == kRows, "the x box and the weight box share the 64 × 64 shape");

struct WideArgs {
  CUtensorMap x_map;     // [m, k] (innermost first: k, m), 64 × 64 boxes
  CUtensorMap w_map[3];  // [n_s, k]
  const void* w[3] = {};  // for the L2 prefetch of the k-tiles past the first stages
  const void* bias[3] = {};
  void* out[3] = {};
  int64_t out_stride[3] = {};
  int n[3] = {};
  int tile_begin[4] = {};
  int num_segments = 0;
  int m = 0, k = 0, k_tiles = 0;
  int stages = 1;  // shared-memory stages: min(k-tiles of a split, kMaxStages)
};

__device__ __forceinline__ int wide_segment_of(const WideArgs& a, int tile) {
  int s = 0;
  while (s + 1 < a.num_segments && tile >= a.tile_begin[s + 1]) ++s;
  return s;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// grid (kSplits, tiles), cluster (kSplits, 1, 1): blockIdx.x is the block's rank in its cluster.
template <class T, bool kPair, int kSplits>
__global__ void __launch_bounds__(kThreads) wide_gemv_kernel(const __grid_constant__ WideArgs a) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kSets = kPair ? 2 : 1;  // weight boxes per stage (gate and up)
  constexpr uint32_t kStageBytes = (kSets + 1) * kBoxBytes;
  static_assert(kSets * kCols * kPartLd * 4 <= 2 * kStageBytes, "partials fit two stages");
  static_assert(kRows % (4 * kSplits) == 0, "a split's slice is whole float4 columns");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzle atoms: 1024 bytes
  float* part = reinterpret_cast<float*>(smem_raw + (base - raw));
  const int stages = a.stages;
  const uint32_t bars = base + max(stages, 2) * kStageBytes;

  const int tid = threadIdx.x;
  const int split = blockIdx.x, tile = blockIdx.y;
  const int s = kPair ? 0 : wide_segment_of(a, tile);
  const int r0 = (tile - a.tile_begin[s]) * kRows;
  const int kt0 = split * a.k_tiles / kSplits, kt1 = (split + 1) * a.k_tiles / kSplits;
  const int nk = kt1 - kt0, first = min(nk, stages);

  auto stage_of = [&](int i) { return base + (i % stages) * kStageBytes; };
  auto bar_of = [&](int i) { return bars + 8u * (i % stages); };
  auto issue_weights = [&](int i) {
    wg::mbar_expect_tx(bar_of(i), kStageBytes);  // the x box of the stage included
    wg::tma_load_4d(stage_of(i), &a.w_map[s], bar_of(i), (kt0 + i) * kBK, r0, 0, 0);
    if constexpr (kPair)
      wg::tma_load_4d(stage_of(i) + kBoxBytes, &a.w_map[1], bar_of(i), (kt0 + i) * kBK, r0, 0, 0);
  };
  auto issue_x = [&](int i) {
    wg::tma_load_4d(stage_of(i) + kSets * kBoxBytes, &a.x_map, bar_of(i), (kt0 + i) * kBK, 0, 0,
                    0);
  };
  if (tid == 0) {
    wg::prefetch_tma(&a.w_map[s]);
    if constexpr (kPair) wg::prefetch_tma(&a.w_map[1]);
    wg::prefetch_tma(&a.x_map);
    for (int i = 0; i < stages; ++i) wg::mbar_init(bar_of(i), 1);
    wg::fence_barrier_init();
    for (int i = 0; i < first; ++i) issue_weights(i);
  }
  // The weight k-tiles past the first stages into L2 meanwhile (two threads a row and set).
  if (nk > first) {
    const int row = tid / 2, set = kSets == 2 ? tid % 2 : 0;
    if ((kSets == 2 || tid % 2 == 0) && r0 + row < a.n[kPair ? set : s]) {
      const char* w = static_cast<const char*>(a.w[kPair ? set : s]) +
                      (int64_t(r0 + row) * a.k + int64_t(kt0 + first) * kBK) * sizeof(T);
      const int64_t bytes = int64_t(min(kt1 * kBK, a.k) - (kt0 + first) * kBK) * sizeof(T);
      for (int64_t off = 0; off < bytes; off += 128) prefetch_l2(w + off);
    }
  }
  __syncthreads();  // barriers initialised before anyone waits on them
  grid_wait();      // x (and the outputs' old readers) belong to the previous kernel
  if (tid == 0)
    for (int i = 0; i < first; ++i) issue_x(i);
  grid_launch_dependents();

  float acc[kSets][kCols / 2];
#pragma unroll
  for (int q = 0; q < kSets; ++q)
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) acc[q][e] = 0.0f;
  for (int i = 0; i < nk; ++i) {
    wg::mbar_wait(bar_of(i), (i / stages) & 1);
    const uint32_t w_box = stage_of(i), x_box = w_box + kSets * kBoxBytes;
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t dx = wg::make_desc(x_box + kk * 32, 16, 1024);
#pragma unroll
      for (int q = 0; q < kSets; ++q)
        wg::wgmma_ss<kCols, T, 0, 0>(acc[q], wg::make_desc(w_box + q * kBoxBytes + kk * 32, 16, 1024),
                                     dx, 1);
    }
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
#pragma unroll
    for (int q = 0; q < kSets; ++q) wg::fence_regs(acc[q]);
    if (i + stages < nk) {
      __syncthreads();  // every warp's products of this stage are done: refill it
      if (tid == 0) {
        issue_weights(i + stages);
        issue_x(i + stages);
      }
    }
  }
  __syncthreads();  // all products done before the partials overwrite the stages

  // acc[q][4c + 2r + e]: weight row 16·warp + lane/4 + 8r, x row 8c + 2·(lane % 4) + e.
  {
    const int warp = tid / 32, lane = tid % 32;
#pragma unroll
    for (int q = 0; q < kSets; ++q)
#pragma unroll
      for (int c = 0; c < kCols / 8; ++c)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = 16 * warp + lane / 4 + 8 * r, x = 8 * c + 2 * (lane % 4) + e;
            part[(q * kCols + x) * kPartLd + j] = acc[q][4 * c + 2 * r + e];
          }
  }
  cg::cluster_group cluster = cg::this_cluster();
  if constexpr (kSplits > 1)
    cluster.sync();  // every block's partials written
  else
    __syncthreads();

  // This block's slice of the tile's weight rows (kRows / kSplits of them, as float4 columns),
  // summed over the cluster in rank order. Every load of a thread is issued before its first
  // store (the stores could alias the loads for all the compiler knows, so a loop that mixed
  // them would pay one distributed-shared-memory round trip per element).
  constexpr int kSliceRows = kRows / kSplits, kQuads = kSliceRows / 4;
  constexpr int kPerThread = kQuads * kCols / kThreads;  // 8 / kSplits float4 columns
  static_assert(kPerThread >= 1 && kQuads * kCols % kThreads == 0, "whole float4 columns");
  const int j0 = split * kSliceRows;
  const int n = a.n[s];
  float4 got[kPerThread][kSets][kSplits];
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const int c = tid + u * kThreads, x = c / kQuads, j = j0 + 4 * (c % kQuads);
#pragma unroll
    for (int q = 0; q < kSets; ++q) {
      float4* mine = reinterpret_cast<float4*>(part + (q * kCols + x) * kPartLd + j);
#pragma unroll
      for (int rank = 0; rank < kSplits; ++rank)
        got[u][q][rank] = x < a.m ? (kSplits > 1 ? *cluster.map_shared_rank(mine, rank) : *mine)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const int c = tid + u * kThreads, x = c / kQuads, j = j0 + 4 * (c % kQuads);
    if (x >= a.m) continue;
    float v[kSets][4];
#pragma unroll
    for (int q = 0; q < kSets; ++q) {
      float4 t = got[u][q][0];
#pragma unroll
      for (int rank = 1; rank < kSplits; ++rank) {
        t.x += got[u][q][rank].x;
        t.y += got[u][q][rank].y;
        t.z += got[u][q][rank].z;
        t.w += got[u][q][rank].w;
      }
      v[q][0] = t.x;
      v[q][1] = t.y;
      v[q][2] = t.z;
      v[q][3] = t.w;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int gj = r0 + j + e;
      if (gj >= n) break;
      if constexpr (!kPair) {
        float y = v[0][e];
        if (a.bias[s]) y += to_f32(static_cast<const T*>(a.bias[s])[gj]);
        static_cast<T*>(a.out[s])[x * a.out_stride[s] + gj] = from_f32<T>(y);
      } else {
        float g = v[0][e], up = v[1][e];
        if (a.bias[0]) g += to_f32(static_cast<const T*>(a.bias[0])[gj]);
        if (a.bias[1]) up += to_f32(static_cast<const T*>(a.bias[1])[gj]);
        g = round_as<T>(g);
        up = round_as<T>(up);
        static_cast<T*>(a.out[0])[x * a.out_stride[0] + gj] =
            from_f32<T>(round_as<T>(silu(g)) * up);
      }
    }
  }
  if constexpr (kSplits > 1) cluster.sync();  // no block leaves while another reads its partials
#else
  __trap();  // built without sm_90a device code: wide_gemv_unsupported should have refused
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status{};
    HK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                   cudaEnableDefault, &status));
    if (f == nullptr || status != cudaDriverEntryPointSuccess)
      throw Unsupported("decode wide gemv: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// [rows, k] 16-bit rows `stride` elements apart, boxes of 64 k × 64 rows, 128-byte swizzle.
CUtensorMap rows_map(DType dt, const void* data, int64_t rows, int64_t k, int64_t stride) {
  CUtensorMap map;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(stride) * 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows), 1, 1};
  const cuuint64_t strides[3] = {row_bytes, row_bytes * static_cast<cuuint64_t>(rows),
                                 row_bytes * static_cast<cuuint64_t>(rows)};
  const cuuint32_t box[4] = {kBK, kRows, 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, dt == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(data), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Unsupported("decode wide gemv: cuTensorMapEncodeTiled failed with CUresult " +
                      std::to_string(static_cast<int>(r)) + " for a [" + std::to_string(rows) +
                      ", " + std::to_string(k) + "] operand");
  return map;
}

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v && (std::string(v) == "0" || std::string(v) == "off");
}

size_t wide_smem_bytes(bool pair, int stages) {
  return size_t(std::max(stages, 2)) * (pair ? 3 : 2) * kBoxBytes + 8 * kMaxStages + 1024;
}

// sm_90a device code of the kernel is in this build (the kernel body exists only there).
bool built_for_hopper() {
  static const bool yes = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, wide_gemv_kernel<__nv_bfloat16, false, 1>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    int d = 0, major = 0;
    if (cudaGetDevice(&d) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess)
      return false;
    return major == 9 && attr.binaryVersion == 90;
  }();
  return yes;
}

template <class T, bool kPair, int kSplits>
void launch_wide(const WideArgs& a, int tiles, Stream stream) {
  auto kernel = wide_gemv_kernel<T, kPair, kSplits>;
  const size_t smem = wide_smem_bytes(kPair, a.stages);
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), wide_smem_bytes(kPair, kMaxStages));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kSplits, tiles);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = native(stream);
  cudaLaunchAttribute attribute[2];
  int count = 0;
  attribute[count].id = cudaLaunchAttributeClusterDimension;
  attribute[count].val.clusterDim.x = kSplits;
  attribute[count].val.clusterDim.y = 1;
  attribute[count].val.clusterDim.z = 1;
  ++count;
  if (pdl_enabled()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attribute;
  config.numAttrs = count;
  HK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a));
}

template <class T, bool kPair>
void launch_wide_splits(const WideArgs& a, int tiles, int splits, Stream stream) {
  switch (splits) {
    case 1:
      return launch_wide<T, kPair, 1>(a, tiles, stream);
    case 2:
      return launch_wide<T, kPair, 2>(a, tiles, stream);
    case 4:
      return launch_wide<T, kPair, 4>(a, tiles, stream);
    default:
      return launch_wide<T, kPair, 8>(a, tiles, stream);
  }
}

// The fewest splits (1, 2, 4, 8; at most the k-tiles) that give about one block an SM.
int splits_for(int tiles, int k_tiles) {
  static const int fixed = [] {
    const char* v = std::getenv("HK_DECODE_WIDE_SPLITS");
    return v ? std::clamp(std::atoi(v), 1, kMaxSplits) : 0;
  }();
  const int sms = device_sm_count();
  int splits = 1;
  while (splits < kMaxSplits && (fixed ? splits * 2 <= fixed : tiles * splits < sms * 7 / 8) &&
         splits * 2 <= k_tiles)
    splits *= 2;
  return splits;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

std::string wide_gemv_unsupported(const GemvParams& p) {
  if (env_off("HK_DECODE_WIDE_GEMV")) return "turned off (HK_DECODE_WIDE_GEMV=0)";
  if (p.dtype != DType::BF16 && p.dtype != DType::F16)
    return std::string("dtype ") + dtype_name(p.dtype) + " (the wide gemv takes bf16 or f16)";
  if (p.m < 1 || p.m > kCols)
    return "batch of " + std::to_string(p.m) + " rows (the wide gemv takes 1 to " +
           std::to_string(kCols) + ")";
  if (p.has_prologue) return "the wide gemv has no RMSNorm prologue";
  if (p.k <= 0 || p.k % 8 != 0 || p.k > (int64_t(1) << 30))
    return "in_features " + std::to_string(p.k) + " is not a positive multiple of 8";
  if (p.num_segments < 1 || p.num_segments > 3) return "1 to 3 weights per launch";
  if (p.epilogue == GemvEpilogue::SiluMul &&
      (p.num_segments != 2 || p.segments[0].n != p.segments[1].n))
    return "the SwiGLU epilogue needs gate and up of one size";
  for (int s = 0; s < p.num_segments; ++s) {
    const GemvSegment& g = p.segments[s];
    if (g.n <= 0 || g.n > (int64_t(1) << 30) || !g.weight || !g.out) return "empty weight";
    if (!aligned16(g.weight)) return "weight not 16-byte aligned";
  }
  int64_t tiles = 0;
  for (int s = 0; s < p.num_segments; ++s)
    if (p.epilogue != GemvEpilogue::SiluMul || s == 0) tiles += (p.segments[s].n + kRows - 1) / kRows;
  if (tiles > 65535) return "more than 65535 tiles of 64 weight rows";
  if (!p.x || !aligned16(p.x) || p.x_stride % 8 != 0 || p.x_stride < p.k)
    return "x rows not 16-byte aligned";
  if (!built_for_hopper()) return "needs an sm_90 device and a build with sm_90a device code";
  return "";
}

void wide_gemv(const GemvParams& p, Stream stream) {
  const std::string why = wide_gemv_unsupported(p);
  if (!why.empty()) throw Unsupported("decode wide gemv: " + why);
  const bool pair = p.epilogue == GemvEpilogue::SiluMul;
  WideArgs a;
  a.m = static_cast<int>(p.m);
  a.k = static_cast<int>(p.k);
  a.k_tiles = static_cast<int>((p.k + kBK - 1) / kBK);
  a.x_map = rows_map(p.dtype, p.x, p.m, p.k, p.x_stride);
  a.num_segments = p.num_segments;
  int tiles = 0;
  for (int s = 0; s < p.num_segments; ++s) {
    const GemvSegment& g = p.segments[s];
    a.w_map[s] = rows_map(p.dtype, g.weight, g.n, p.k, p.k);
    a.w[s] = g.weight;
    a.bias[s] = g.bias;
    a.out[s] = g.out;
    a.out_stride[s] = g.out_stride;
    a.n[s] = static_cast<int>(g.n);
    a.tile_begin[s] = tiles;
    if (!pair || s == 0) tiles += static_cast<int>((g.n + kRows - 1) / kRows);
  }
  a.tile_begin[p.num_segments] = tiles;
  const int splits = splits_for(tiles, a.k_tiles);
  a.stages = std::min((a.k_tiles + splits - 1) / splits, kMaxStages);
  if (p.dtype == DType::BF16) {
    if (pair)
      launch_wide_splits<__nv_bfloat16, true>(a, tiles, splits, stream);
    else
      launch_wide_splits<__nv_bfloat16, false>(a, tiles, splits, stream);
  } else {
    if (pair)
      launch_wide_splits<__half, true>(a, tiles, splits, stream);
    else
      launch_wide_splits<__half, false>(a, tiles, splits, stream);
  }
}

}  // namespace hk::decode
