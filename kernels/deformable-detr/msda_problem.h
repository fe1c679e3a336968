// msda_problem.h — kernels-community/deformable-detr: one call's checked arguments as plain data
// (no SDK types, so the .cu files include only this), and the bilinear corner rule shared by the
// cpu and cuda variants: grid_sample(mode="bilinear", padding_mode="zeros", align_corners=False)
// at pixel x = loc_x·w − 0.5, y = loc_y·h − 0.5, with the weights' derivatives in x and y.
#pragma once

#include <cmath>
#include <cstdint>

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

struct Corners {
  int64_t row[4];  // row of the level's map, -1 when the neighbour is outside it
  float w[4], dwx[4], dwy[4];
};

MSDA_HD Corners corners(float loc_x, float loc_y, int64_t height, int64_t width) {
  const float x = loc_x * static_cast<float>(width) - 0.5f;
  const float y = loc_y * static_cast<float>(height) - 0.5f;
  const float x0f = floorf(x), y0f = floorf(y);
  const int64_t x0 = static_cast<int64_t>(x0f), y0 = static_cast<int64_t>(y0f);
  const float lx = x - x0f, ly = y - y0f, hx = 1.0f - lx, hy = 1.0f - ly;
  Corners c;
  const int64_t xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
  const float ws[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
  const float wx[4] = {-hy, hy, -ly, ly}, wy[4] = {-hx, -lx, hx, lx};
  for (int k = 0; k < 4; ++k) {
    const bool inside = xs[k] >= 0 && xs[k] < width && ys[k] >= 0 && ys[k] < height;
    c.row[k] = inside ? ys[k] * width + xs[k] : -1;
    c.w[k] = ws[k];
    c.dwx[k] = wx[k];
    c.dwy[k] = wy[k];
  }
  return c;
}

// cuda variant (msda_cuda.cu): queue the forward / backward on `stream`; cudaError_t, 0 = ok.
int forward_cuda(const Problem& p, void* stream);
int backward_cuda(const Problem& p, void* stream);

}  // namespace msda
