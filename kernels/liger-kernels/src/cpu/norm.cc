// cpu/norm.cc — RMSNorm and LayerNorm, forward and backward, as plain row loops.
//
// Sums of squares and reductions over rows run in double so this variant can serve as a
// second reference; rounding points (llama mode's x·r rounded to x's dtype) match the cuda
// variant exactly.
#include <cmath>
#include <vector>

#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {
using host::at;
using host::load;
using host::put;

namespace {
float rms_rstd(const Rows& x, int64_t r, float eps) {
  double ss = 0;
  for (int64_t c = 0; c < x.cols; ++c) {
    const double v = at(x, r, c);
    ss += v * v;
  }
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(x.cols) + eps));
}

// The normalised value x·r as the forward used it (rounded to x's dtype in llama mode).
float rms_hat(const Rows& x, CastMode mode, float v, float r) {
  const float h = v * r;
  return mode == CastMode::Llama ? host::round_to(x.dt, h) : h;
}

void write_param_grad(const Vec& out, const std::vector<double>& g, bool accumulate) {
  if (!out.data) return;
  for (size_t c = 0; c < g.size(); ++c) {
    const float prev = accumulate ? load(out.data, out.dt, static_cast<int64_t>(c)) : 0.0f;
    host::store(out.data, out.dt, static_cast<int64_t>(c), prev + static_cast<float>(g[c]));
  }
}
}  // namespace

void rms_norm_fwd(const RmsNormFwd& a) {
  for (int64_t r = 0; r < a.x.rows; ++r) {
    const float rs = rms_rstd(a.x, r, a.eps);
    if (a.rstd) a.rstd[r] = rs;
    for (int64_t c = 0; c < a.x.cols; ++c) {
      const float w = a.offset + load(a.w.data, a.w.dt, c);
      put(a.y, r, c, rms_hat(a.x, a.mode, at(a.x, r, c), rs) * w);
    }
  }
}

void rms_norm_bwd(const RmsNormBwd& a) {
  const int64_t n = a.x.cols;
  std::vector<double> dw(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < a.x.rows; ++r) {
    const float rs = a.rstd ? a.rstd[r] : rms_rstd(a.x, r, a.eps);
    // dx = r·(m - x̂·mean(m·x̂)) with m = dy·(offset + w), x̂ = x·r (unrounded).
    double dot = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float m = at(a.dy, r, c) * (a.offset + load(a.w.data, a.w.dt, c));
      dot += static_cast<double>(m) * at(a.x, r, c) * rs;
    }
    const float mean_mx = static_cast<float>(dot / static_cast<double>(n));
    for (int64_t c = 0; c < n; ++c) {
      const float xv = at(a.x, r, c), g = at(a.dy, r, c);
      const float m = g * (a.offset + load(a.w.data, a.w.dt, c));
      dw[static_cast<size_t>(c)] += static_cast<double>(g) * rms_hat(a.x, a.mode, xv, rs);
      put(a.dx, r, c, rs * (m - xv * rs * mean_mx));
    }
  }
  write_param_grad(a.dw, dw, a.accumulate_dw);
}

namespace {
void ln_stats(const Rows& x, int64_t r, float eps, float* mean, float* rstd) {
  double s = 0, ss = 0;
  for (int64_t c = 0; c < x.cols; ++c) s += at(x, r, c);
  const double mu = s / static_cast<double>(x.cols);
  for (int64_t c = 0; c < x.cols; ++c) {
    const double d = at(x, r, c) - mu;
    ss += d * d;
  }
  *mean = static_cast<float>(mu);
  *rstd = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(x.cols) + eps));
}
}  // namespace

void layer_norm_fwd(const LayerNormFwd& a) {
  for (int64_t r = 0; r < a.x.rows; ++r) {
    float mu, rs;
    ln_stats(a.x, r, a.eps, &mu, &rs);
    if (a.mean) a.mean[r] = mu;
    if (a.rstd) a.rstd[r] = rs;
    for (int64_t c = 0; c < a.x.cols; ++c) {
      const float b = a.b.data ? load(a.b.data, a.b.dt, c) : 0.0f;
      put(a.y, r, c, (at(a.x, r, c) - mu) * rs * load(a.w.data, a.w.dt, c) + b);
    }
  }
}

void layer_norm_bwd(const LayerNormBwd& a) {
  const int64_t n = a.x.cols;
  std::vector<double> dw(static_cast<size_t>(n), 0.0), db(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < a.x.rows; ++r) {
    float mu, rs;
    if (a.mean && a.rstd) {
      mu = a.mean[r];
      rs = a.rstd[r];
    } else {
      ln_stats(a.x, r, a.eps, &mu, &rs);
    }
    // dx = r·(g - mean(g) - x̂·mean(g·x̂)) with g = dy·w.
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float g = at(a.dy, r, c) * load(a.w.data, a.w.dt, c);
      const float xh = (at(a.x, r, c) - mu) * rs;
      sg += g;
      sgx += static_cast<double>(g) * xh;
    }
    const float mg = static_cast<float>(sg / n), mgx = static_cast<float>(sgx / n);
    for (int64_t c = 0; c < n; ++c) {
      const float dyv = at(a.dy, r, c);
      const float g = dyv * load(a.w.data, a.w.dt, c);
      const float xh = (at(a.x, r, c) - mu) * rs;
      dw[static_cast<size_t>(c)] += static_cast<double>(dyv) * xh;
      db[static_cast<size_t>(c)] += dyv;
      put(a.dx, r, c, rs * (g - mg - xh * mgx));
    }
  }
  write_param_grad(a.dw, dw, a.accumulate);
  write_param_grad(a.db, db, a.accumulate);
}

}  // namespace liger::cpu
