// msda_problem.h — kernels-community/deformable-detr: one call's checked arguments as plain data
// (no SDK types, so the .cu files include only this), and the bilinear corner rule of the
// interface (hk/deformable_sampling.h, shared with hk's built-in) for both variants.
#pragma once

#include <cstdint>

#include "hk/deformable_sampling.h"

#ifdef __CUDACC__
#define MSDA_HD __host__ __device__ __forceinline__
#else
#define MSDA_HD inline
#endif

namespace msda {

constexpr int kMaxLevels = 16;

struct Problem {
  int64_t batch, rows, heads, channels, queries, levels, points;  // B, S, H, D, Q, L, P
  int64_t height[kMaxLevels], width[kMaxLevels], start[kMaxLevels];
  int32_t dtype;  // HK_DTYPE_F32 / _F16 / _BF16, every tensor
  // forward: value, loc, att → out; backward: dout, value, loc, att → dvalue?, dloc?, datt?
  const void* value;
  const void* loc;
  const void* att;
  const void* dout;
  void* out;
  void* dvalue;
  void* dloc;
  void* datt;
  float* accumulator;  // backward, 16-bit dvalue: f32 [B, S, H, D] from the workspace
};

using Corners = hk::deformable::Corners<float>;
MSDA_HD Corners corners(float loc_x, float loc_y, int64_t height, int64_t width) {
  return hk::deformable::corners<float>(loc_x, loc_y, height, width);
}

// cuda variant (msda_cuda.cu): queue the forward / backward on `stream`; cudaError_t, 0 = ok.
int forward_cuda(const Problem& p, void* stream);
int backward_cuda(const Problem& p, void* stream);

}  // namespace msda
