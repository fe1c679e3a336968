// CPU eager attention with GQA, causal and left-padding (key_start) masks, and its backward.
//
// Attention follows eager Transformers except where hk/ops.h says otherwise: scores q·kᵀ·scale and
// the softmax are computed in f32 (not rounded to the input dtype), the probabilities are rounded
// to q's dtype before P·V, and a fully masked row gives zeros instead of NaN. The backward uses the
// saved unrounded probabilities (dV uses them rounded, as the forward did). Plain loops: this is
// the reference, not a fast path.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"
#include "ops/dispatch.h"
#include "ops/softmax_math.h"

namespace hk::ops::cpu {
namespace {

// Shapes and mask shared by forward and backward.
struct AttentionGeometry {
  int64_t b, s, t, hq, hkv, d, group;
  double scale;
  bool causal;
  std::vector<int64_t> key_start;

  AttentionGeometry(const TensorView& q, const TensorView& k, const AttentionOptions& o)
      : b(q.shape[0]),
        s(q.shape[1]),
        t(k.shape[1]),
        hq(q.shape[2]),
        hkv(k.shape[2]),
        d(q.shape[3]),
        group(hq / hkv),
        scale(o.scale != 0.0f ? o.scale : 1.0 / std::sqrt(static_cast<double>(q.shape[3]))),
        causal(o.causal) {
    if (o.key_start) key_start = load_ints(*o.key_start);
  }
  bool visible(int64_t bi, int64_t i, int64_t j) const {
    if (causal && j > t - s + i) return false;
    if (!key_start.empty() && j < key_start[bi]) return false;
    return true;
  }
  // Offsets into contiguous [B, S, H, D] buffers.
  int64_t qi(int64_t bi, int64_t i, int64_t h) const { return ((bi * s + i) * hq + h) * d; }
  int64_t ki(int64_t bi, int64_t j, int64_t h) const { return ((bi * t + j) * hkv + h) * d; }
  int64_t pi(int64_t bi, int64_t h, int64_t i) const { return ((bi * hq + h) * s + i) * t; }
};

template <class T>
void attention_t(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const AttentionOptions& o, const TensorView* probs) {
  const AttentionGeometry g(q, k, o);
  const std::vector<T> qs = load<T>(q), ks = load<T>(k), vs = load<T>(v);
  std::vector<T> os(qs.size(), T{0});
  std::vector<T> ps(probs ? static_cast<size_t>(g.b * g.hq * g.s * g.t) : 0);
  std::vector<T> row(static_cast<size_t>(g.t));
  const T scale = static_cast<T>(g.scale);
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h) {
      const int64_t kh = h / g.group;
      for (int64_t i = 0; i < g.s; ++i) {
        const T* qr = &qs[g.qi(bi, i, h)];
        for (int64_t j = 0; j < g.t; ++j) {
          if (!g.visible(bi, i, j)) {
            row[j] = -std::numeric_limits<T>::infinity();
            continue;
          }
          const T* kr = &ks[g.ki(bi, j, kh)];
          T dot = 0;
          for (int64_t e = 0; e < g.d; ++e) dot += qr[e] * kr[e];
          row[j] = dot * scale;
        }
        softmax_row(row.data(), g.t);
        if (probs) std::copy(row.begin(), row.end(), ps.begin() + g.pi(bi, h, i));
        T* orow = &os[g.qi(bi, i, h)];
        for (int64_t j = 0; j < g.t; ++j) {
          const T p = round_as(q.dtype, row[j]);
          if (p == T{0}) continue;
          const T* vr = &vs[g.ki(bi, j, kh)];
          for (int64_t e = 0; e < g.d; ++e) orow[e] += p * vr[e];
        }
      }
    }
  store(out, os);
  if (probs) store(*probs, ps);
}

template <class T>
void attention_backward_t(const TensorView& dout, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& probs, const TensorView& dq,
                          const TensorView& dk, const TensorView& dv, const AttentionOptions& o) {
  const AttentionGeometry g(q, k, o);
  const std::vector<T> qs = load<T>(q), ks = load<T>(k), vs = load<T>(v), dos = load<T>(dout);
  const std::vector<T> ps = load<T>(probs);
  std::vector<T> dqs(qs.size(), T{0}), dks(ks.size(), T{0}), dvs(vs.size(), T{0});
  std::vector<T> ds(static_cast<size_t>(g.t));
  const T scale = static_cast<T>(g.scale);
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h) {
      const int64_t kh = h / g.group;
      for (int64_t i = 0; i < g.s; ++i) {
        const T* p = &ps[g.pi(bi, h, i)];
        const T* dor = &dos[g.qi(bi, i, h)];
        T sum = 0;
        for (int64_t j = 0; j < g.t; ++j) {
          ds[j] = 0;
          if (p[j] == T{0}) continue;
          const T* vr = &vs[g.ki(bi, j, kh)];
          T* dvr = &dvs[g.ki(bi, j, kh)];
          const T pr = round_as(q.dtype, p[j]);
          T dp = 0;
          for (int64_t e = 0; e < g.d; ++e) {
            dp += dor[e] * vr[e];
            dvr[e] += pr * dor[e];
          }
          ds[j] = dp;
          sum += p[j] * dp;
        }
        const T* qr = &qs[g.qi(bi, i, h)];
        T* dqr = &dqs[g.qi(bi, i, h)];
        for (int64_t j = 0; j < g.t; ++j) {
          if (p[j] == T{0}) continue;
          const T dsc = p[j] * (ds[j] - sum) * scale;
          const T* kr = &ks[g.ki(bi, j, kh)];
          T* dkr = &dks[g.ki(bi, j, kh)];
          for (int64_t e = 0; e < g.d; ++e) {
            dqr[e] += dsc * kr[e];
            dkr[e] += dsc * qr[e];
          }
        }
      }
    }
  store(dq, dqs);
  store(dk, dks);
  store(dv, dvs);
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, const TensorView* probs, Stream) {
  if (q.dtype == DType::F64)
    attention_t<double>(q, k, v, out, options, probs);
  else
    attention_t<float>(q, k, v, out, options, probs);
}

void attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& probs, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        Stream) {
  if (q.dtype == DType::F64)
    attention_backward_t<double>(dout, q, k, v, probs, dq, dk, dv, options);
  else
    attention_backward_t<float>(dout, q, k, v, probs, dq, dk, dv, options);
}

}  // namespace hk::ops::cpu
