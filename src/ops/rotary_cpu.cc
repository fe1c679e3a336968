// CPU rotary position embedding: the cos/sin tables and rotating q/k ("rotate_half" layout).
//
// Tables are computed exactly as Transformers' default rope does, in f32: inv_freq = 1 /
// theta^(2i/d), freqs = position·inv_freq duplicated over both halves, then cos/sin times
// attention_scaling. The rotation is done in f32 (f64 for f64 x) with one rounding of the output.
#include <cmath>

#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

// y = x·cos + rotate_half(x)·sin (sign = +1) or its transpose dy·cos + rotate_half^T(dy)·sin
// (sign = -1): rotate_half(x) = [-x2, x1], whose transpose is [x2, -x1].
template <class T>
void rotate(const TensorView& x, const TensorView& cos, const TensorView& sin, const TensorView& y,
            T sign) {
  const int64_t b = x.shape[0], s = x.shape[1], nh = x.shape[2], d = x.shape[3], half = d / 2;
  const std::vector<T> xs = load<T>(x), c = load<T>(cos), sn = load<T>(sin);
  std::vector<T> out(xs.size());
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t tb = cos.shape[0] == 1 ? 0 : bi;
    for (int64_t si = 0; si < s; ++si) {
      const T* cr = &c[(tb * s + si) * d];
      const T* sr = &sn[(tb * s + si) * d];
      for (int64_t hi = 0; hi < nh; ++hi) {
        const int64_t base = ((bi * s + si) * nh + hi) * d;
        const T* xr = &xs[base];
        T* yr = &out[base];
        for (int64_t j = 0; j < half; ++j) {
          if (sign > 0) {
            yr[j] = xr[j] * cr[j] - xr[j + half] * sr[j];
            yr[j + half] = xr[j + half] * cr[j + half] + xr[j] * sr[j + half];
          } else {
            yr[j] = xr[j] * cr[j] + xr[j + half] * sr[j + half];
            yr[j + half] = xr[j + half] * cr[j + half] - xr[j] * sr[j];
          }
        }
      }
    }
  }
  store(y, out);
}

}  // namespace

void rotary_tables(const TensorView& positions, int64_t head_dim, double theta,
                   float attention_scaling, const TensorView& cos, const TensorView& sin, Stream) {
  const std::vector<int64_t> pos = load_ints(positions);
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                  static_cast<float>(2 * i) / static_cast<float>(head_dim));
  std::vector<float> c(pos.size() * head_dim), s(pos.size() * head_dim);
  for (size_t p = 0; p < pos.size(); ++p) {
    for (int64_t i = 0; i < head_dim; ++i) {
      const float angle = static_cast<float>(pos[p]) * inv_freq[i % half];
      c[p * head_dim + i] = std::cos(angle) * attention_scaling;
      s[p * head_dim + i] = std::sin(angle) * attention_scaling;
    }
  }
  store(cos, c);
  store(sin, s);
}

void rotary_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                      const TensorView& y, Stream) {
  if (x.dtype == DType::F64)
    rotate<double>(x, cos, sin, y, 1.0);
  else
    rotate<float>(x, cos, sin, y, 1.0f);
}

void rotary_embedding_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin,
                               const TensorView& dx, Stream) {
  if (dy.dtype == DType::F64)
    rotate<double>(dy, cos, sin, dx, -1.0);
  else
    rotate<float>(dy, cos, sin, dx, -1.0f);
}

}  // namespace hk::ops::cpu
