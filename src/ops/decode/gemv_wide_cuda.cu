// Decode GEMV for 17–64 rows of x with 16-bit weights (decode_kernels.h; gemv_cuda.cu routes
// here, the semantics are the narrow kernel's: up to three weights, bias, the RMSNorm prologue,
// the SwiGLU pair).
//
// Why a second kernel: the one-m-tile kernel makes every block of 16 weight rows read all of x
// from L2, 4× the weight bytes at 64 rows, and its registers for 8 n-tiles cap occupancy. Here a
// block of 8 warps covers 64 weight rows (4 m-tiles of mma.sync m16n8k16, W as the 16-row
// operand; with SiluMul 32 gate rows and the same 32 up rows) and stages its slice of x once in
// shared memory, so L2 reads of x fall by the 64 rows a block covers:
//  * each warp owns two m-tiles and every fourth 32-wide k chunk; a lane loads 16 bytes of a W row
//    straight into registers and reads the matching 16 bytes of x from shared memory (the k order
//    inside a chunk permuted identically for both operands, as in gemv_cuda.cu; a 16-byte shared
//    load per lane is the bandwidth of an ldmatrix.x4, and the x rows are padded to 64 bytes mod
//    128 so it is conflict-free);
//  * the weights depend on no kernel: the block prefetches its whole W slice into L2 and loads its
//    first chunks into registers before grid_wait() (PDL); x is copied after it with cp.async,
//    one commit group per 256 columns, so the products start on the first group while the rest
//    arrives. With the prologue the block normalises its slice in shared memory instead (the
//    sum of squares of a row is completed across the cluster through distributed shared memory);
//  * where 64-row tiles alone leave SMs idle (o_proj, down: N = 1024 is 16 tiles) or the x slice
//    would not fit, K is split over a thread-block cluster of 2–16 blocks, each with its own k
//    slice; the f32 partials are added across the block's warps, then across the cluster through
//    distributed shared memory in a fixed order (deterministic; no workspace, no second launch,
//    safe to capture), each block finishing a share of the outputs.
// Not here: f32 weights (gemv_cuda.cu, ≤ 16 rows); x larger than a cluster's shared memory holds
// (refused: gemv_wide_unsupported).
#include <cooperative_groups.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "hk/error.h"
#include "ops/decode/gemv_common.cuh"

namespace hk::decode::detail {
namespace {

namespace sm80 = hk::sdk::cuda::sm80;

constexpr int kThreads = 256;
constexpr int kKWarps = 4;       // warps sharing a block's k chunks (× 2 warps over the m-tiles)
constexpr int kWarpTiles = 2;    // 16-row m-tiles per warp
constexpr int kBlockMTiles = 4;  // m-tiles per block
constexpr int kChunk = 32;       // k elements of one lane load round (4 lanes × 8)
constexpr int kUnroll = 2;       // chunks a warp loads per step
constexpr int kStepK = kKWarps * kUnroll * kChunk;  // 256 k per step = one cp.async group of x
constexpr int kMaxCluster = 16;
constexpr size_t kSsBytes = 64 * sizeof(float);  // the prologue's per-row sums of squares
// Shared memory at or below which two blocks fit an SM (227 KB usable on sm_90).
constexpr size_t kTwoBlocksBytes = 112 * 1024;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp.async.wait_group takes an immediate: waits until at most min(pending, 7) groups are left.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 0:
      sm80::cp_async_wait<0>();
      break;
    case 1:
      sm80::cp_async_wait<1>();
      break;
    case 2:
      sm80::cp_async_wait<2>();
      break;
    case 3:
      sm80::cp_async_wait<3>();
      break;
    case 4:
      sm80::cp_async_wait<4>();
      break;
    case 5:
      sm80::cp_async_wait<5>();
      break;
    case 6:
      sm80::cp_async_wait<6>();
      break;
    default:
      sm80::cp_async_wait<7>();
      break;
  }
}
// A float array of cluster block `rank` (this block's own when the launch has no cluster).
__device__ __forceinline__ float* cluster_peer(float* p, int rank, int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#endif
  return p;
}
__device__ __forceinline__ void cluster_or_block_sync(int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}

