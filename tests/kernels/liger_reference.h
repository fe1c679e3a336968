// tests/kernels/liger_reference.h — naive double-precision references for the liger kernels.
//
// Written from the formulas (liger/args.h, hk/layer_interfaces.h), not from the kernels: inputs
// are the dtype-rounded values, math in double; the only roundings are the ones the contract
// itself names (llama RMSNorm's x·r rounded to x's dtype, act(gate) rounded before ·up, FLCE's
// logits and d(logits) held in the input dtype). The finite-difference tests check the
// reference gradients against the reference forwards.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "liger/args.h"
#include "liger/host_numerics.h"

namespace liger_test::ref {

using liger::Dt;
using M = std::vector<double>;  // row-major [rows][cols]

inline double rnd(Dt dt, double v) {
  return liger::host::round_to(dt, static_cast<float>(v));
}

// ---- RMSNorm / LayerNorm ------------------------------------------------------------------------
struct RmsOut {
  M y;
  std::vector<double> rstd;
};
// Llama casting rounds the f32 product x·r; when the kernel's own f32 rstd is given, that product
// is formed exactly as the kernel forms it (one f32 multiply), so the rounding point is the same.
inline double llama_hat(Dt dt, double x, double rs, const std::vector<float>* rstd_f32, int64_t r) {
  if (!rstd_f32) return rnd(dt, x * rs);
  return rnd(dt, static_cast<float>(x) * (*rstd_f32)[r]);
}
inline RmsOut rms_fwd(const M& x, int64_t rows, int64_t h, const std::vector<double>& w, double eps,
                      double offset, bool llama, Dt dt,
                      const std::vector<float>* rstd_f32 = nullptr) {
  RmsOut o{M(x.size()), std::vector<double>(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < h; ++c) ss += x[r * h + c] * x[r * h + c];
    const double rs = 1 / std::sqrt(ss / h + eps);
    o.rstd[r] = rs;
    for (int64_t c = 0; c < h; ++c) {
      double n = x[r * h + c] * rs;
      if (llama) n = llama_hat(dt, x[r * h + c], rs, rstd_f32, r);
      o.y[r * h + c] = n * (offset + w[c]);
    }
  }
  return o;
}
inline void rms_bwd(const M& dy, const M& x, int64_t rows, int64_t h, const std::vector<double>& w,
                    double eps, double offset, bool llama, Dt dt, M* dx, std::vector<double>* dw,
                    const std::vector<float>* rstd_f32 = nullptr) {
  dx->assign(x.size(), 0);
  dw->assign(h, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < h; ++c) ss += x[r * h + c] * x[r * h + c];
    const double rs = 1 / std::sqrt(ss / h + eps);
    double dot = 0;
    for (int64_t c = 0; c < h; ++c) dot += dy[r * h + c] * (offset + w[c]) * x[r * h + c] * rs;
    for (int64_t c = 0; c < h; ++c) {
      const double n = x[r * h + c] * rs;
      (*dx)[r * h + c] = rs * (dy[r * h + c] * (offset + w[c]) - n * dot / h);
      (*dw)[c] += dy[r * h + c] * (llama ? llama_hat(dt, x[r * h + c], rs, rstd_f32, r) : n);
    }
  }
}

inline M ln_fwd(const M& x, int64_t rows, int64_t h, const std::vector<double>& w,
                const std::vector<double>& b, double eps) {
  M y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < h; ++c) mu += x[r * h + c];
    mu /= h;
    for (int64_t c = 0; c < h; ++c) var += (x[r * h + c] - mu) * (x[r * h + c] - mu);
    const double rs = 1 / std::sqrt(var / h + eps);
    for (int64_t c = 0; c < h; ++c) y[r * h + c] = (x[r * h + c] - mu) * rs * w[c] + b[c];
  }
  return y;
}
inline void ln_bwd(const M& dy, const M& x, int64_t rows, int64_t h, const std::vector<double>& w,
                   double eps, M* dx, std::vector<double>* dw, std::vector<double>* db) {
  dx->assign(x.size(), 0);
  dw->assign(h, 0);
  db->assign(h, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < h; ++c) mu += x[r * h + c];
    mu /= h;
    for (int64_t c = 0; c < h; ++c) var += (x[r * h + c] - mu) * (x[r * h + c] - mu);
    const double rs = 1 / std::sqrt(var / h + eps);
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < h; ++c) {
      const double g = dy[r * h + c] * w[c], xh = (x[r * h + c] - mu) * rs;
      sg += g;
      sgx += g * xh;
    }
    for (int64_t c = 0; c < h; ++c) {
      const double g = dy[r * h + c] * w[c], xh = (x[r * h + c] - mu) * rs;
      (*dx)[r * h + c] = rs * (g - sg / h - xh * sgx / h);
      (*dw)[c] += dy[r * h + c] * xh;
      (*db)[c] += dy[r * h + c];
    }
  }
}

// ---- activations --------------------------------------------------------------------------------
inline double act(liger::Act a, double x) {
  switch (a) {
    case liger::Act::SiLU:
      return x / (1 + std::exp(-x));
    case liger::Act::GeluErf:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case liger::Act::GeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    default:
      return x / (1 + std::exp(-1.702 * x));
  }
}
inline double act_grad(liger::Act a, double x) {  // central difference of act in double
  const double h = 1e-6 * std::fmax(1.0, std::fabs(x));
  return (act(a, x + h) - act(a, x - h)) / (2 * h);
}

// ---- cross-entropy ------------------------------------------------------------------------------
struct CeOpts {
  double eps = 0, zscale = 0, softcap = 0;
};
struct CeRow {
  double loss = 0, z = 0, lse = 0;
  std::vector<double> grad;  // d loss / d logits (upstream 1, no reduction scale)
};
inline CeRow ce_row(const std::vector<double>& x, int64_t t, const CeOpts& o) {
  const int64_t v = static_cast<int64_t>(x.size());
  std::vector<double> z(v);
  double mx = -INFINITY, sz = 0;
  for (int64_t j = 0; j < v; ++j) {
    z[j] = o.softcap > 0 ? o.softcap * std::tanh(x[j] / o.softcap) : x[j];
    mx = std::fmax(mx, z[j]);
    sz += z[j];
  }
  double se = 0;
  for (int64_t j = 0; j < v; ++j) se += std::exp(z[j] - mx);
  CeRow r;
  r.lse = mx + std::log(se);
  r.z = o.zscale * r.lse * r.lse;
  r.loss = (1 - o.eps) * (r.lse - z[t]) + o.eps * (r.lse - sz / v) + r.z;
  r.grad.resize(v);
  for (int64_t j = 0; j < v; ++j) {
    double g = std::exp(z[j] - r.lse) * (1 + 2 * o.zscale * r.lse) - o.eps / v;
    if (j == t) g -= 1 - o.eps;
    if (o.softcap > 0) g *= 1 - (z[j] / o.softcap) * (z[j] / o.softcap);
    r.grad[j] = g;
  }
  return r;
}

}  // namespace liger_test::ref
