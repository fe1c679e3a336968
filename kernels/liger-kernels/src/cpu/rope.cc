// cpu/rope.cc — half-rotation rotary embedding on q and k, forward and its transpose.
#include <vector>

#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {
namespace {
void rotate(const RopeArgs& a, const RopeTensor& t, int64_t b, int64_t s, const float* cs,
            const float* sn) {
  const int64_t half = a.head_dim / 2;
  std::vector<float> x(static_cast<size_t>(a.head_dim));
  for (int64_t h = 0; h < t.heads; ++h) {
    const int64_t xo = b * t.x_strides[0] + s * t.x_strides[1] + h * t.x_strides[2];
    const int64_t yo = b * t.y_strides[0] + s * t.y_strides[1] + h * t.y_strides[2];
    for (int64_t d = 0; d < a.head_dim; ++d) x[d] = host::load(t.x, a.dt, xo + d);
    for (int64_t d = 0; d < half; ++d) {
      const float x1 = x[d], x2 = x[d + half];
      float y1, y2;
      if (!a.backward) {
        y1 = x1 * cs[d] - x2 * sn[d];
        y2 = x2 * cs[d + half] + x1 * sn[d + half];
      } else {
        y1 = x1 * cs[d] + x2 * sn[d + half];
        y2 = x2 * cs[d + half] - x1 * sn[d];
      }
      host::store(t.y, a.dt, yo + d, y1);
      host::store(t.y, a.dt, yo + d + half, y2);
    }
  }
}
}  // namespace

void rope(const RopeArgs& a) {
  std::vector<float> cs(static_cast<size_t>(a.head_dim)), sn(cs.size());
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t s = 0; s < a.seq; ++s) {
      const int64_t row = a.positions ? host::load_index(a.positions, a.positions_dt,
                                                         b * a.positions_batch_stride + s)
                                      : b * a.cos_batch_stride + s;
      for (int64_t d = 0; d < a.head_dim; ++d) {
        cs[d] = host::load(a.cos, a.cos_dt, row * a.head_dim + d);
        sn[d] = host::load(a.sin, a.cos_dt, row * a.head_dim + d);
      }
      rotate(a, a.q, b, s, cs.data(), sn.data());
      if (a.k.heads > 0) rotate(a, a.k, b, s, cs.data(), sn.data());
    }
  }
}

}  // namespace liger::cpu
