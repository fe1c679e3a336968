// hk/deformable_sampling.h — the sampling rule of multi_scale_deformable_attention@1
// (hk/layer_interfaces.h), once: the four neighbours of a sampling location in one level's map
// with their bilinear weights and the weights' derivatives, as
// torch.nn.functional.grid_sample(mode="bilinear", padding_mode="zeros", align_corners=False)
// computes them (pixel x = loc_x·w − 0.5, y = loc_y·h − 0.5; a neighbour outside the map reads
// as 0). Header-only and constexpr, so the built-in ops (host, and device code through nvcc's
// --expt-relaxed-constexpr) and kernel repos (which never link libhk) share it. It computes no
// attention itself.
#pragma once

#include <cstdint>

namespace hk::deformable {

template <class T>
struct Corners {
  int64_t row[4];  // row of the level's map (y·w + x), or -1 when the neighbour is outside it
  T w[4];          // bilinear weights
  T dwx[4];        // ∂w/∂x (pixel units)
  T dwy[4];        // ∂w/∂y
};

// floor() for the representable range of sampling positions (constexpr, unlike std::floor).
template <class T>
constexpr int64_t floor_index(T v) {
  const int64_t i = static_cast<int64_t>(v);
  return static_cast<T>(i) > v ? i - 1 : i;
}

template <class T>
constexpr Corners<T> corners(T loc_x, T loc_y, int64_t height, int64_t width) {
  const T x = loc_x * static_cast<T>(width) - T(0.5), y = loc_y * static_cast<T>(height) - T(0.5);
  const int64_t x0 = floor_index(x), y0 = floor_index(y);
  const T lx = x - static_cast<T>(x0), ly = y - static_cast<T>(y0), hx = T(1) - lx, hy = T(1) - ly;
  const int64_t xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
  Corners<T> c{
      {0, 0, 0, 0}, {hy * hx, hy * lx, ly * hx, ly * lx}, {-hy, hy, -ly, ly}, {-hx, -lx, hx, lx}};
  for (int k = 0; k < 4; ++k)
    c.row[k] =
        xs[k] >= 0 && xs[k] < width && ys[k] >= 0 && ys[k] < height ? ys[k] * width + xs[k] : -1;
  return c;
}

}  // namespace hk::deformable