// Prefetches rows [row0, row0 + rows) ∩ [0, n) of w, columns [kb, kb + klen), into L2.
template <class T>
__device__ __forceinline__ void prefetch_slice(const T* w, int row0, int rows, int n, int k, int kb,
                                               int klen) {
  rows = min(rows, n - row0);
  const int lines = (klen * int(sizeof(T)) + 127) / 128 + 1;  // + 1: the slice need not be aligned
  for (int i = threadIdx.x; i < rows * lines; i += kThreads) {
    const int row = i / lines, line = i - row * lines;
    const char* begin = reinterpret_cast<const char*>(w + int64_t(row0 + row) * k + kb);
    const char* end = begin + int64_t(klen) * sizeof(T);
    const char* at =
        reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(begin) & ~uintptr_t(127)) +
        int64_t(line) * 128;
    if (at < end) prefetch_l2(at);
  }
}

// x slice = rms_norm(residual + delta) in shared memory (columns [kb, kb + klen) of every row);
// the sums of squares of the cluster's slices are added in rank order.
template <class T>
__device__ void norm_slice(const GemvArgs& a, T* xs, T* dtmp, float* ss_part, int kb, int klen,
                           bool writer) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pieces = klen / 8;
  const T* res = static_cast<const T*>(a.pro.residual);
  const T* del = static_cast<const T*>(a.pro.delta);
  for (int i = tid; i < a.m * pieces; i += kThreads) {
    const int row = i / pieces, col = (i - row * pieces) * 8;
    sm80::cp_async16(smem_u32(xs + row * a.xs_stride + col),
                     res + row * a.pro.residual_stride + kb + col, true);
    if (del)
      sm80::cp_async16(smem_u32(dtmp + row * klen + col), del + row * a.pro.delta_stride + kb + col,
                       true);
  }
  sm80::cp_async_commit();
  sm80::cp_async_wait<0>();
  __syncthreads();
  T* out = writer ? static_cast<T*>(a.pro.residual_out) : nullptr;
  for (int row = warp; row < a.m; row += kThreads / 32) {
    T* xr = xs + row * a.xs_stride;
    float ss = 0.0f;
    for (int col = lane * 8; col < klen; col += 256) {
      uint4 v = *reinterpret_cast<const uint4*>(xr + col);
      if (del) {
        v = add_rounded16<T>(v, *reinterpret_cast<const uint4*>(dtmp + row * klen + col));
        *reinterpret_cast<uint4*>(xr + col) = v;
        if (out) *reinterpret_cast<uint4*>(out + row * a.pro.residual_out_stride + kb + col) = v;
      }
      ss += sum_squares16<T>(v);
    }
    ss = warp_sum(ss);
    if (lane == 0) ss_part[row] = ss;
  }
  cluster_or_block_sync(a.cluster);
  const T* w = static_cast<const T*>(a.pro.norm_weight) + kb;
  for (int row = warp; row < a.m; row += kThreads / 32) {
    float ss = 0.0f;
    for (int q = 0; q < a.cluster; ++q) ss += cluster_peer(ss_part, q, a.cluster)[row];
    const float r = rsqrtf(ss / static_cast<float>(a.k) + a.pro.eps);
    T* xr = xs + row * a.xs_stride;
    for (int col = lane * 8; col < klen; col += 256)
      *reinterpret_cast<uint4*>(xr + col) =
          rms_scale16<T>(*reinterpret_cast<const uint4*>(xr + col), load_ro16(w + col), r);
  }
  __syncthreads();
}

