// cpu/cross_entropy.cc — cross-entropy with ignore_index, label smoothing, z-loss, softcap and
// the three reductions; gradients computed in the forward pass (Liger's design).
//
// Labels outside [0, V) that are not ignore_index give a NaN loss for that row (and zero
// gradients) rather than reading out of bounds: loud, but no crash — the cuda variant does the
// same.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/ce_row.h"
#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {

CeRowResult ce_row(const float* logits, int64_t vocab, int64_t target, const CeRowOptions& o,
                   float* grad, float grad_scale) {
  std::vector<float> z(static_cast<size_t>(vocab));
  float mx = -std::numeric_limits<float>::infinity();
  double sum_z = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    z[j] = o.softcap > 0 ? o.softcap * std::tanh(logits[j] / o.softcap) : logits[j];
    mx = std::fmax(mx, z[j]);
    sum_z += z[j];
  }
  double se = 0;
  for (int64_t j = 0; j < vocab; ++j) se += std::exp(static_cast<double>(z[j]) - mx);
  const float ls = static_cast<float>(std::log(se)), lse = mx + ls;
  const float eps = o.label_smoothing;
  CeRowResult res;
  res.lse = lse;
  res.z_loss = o.z_loss_scale * lse * lse;
  // (m − z_t) + log s rather than lse − z_t: exact for a confident prediction (see the cuda
  // variant).
  res.loss = (1 - eps) * ((mx - z[target]) + ls) +
             eps * ((mx - static_cast<float>(sum_z / vocab)) + ls) + res.z_loss;
  if (grad) {
    const float zfac = 1 + 2 * o.z_loss_scale * lse;
    for (int64_t j = 0; j < vocab; ++j) {
      float g = std::exp((z[j] - mx) - ls) * zfac - eps / static_cast<float>(vocab);
      if (j == target) g -= 1 - eps;
      if (o.softcap > 0) {
        const float t = z[j] / o.softcap;
        g *= 1 - t * t;
      }
      grad[j] = g * grad_scale;
    }
  }
  return res;
}

namespace {
// The divisor of Mean (count of non-ignored rows, or the override); 1 when nothing counts.
float mean_divisor(const void* labels, IndexDt dt, int64_t stride, int64_t n, int64_t ignore,
                   float override_divisor) {
  if (override_divisor > 0) return override_divisor;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += host::load_index(labels, dt, i * stride) != ignore;
  return count > 0 ? static_cast<float>(count) : 1.0f;
}
}  // namespace

void cross_entropy_fwd(const CrossEntropyArgs& a) {
  // lse_in is not needed here: the cpu variant recomputes the row's lse (same value).
  const int64_t n = a.logits.rows, vocab = a.logits.cols;
  const float div =
      a.reduction == Reduction::Mean
          ? mean_divisor(a.labels, a.labels_dt, a.labels_stride, n, a.ignore_index, a.mean_divisor)
          : 1.0f;
  const CeRowOptions o{a.label_smoothing, a.z_loss_scale, a.softcap};
  std::vector<float> row(static_cast<size_t>(vocab));
  double total = 0, total_z = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = host::load_index(a.labels, a.labels_dt, i * a.labels_stride);
    CeRowResult r;
    const bool ignored = t == a.ignore_index, bad = !ignored && (t < 0 || t >= vocab);
    if (ignored || bad) {
      if (bad) r.loss = std::numeric_limits<float>::quiet_NaN();
      if (a.dlogits.data)
        for (int64_t j = 0; j < vocab; ++j) host::put(a.dlogits, i, j, 0.0f);
    } else {
      const float up = a.dloss ? a.dloss[a.reduction == Reduction::None ? i : 0] : 1.0f;
      for (int64_t j = 0; j < vocab; ++j) row[j] = host::at(a.logits, i, j);
      r = ce_row(row.data(), vocab, t, o, a.dlogits.data ? row.data() : nullptr, up / div);
      if (a.dlogits.data)
        for (int64_t j = 0; j < vocab; ++j) host::put(a.dlogits, i, j, row[j]);
    }
    if (a.lse) a.lse[i] = r.lse;
    if (a.reduction == Reduction::None) {
      if (a.loss) a.loss[i] = r.loss;
      if (a.z_loss) a.z_loss[i] = r.z_loss;
    }
    total += r.loss;
    total_z += r.z_loss;
  }
  if (a.reduction != Reduction::None) {
    if (a.loss) a.loss[0] = static_cast<float>(total / div);
    if (a.z_loss) a.z_loss[0] = static_cast<float>(total_z / div);
  }
}

void cross_entropy_scale(const CrossEntropyScale& a) {
  for (int64_t i = 0; i < a.dlogits.rows; ++i) {
    const float s = a.reduction == Reduction::None ? a.dloss[i] : a.dloss[0];
    for (int64_t j = 0; j < a.dlogits.cols; ++j)
      host::put(a.dlogits, i, j, host::at(a.dlogits, i, j) * s);
  }
}

void scale_rows(const Rows& m, const float* factor) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) host::put(m, i, j, host::at(m, i, j) * factor[0]);
}

}  // namespace liger::cpu
