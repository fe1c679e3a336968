// cpu/fused_linear_cross_entropy.cc — hidden·weightᵀ then cross-entropy, one token row at a time,
// so only one row of logits ever exists; d(hidden) and d(weight) come out of the same pass.
//
// Rounding points follow the cuda variant: a row of logits is rounded to hidden's dtype (the GEMM
// writes it in that dtype), and so is its gradient before the two backward products; d(weight) is
// accumulated in double here (f32 on the device) and rounded once at the end.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/ce_row.h"
#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {

void fused_linear_cross_entropy_fwd(const FusedLinearCrossEntropyArgs& a) {
  const int64_t n = a.hidden.rows, h = a.hidden.cols, vocab = a.weight.rows;
  const Dt dt = a.hidden.dt;
  float div = 1.0f;
  if (a.reduction == Reduction::Mean) {
    if (a.mean_divisor > 0) {
      div = a.mean_divisor;
    } else {
      int64_t count = 0;
      for (int64_t i = 0; i < n; ++i)
        count += host::load_index(a.labels, a.labels_dt, i * a.labels_stride) != a.ignore_index;
      div = count > 0 ? static_cast<float>(count) : 1.0f;
    }
  }
  const bool want_grad = a.dhidden.data || a.dweight.data;
  const CeRowOptions o{a.label_smoothing, a.z_loss_scale, a.softcap};
  std::vector<float> logits(static_cast<size_t>(vocab)), x(static_cast<size_t>(h));
  std::vector<double> dw(a.dweight.data ? static_cast<size_t>(vocab * h) : 0, 0.0);
  double total = 0, total_z = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = host::load_index(a.labels, a.labels_dt, i * a.labels_stride);
    const bool ignored = t == a.ignore_index, bad = !ignored && (t < 0 || t >= vocab);
    CeRowResult r;
    if (bad) r.loss = std::numeric_limits<float>::quiet_NaN();
    if (!ignored && !bad) {
      for (int64_t k = 0; k < h; ++k) x[k] = host::at(a.hidden, i, k);
      for (int64_t j = 0; j < vocab; ++j) {
        float acc = 0;
        for (int64_t k = 0; k < h; ++k) acc += x[k] * host::at(a.weight, j, k);
        logits[j] = host::round_to(dt, acc);
      }
      const float up = a.dloss ? a.dloss[a.reduction == Reduction::None ? i : 0] : 1.0f;
      r = ce_row(logits.data(), vocab, t, o, want_grad ? logits.data() : nullptr, up / div);
    }
    if (a.dhidden.data) {
      for (int64_t k = 0; k < h; ++k) {
        float acc = 0;
        if (!ignored && !bad)
          for (int64_t j = 0; j < vocab; ++j)
            acc += host::round_to(dt, logits[j]) * host::at(a.weight, j, k);
        host::put(a.dhidden, i, k, acc);
      }
    }
    if (a.dweight.data && !ignored && !bad) {
      for (int64_t j = 0; j < vocab; ++j) {
        const double g = host::round_to(dt, logits[j]);
        for (int64_t k = 0; k < h; ++k) dw[j * h + k] += g * x[k];
      }
    }
    if (a.reduction == Reduction::None) {
      if (a.loss) a.loss[i] = r.loss;
      if (a.z_loss) a.z_loss[i] = r.z_loss;
    }
    total += r.loss;
    total_z += r.z_loss;
  }
  if (a.dweight.data) {
    for (int64_t j = 0; j < vocab; ++j)
      for (int64_t k = 0; k < h; ++k) {
        const float prev = a.accumulate_dweight ? host::at(a.dweight, j, k) : 0.0f;
        host::put(a.dweight, j, k, prev + static_cast<float>(dw[j * h + k]));
      }
  }
  if (a.reduction != Reduction::None) {
    if (a.loss) a.loss[0] = static_cast<float>(total / div);
    if (a.z_loss) a.z_loss[0] = static_cast<float>(total_z / div);
  }
}

}  // namespace liger::cpu