// NT n-tiles of 8 x rows (4: ≤ 32 rows, 8: ≤ 64); kPair: segments 0/1 are gate/up (SwiGLU).
template <class T, int NT, bool kPrologue, bool kPair>
__global__ void __launch_bounds__(kThreads) gemv_wide_kernel(const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kTileRows = kPair ? 32 : 64;  // output rows of a block
  const int cluster = a.cluster;
  const int rank = int(blockIdx.x) % cluster, tile = int(blockIdx.x) / cluster;
  const int s = kPair ? 0 : segment_of(a, tile);
  const int r0 = (tile - a.tile_begin[s]) * kTileRows;
  const int n = a.n[s], k = a.k;
  const int chunks = k / kChunk;
  const int c_lo = int(int64_t(rank) * chunks / cluster);
  const int nchunks = int(int64_t(rank + 1) * chunks / cluster) - c_lo;
  const int kb = c_lo * kChunk, klen = nchunks * kChunk;
  const int steps = (klen + kStepK - 1) / kStepK;  // the same for every warp of the block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kw = warp % kKWarps, mg = warp / kKWarps;
  const int g = lane >> 2, t = lane & 3;

  // The warp's two m-tiles: rows [r0 + 32 mg, + 32) of segment s, or with the pair rows
  // [r0, r0 + 32) of gate (mg 0) or up (mg 1).
  const T* wseg = static_cast<const T*>(a.w[kPair ? mg : s]);
  const int wrow0 = r0 + (kPair ? 0 : mg * 32);
  if constexpr (kPair) {
    prefetch_slice(static_cast<const T*>(a.w[0]), r0, 32, n, k, kb, klen);
    prefetch_slice(static_cast<const T*>(a.w[1]), r0, 32, n, k, kb, klen);
  } else {
    prefetch_slice(wseg, r0, 64, n, k, kb, klen);
  }
  const T* wp[kWarpTiles][2];
  bool wok[kWarpTiles][2];
#pragma unroll
  for (int i = 0; i < kWarpTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wrow0 + i * 16 + h * 8 + g;
      wok[i][h] = row < n;
      wp[i][h] = wseg + int64_t(wok[i][h] ? row : 0) * k + kb + t * 8;
    }
  uint4 A[kUnroll][kWarpTiles][2];
  auto load_weights = [&](int step) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = (step * kUnroll + u) * kKWarps + kw;  // chunk of the slice
      const bool ok = c < nchunks;
#pragma unroll
      for (int i = 0; i < kWarpTiles; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          A[u][i][h] = ok && wok[i][h] ? load_stream16(wp[i][h] + c * kChunk) : zero16();
    }
  };
  load_weights(0);
  grid_wait();
  grid_launch_dependents();

  T* xs = reinterpret_cast<T*>(smem);
  float* area = reinterpret_cast<float*>(smem + a.xs_bytes);  // reduction; prologue: delta
  float* ss_part = reinterpret_cast<float*>(smem + a.xs_bytes + a.area_bytes);
  if constexpr (kPrologue) {
    norm_slice<T>(a, xs, reinterpret_cast<T*>(area), ss_part, kb, klen,
                  a.pro.residual_out && a.pro.delta && tile == 0);
  } else {
    const T* x = static_cast<const T*>(a.x);
    for (int step = 0; step < steps; ++step) {
      for (int i = threadIdx.x; i < a.m * (kStepK / 8); i += kThreads) {
        const int row = i / (kStepK / 8), col = step * kStepK + (i % (kStepK / 8)) * 8;
        if (col < klen)
          sm80::cp_async16(smem_u32(xs + row * a.xs_stride + col), x + row * a.x_stride + kb + col,
                           true);
      }
      sm80::cp_async_commit();
    }
  }

  float acc[kWarpTiles][NT][4];
#pragma unroll
  for (int i = 0; i < kWarpTiles; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][nt][r] = 0.0f;
  // Rows of x past m are never written: they only reach accumulator columns that are not stored.
  const T* xl = xs + g * a.xs_stride + t * 8;
  for (int step = 0; step < steps; ++step) {
    if (step > 0) load_weights(step);
    if constexpr (!kPrologue) {
      cp_async_wait_pending(steps - 1 - step);
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = (step * kUnroll + u) * kKWarps + kw;
      if (c >= nchunks) continue;  // uniform over the warp
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 B = *reinterpret_cast<const uint4*>(xl + nt * 8 * a.xs_stride + c * kChunk);
#pragma unroll
        for (int i = 0; i < kWarpTiles; ++i) {
          mma16816<T>(acc[i][nt], A[u][i][0].x, A[u][i][1].x, A[u][i][0].y, A[u][i][1].y, B.x, B.y);
          mma16816<T>(acc[i][nt], A[u][i][0].z, A[u][i][1].z, A[u][i][0].w, A[u][i][1].w, B.z, B.w);
        }
      }
    }
  }

  // area[kw][m-tile][nt][reg][lane]: the four k warps' partials, added in kw order.
  constexpr int kTileFloats = NT * 4 * 32;
  constexpr int kBlockFloats = kBlockMTiles * kTileFloats;
  constexpr int kOutFloats = kPair ? kBlockFloats / 2 : kBlockFloats;  // pair: the gate half
  constexpr int kUp = kBlockFloats / 2;  // pair: the up partner of a gate element
  __syncthreads();  // every warp is done with x (and the prologue's delta under `area`)
