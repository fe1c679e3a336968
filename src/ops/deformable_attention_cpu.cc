// CPU multi-scale deformable attention, forward and backward: loops over (b, q, h, l, p), the
// bilinear sample of grid_sample(align_corners=False, padding zeros) and its derivatives, in f32
// (f64 for f64 tensors, the reference dtype of the tests). Simple on purpose (the "eager" one).
#include "hk/deformable_sampling.h"
#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;

struct Dims {
  int64_t b, s, h, d, q, l, p;
};

Dims dims_of(const TensorView& value, const TensorView& loc) {
  return {value.shape[0], value.shape[1], value.shape[2], value.shape[3],
          loc.shape[1],   loc.shape[3],   loc.shape[4]};
}

using deformable::corners;
template <class T>
using Corners = deformable::Corners<T>;

std::vector<int64_t> level_starts(const SpatialShapes& shapes) {
  std::vector<int64_t> start(shapes.size(), 0);
  for (size_t i = 1; i < shapes.size(); ++i)
    start[i] = start[i - 1] + shapes[i - 1].first * shapes[i - 1].second;
  return start;
}

template <class T>
void forward(const TensorView& value, const SpatialShapes& shapes, const TensorView& loc_v,
             const TensorView& weights_v, const TensorView& out_v) {
  const Dims n = dims_of(value, loc_v);
  const std::vector<T> val = load<T>(value), loc = load<T>(loc_v), att = load<T>(weights_v);
  const std::vector<int64_t> start = level_starts(shapes);
  std::vector<T> out(static_cast<size_t>(n.b * n.q * n.h * n.d), T(0));
  for (int64_t b = 0; b < n.b; ++b)
    for (int64_t q = 0; q < n.q; ++q)
      for (int64_t h = 0; h < n.h; ++h) {
        T* o = &out[((b * n.q + q) * n.h + h) * n.d];
        for (int64_t l = 0; l < n.l; ++l)
          for (int64_t p = 0; p < n.p; ++p) {
            const int64_t i = (((b * n.q + q) * n.h + h) * n.l + l) * n.p + p;
            const Corners<T> c =
                corners(loc[2 * i], loc[2 * i + 1], shapes[l].first, shapes[l].second);
            for (int k = 0; k < 4; ++k) {
              if (c.row[k] < 0) continue;
              const T* v = &val[((b * n.s + start[l] + c.row[k]) * n.h + h) * n.d];
              const T wk = att[i] * c.w[k];
              for (int64_t d = 0; d < n.d; ++d) o[d] += wk * v[d];
            }
          }
      }
  store(out_v, out);
}

template <class T>
void backward(const TensorView& dout_v, const TensorView& value, const SpatialShapes& shapes,
              const TensorView& loc_v, const TensorView& weights_v, const TensorView* dvalue_v,
              const TensorView* dloc_v, const TensorView* datt_v) {
  const Dims n = dims_of(value, loc_v);
  const std::vector<T> dout = load<T>(dout_v), val = load<T>(value), loc = load<T>(loc_v),
                       att = load<T>(weights_v);
  const std::vector<int64_t> start = level_starts(shapes);
  std::vector<T> dval(val.size(), T(0)), dloc(loc.size(), T(0)), datt(att.size(), T(0));
  for (int64_t b = 0; b < n.b; ++b)
    for (int64_t q = 0; q < n.q; ++q)
      for (int64_t h = 0; h < n.h; ++h) {
        const T* g = &dout[((b * n.q + q) * n.h + h) * n.d];
        for (int64_t l = 0; l < n.l; ++l)
          for (int64_t p = 0; p < n.p; ++p) {
            const int64_t i = (((b * n.q + q) * n.h + h) * n.l + l) * n.p + p;
            const int64_t height = shapes[l].first, width = shapes[l].second;
            const Corners<T> c = corners(loc[2 * i], loc[2 * i + 1], height, width);
            T sample_dot = 0, gx = 0, gy = 0;  // Σ_d g·sample, Σ_d g·∂sample/∂x, ... ∂y
            for (int k = 0; k < 4; ++k) {
              if (c.row[k] < 0) continue;
              const int64_t base = ((b * n.s + start[l] + c.row[k]) * n.h + h) * n.d;
              T dot = 0;
              for (int64_t d = 0; d < n.d; ++d) {
                dot += g[d] * val[base + d];
                dval[base + d] += att[i] * c.w[k] * g[d];
              }
              sample_dot += c.w[k] * dot;
              gx += c.dwx[k] * dot;
              gy += c.dwy[k] * dot;
            }
            datt[i] = sample_dot;
            // pixel x = loc_x·w − 0.5: d/dloc_x = w (and h for y)
            dloc[2 * i] = att[i] * gx * static_cast<T>(width);
            dloc[2 * i + 1] = att[i] * gy * static_cast<T>(height);
          }
      }
  if (dvalue_v) store(*dvalue_v, dval);
  if (dloc_v) store(*dloc_v, dloc);
  if (datt_v) store(*datt_v, datt);
}

}  // namespace

void ms_deform_attn(const TensorView& value, const SpatialShapes& spatial_shapes,
                    const TensorView& sampling_locations, const TensorView& attention_weights,
                    const TensorView& out, Stream) {
  if (value.dtype == DType::F64)
    forward<double>(value, spatial_shapes, sampling_locations, attention_weights, out);
  else
    forward<float>(value, spatial_shapes, sampling_locations, attention_weights, out);
}

void ms_deform_attn_backward(const TensorView& dout, const TensorView& value,
                             const SpatialShapes& spatial_shapes,
                             const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView* dvalue,
                             const TensorView* dsampling_locations,
                             const TensorView* dattention_weights, Stream) {
  if (value.dtype == DType::F64)
    backward<double>(dout, value, spatial_shapes, sampling_locations, attention_weights, dvalue,
                     dsampling_locations, dattention_weights);
  else
    backward<float>(dout, value, spatial_shapes, sampling_locations, attention_weights, dvalue,
                    dsampling_locations, dattention_weights);
}

}  // namespace hk::ops::cpu
