// flash_attn/launch.h — internal: the per-(dtype, head dim) launchers behind flash.h's dispatch.
//
// Each is explicitly instantiated once in inst/<kernel family>_<dtype>_hd<D>.cu, so the build
// compiles exactly the combinations dispatch can reach (bf16/f16 × 64/128/256 for the mma.sync
// family, bf16/f16 × 64/128 for the Hopper forward and backward) and nothing else; flags such as
// causal, softcap or window are run-time arguments of one kernel, not template parameters.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flash_attn/flash.h"

namespace hk_flash {

void check_cuda(cudaError_t status, const char* what);
int current_device();
int device_sm_count();
int device_capability();
int device_max_smem_per_block();
// HK_FLASH_VERBOSE=1: launchers say on stderr which kernel (and split) they chose.
bool verbose();
// Raises a kernel's dynamic shared-memory limit (and allows non-portable cluster sizes) once per
// device, kernel and request.
void allow_smem(const void* kernel, size_t bytes, bool non_portable_cluster = false);

// How a split-KV decode call (few query rows per kv head) divides its keys: `splits` blocks a
// row tile (0: not the decode form), combined inside a thread-block cluster, or — when the
// caller's workspace holds their partials — by a second kernel, the splits independent blocks,
// in the eight-warp config when `wide` (head dim ≤ 128) and the four-warp one otherwise.
struct DecodeSplit {
  int splits = 0;
  bool through_workspace = false;
  bool wide = false;
};
DecodeSplit decode_split(const Params& p, int sms, bool with_workspace);
// Floats of one block's partial: O [16][D], then the 16 row maxima and the 16 row sums.
constexpr int decode_slot_floats(int head_dim) {
  return 16 * head_dim + 32;
}
// Workspace bytes of `splits` partials per row tile (through_workspace).
size_t decode_partials_bytes(const Params& p, int splits);

template <class T, int D>
void launch_forward_sm80(const Params& p, cudaStream_t stream, DecodeSplit split);
// The backward: prepare (Di, zeroed dq accumulator), one dK/dV kernel, finish (dq). The dq
// accumulator is row-major (the mma.sync kernel's, the atomic dq's), or in the Hopper backward's
// tiled layout (dq_tiled_index), whose passes go a 64-row tile a block (bwd_tiles.cuh) when O, dO
// and dq allow 16- and 8-byte accesses, else a row a warp after a memset.
enum class DqPasses { kRows, kTiledByRows, kTiled };
template <class T, int D>
void launch_backward_prepare(const BackwardParams& p, cudaStream_t stream, float* di,
                             float* dq_accum, DqPasses passes);
template <class T, int D>
void launch_backward_dkdv_sm80(const BackwardParams& p, cudaStream_t stream, const float* di,
                               float* dq_accum);
template <class T, int D>
void launch_backward_finish(const BackwardParams& p, cudaStream_t stream, const float* di,
                            const float* dq_accum, DqPasses passes);
// Bytes of the tiled dq accumulator (batch layouts: every 64-row tile whole).
size_t dq_tiled_bytes(const Params& p);
template <class T, int D>
void launch_append_kv(const AppendParams& p, cudaStream_t stream);

// The Hopper forward's layouts (fwd_sm90.cuh): v1 a producer warpgroup + two consumers (384
// threads), v2 the two consumers alone (256 threads, 255 registers each), v3 v2 with two query
// tiles a block (a heavy and a light m-block; the second's copies overlap the first's GEMMs), v4
// v2 with a block an SM streaming its query tiles (each block one tile of each round of the
// order, snaking; the next tile's Q and K/V copies land under the current tile's GEMMs and stores),
// v5 v4's streaming with v1's producer warpgroup issuing the copies.
enum class Sm90Forward {
  kProducerWarpgroup,
  kTwoWarpgroups,
  kTwoWarpgroupsPaired,
  kStreaming,
  kProducerStreaming
};
// Hopper forward; returns false (launching nothing) when the build has no sm_90a code.
template <class T, int D>
bool launch_forward_sm90(const Params& p, cudaStream_t stream, Sm90Forward layout);
// How the Hopper backward's dq leaves (HK_FLASH_BWD_DQ, api.cu's sm90_backward_dq): by bulk
// reduce-adds into the tiled accumulator, one a warpgroup (tma) or one a warp (warp); from a third
// warpgroup that computes dQ while the two main ones go on (wg, the default: 384 threads, one bulk
// reduce-add a warp); or by atomics into the row-major accumulator (atomic).
enum class Sm90BwdDq { kReduceWarpgroup, kReduceWarp, kDqWarpgroup, kAtomic };
inline bool sm90_backward_dq_tiled(Sm90BwdDq form) {
  return form != Sm90BwdDq::kAtomic;
}
// Hopper backward dK/dV kernel (bwd_sm90.cuh; dq through dq_accum in `form` — tiled forms need the
// accumulator that prepare and finish take as tiled —, none when dq_accum is null: then the
// 256-thread kernel whatever the form); false when the build has no sm_90a code.
template <class T, int D>
bool launch_backward_dkdv_sm90(const BackwardParams& p, cudaStream_t stream, const float* di,
                               float* dq_accum, Sm90BwdDq form);
// Dynamic shared memory the Hopper backward needs at head dim 64 / 128.
size_t backward_sm90_smem(int head_dim);

}  // namespace hk_flash