#pragma unroll
  for (int i = 0; i < kWarpTiles; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        area[kw * kBlockFloats + (mg * kWarpTiles + i) * kTileFloats + (nt * 4 + r) * 32 + lane] =
            acc[i][nt][r];
  __syncthreads();
  auto finish = [&](int e, float v, float u) {
    const int l = e & 31, r = (e >> 5) & 3, nt = (e >> 7) % NT, mt = e / kTileFloats;
    const int col = nt * 8 + (l & 3) * 2 + (r & 1);
    const int j = r0 + mt * 16 + (l >> 2) + (r >= 2 ? 8 : 0);
    if (col < a.m && j < n) store_result<T, kPair>(a, s, j, col, v, u);
  };
  for (int e = threadIdx.x; e < kOutFloats; e += kThreads) {
    float v = 0.0f, u = 0.0f;
#pragma unroll
    for (int w = 0; w < kKWarps; ++w) {
      v += area[w * kBlockFloats + e];
      if constexpr (kPair) u += area[w * kBlockFloats + e + kUp];
    }
    if (cluster == 1) {
      finish(e, v, u);
    } else {  // the block's partial, in place of kw 0's (each element read and written here only)
      area[e] = v;
      if constexpr (kPair) area[e + kUp] = u;
    }
  }
  if (cluster == 1) return;
  // Every block finishes a share of the outputs; a thread issues the loads of its element's
  // partials from all blocks before adding them (one round trip), in rank order.
  cluster_or_block_sync(cluster);
  for (int e = rank * kThreads + int(threadIdx.x); e < kOutFloats; e += cluster * kThreads) {
    float pv[kMaxCluster], pu[kMaxCluster];
#pragma unroll
    for (int q = 0; q < kMaxCluster; ++q) {
      if (q < cluster) {
        const float* part = cluster_peer(area, q, cluster);
        pv[q] = part[e];
        if constexpr (kPair) pu[q] = part[e + kUp];
      }
    }
    float v = 0.0f, u = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxCluster; ++q) {
      if (q < cluster) {
        v += pv[q];
        if constexpr (kPair) u += pu[q];
      }
    }
    finish(e, v, u);
  }
  cluster_or_block_sync(cluster);  // no block leaves while another still reads its partials
}

// ---- host ----------------------------------------------------------------------------------

struct WidePlan {
  int nt = 0, cluster = 0, tiles = 0, xs_stride = 0;
  size_t xs_bytes = 0, area_bytes = 0, smem = 0;
};

size_t device_smem_optin() {
  static size_t cached[64] = {};
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= 64) return 227 * 1024;
  if (cached[d] == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, d) != cudaSuccess ||
        v <= 0)
      v = 227 * 1024;
    cached[d] = static_cast<size_t>(v);
  }
  return cached[d];
}

// SMs of the current device (132 when it cannot be asked); asked once, so nothing but cached
// values is read while a graph is being captured.
int sm_count_or_default() {
  static const int sms = [] {
    int d = 0, n = 0;
    if (cudaGetDevice(&d) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || n <= 0)
      return 132;
    return n;
  }();
  return sms;
}

// The smallest cluster (power of two ≤ max_cluster, ≤ the k chunks) whose blocks cover the SMs
// with two blocks' shared memory per SM; failing that the largest that fits at all; cluster 0
// when none does.
WidePlan wide_plan(const GemvParams& p, int max_cluster) {
  WidePlan plan, fallback;
  const bool pair = p.epilogue == GemvEpilogue::SiluMul;
  plan.nt = p.m <= 32 ? 4 : 8;
  const int rows = pair ? 32 : 64;
  for (int s = 0; s < p.num_segments && !(pair && s > 0); ++s)
    plan.tiles += static_cast<int>((p.segments[s].n + rows - 1) / rows);
  const int64_t chunks = p.k / kChunk;
  const size_t optin = device_smem_optin();
  const int sms = sm_count_or_default();
  for (int cluster = 1; cluster <= max_cluster && cluster <= chunks; cluster *= 2) {
    const int64_t slice = (chunks + cluster - 1) / cluster * kChunk;
    plan.cluster = cluster;
    plan.xs_stride = static_cast<int>(slice + (slice % 64 == 0 ? 32 : 0));
    plan.xs_bytes = (size_t(plan.nt) * 8 * plan.xs_stride * 2 + 15) / 16 * 16;
    const size_t reduction = size_t(kKWarps) * kBlockMTiles * plan.nt * 4 * 32 * sizeof(float);
    const size_t delta = p.has_prologue && p.prologue.delta ? size_t(p.m) * slice * 2 : 0;
    plan.area_bytes = (std::max(reduction, delta) + 15) / 16 * 16;
    plan.smem = plan.xs_bytes + plan.area_bytes + kSsBytes;
    if (plan.smem > optin) continue;
    if (plan.smem <= kTwoBlocksBytes && int64_t(plan.tiles) * cluster >= sms) return plan;
    fallback = plan;
  }
  return fallback;
}

// Whether 16-block clusters of `kernel` with `smem` bytes are resident in enough numbers to
// cover the SMs (or the grid) at once; asked once per kernel and size.
bool clusters_of_16_fit(const void* kernel, size_t smem, int grid) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, size_t>, int> resident;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = resident.find({kernel, smem});
  if (it == resident.end()) {
    int n = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
        cudaSuccess) {
      cudaLaunchConfig_t probe = {};
      probe.gridDim = dim3(kMaxCluster);
      probe.blockDim = dim3(kThreads);
      probe.dynamicSmemBytes = smem;
      cudaLaunchAttribute attribute;
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = kMaxCluster;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      probe.attrs = &attribute;
      probe.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &probe) != cudaSuccess) n = 0;
    }
    (void)cudaGetLastError();
    it = resident.emplace(std::make_pair(kernel, smem), n).first;
  }
  return it->second > 0 && it->second * kMaxCluster >= std::min(grid, sm_count_or_default());
}

template <class T, int NT, bool kPrologue, bool kPair>
void launch_wide(const GemvParams& p, Stream stream) {
  auto kernel = gemv_wide_kernel<T, NT, kPrologue, kPair>;
  const void* key = reinterpret_cast<const void*>(kernel);
  allow_dynamic_smem(key, device_smem_optin());
  WidePlan plan = wide_plan(p, kMaxCluster);
  if (plan.cluster == kMaxCluster &&
      !clusters_of_16_fit(key, plan.smem, plan.tiles * kMaxCluster)) {
    const WidePlan eight = wide_plan(p, 8);
    if (eight.cluster > 0) plan = eight;
  }
  if (plan.cluster == 0)
    throw Unsupported("decode gemv: in_features " + std::to_string(p.k) + " at " +
                      std::to_string(p.m) + " rows: no cluster's x slices fit shared memory");
  int tiles = 0;
  GemvArgs a = gemv_args(p, kPair ? 32 : 64, tiles);
  a.cluster = plan.cluster;
  a.xs_stride = plan.xs_stride;
  a.xs_bytes = static_cast<int>(plan.xs_bytes);
  a.area_bytes = static_cast<int>(plan.area_bytes);
  launch_clustered(kernel, dim3(tiles * plan.cluster), dim3(kThreads), plan.smem, stream,
                   plan.cluster, a);
}

template <class T, int NT>
void launch_wide_variant(const GemvParams& p, Stream stream) {
  const bool pair = p.epilogue == GemvEpilogue::SiluMul;
  if (p.has_prologue) {
    if (pair)
      launch_wide<T, NT, true, true>(p, stream);
    else
      launch_wide<T, NT, true, false>(p, stream);
  } else {
    if (pair)
      launch_wide<T, NT, false, true>(p, stream);
    else
      launch_wide<T, NT, false, false>(p, stream);
  }
}

template <class T>
void launch_wide_nt(const GemvParams& p, Stream stream) {
  if (p.m <= 32)
    launch_wide_variant<T, 4>(p, stream);
  else
    launch_wide_variant<T, 8>(p, stream);
}

}  // namespace

std::string gemv_wide_unsupported(const GemvParams& p) {
  if (wide_plan(p, kMaxCluster).cluster == 0)
    return "in_features " + std::to_string(p.k) + " at " + std::to_string(p.m) +
           " rows (the x slices of a 16-block cluster exceed shared memory)";
  return "";
}

void gemv_wide(const GemvParams& p, Stream stream) {
  if (p.dtype == DType::BF16)
    launch_wide_nt<__nv_bfloat16>(p, stream);
  else
    launch_wide_nt<__half>(p, stream);
}

}  // namespace hk::decode::detail
