// tests/unit/ops/test_attention_reference.h — the double-precision attention reference shared by
// the fused-attention tests (CPU: test_attention_fused.cc; GPU: tests/gpu_attention/).
//
// Every feature of attention@1 / attention_varlen@1 (hk/layer_interfaces.h): GQA, scale, causal
// aligned bottom-right, left window, softcap, key_start, per-sequence lengths (varlen), lse
// (+∞ for a fully masked row, whose output and gradients are 0), and the backward (dq, dk, dv
// with dk/dv summed over each kv group). Plain loops in double over row-major [rows, H, D] values
// (rows = the packed rows, or b·S + s in batch layout); no tiling, no rounding: the truth the
// kernels are measured against. Also the comparison rule for attention outputs (relative L2 and
// max error, in units of the dtype), since probabilities rounded to 16 bits before P·V put every
// output element off by up to ~u·max|v| from the exact value.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "hk/dtype.h"

namespace hk::test {

struct AttnProblem {
  std::vector<int64_t> S, T;  // queries / keys of each sequence
  int64_t hq = 1, hkv = 1, d = 64;
  double scale = 0;  // 0 → 1/sqrt(d)
  bool causal = true;
  double softcap = 0;
  int64_t window = -1;
  std::vector<int64_t> key_start;  // per sequence, empty = none
  int64_t batch() const { return static_cast<int64_t>(S.size()); }
  int64_t rows_q() const {
    int64_t n = 0;
    for (int64_t s : S) n += s;
    return n;
  }
  int64_t rows_k() const {
    int64_t n = 0;
    for (int64_t t : T) n += t;
    return n;
  }
  double eff_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(double(d)); }
};

struct AttnRef {
  std::vector<double> out, lse;  // out [rows_q, hq, d]; lse [hq, rows_q] (varlen layout)
  std::vector<double> dq, dk, dv;
};

// q [rows_q, hq, d], k/v [rows_k, hkv, d], dout like q (empty: no backward).
inline AttnRef attention_reference(const AttnProblem& p, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& dout = {}) {
  const int64_t d = p.d, hq = p.hq, hkv = p.hkv, group = hq / hkv;
  const int64_t nq = p.rows_q(), nk = p.rows_k();
  const double scale = p.eff_scale();
  AttnRef r;
  r.out.assign(nq * hq * d, 0.0);
  r.lse.assign(hq * nq, 0.0);
  const bool bwd = !dout.empty();
  if (bwd) {
    r.dq.assign(nq * hq * d, 0.0);
    r.dk.assign(nk * hkv * d, 0.0);
    r.dv.assign(nk * hkv * d, 0.0);
  }
  int64_t q0 = 0, k0 = 0;
  for (int64_t b = 0; b < p.batch(); ++b) {
    const int64_t S = p.S[b], T = p.T[b];
    const int64_t ks = p.key_start.empty() ? 0 : std::clamp<int64_t>(p.key_start[b], 0, T);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t qi = ((q0 + s) * hq + h) * d;
        const int64_t diag = s + T - S;
        std::vector<double> sc(T), th(T, 0.0);
        std::vector<char> vis(T, 0);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          vis[j] = j >= ks && (!p.causal || j <= diag) && (p.window < 0 || j >= diag - p.window);
          if (!vis[j]) continue;
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += q[qi + e] * k[((k0 + j) * hkv + kh) * d + e];
          double x = dot * scale;
          if (p.softcap > 0) {
            th[j] = std::tanh(x / p.softcap);
            x = p.softcap * th[j];
          }
          sc[j] = x;
          m = std::max(m, x);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j)
          if (vis[j]) sum += std::exp(sc[j] - m);
        r.lse[h * nq + q0 + s] =
            sum > 0 ? m + std::log(sum) : std::numeric_limits<double>::infinity();
        if (sum == 0) continue;
        std::vector<double> pr(T, 0.0), dp(T, 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (!vis[j]) continue;
          pr[j] = std::exp(sc[j] - m) / sum;
          for (int64_t e = 0; e < d; ++e) r.out[qi + e] += pr[j] * v[((k0 + j) * hkv + kh) * d + e];
        }
        if (!bwd) continue;
        double di = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (!vis[j]) continue;
          for (int64_t e = 0; e < d; ++e) dp[j] += dout[qi + e] * v[((k0 + j) * hkv + kh) * d + e];
          di += pr[j] * dp[j];
        }
        for (int64_t j = 0; j < T; ++j) {
          if (!vis[j]) continue;
          const int64_t kj = ((k0 + j) * hkv + kh) * d;
          double ds = pr[j] * (dp[j] - di);
          if (p.softcap > 0) ds *= 1 - th[j] * th[j];
          ds *= scale;
          for (int64_t e = 0; e < d; ++e) {
            r.dv[kj + e] += pr[j] * dout[qi + e];
            r.dq[qi + e] += ds * k[kj + e];
            r.dk[kj + e] += ds * q[qi + e];
          }
        }
      }
    }
    q0 += S;
    k0 += T;
  }
  return r;
}

// The reference lse ([Hq, rows]) in the batch layout [B, Hq, S] (every S[b] equal).
inline std::vector<double> batch_lse(const AttnProblem& p, const std::vector<double>& lse) {
  const int64_t S = p.S[0], nq = p.rows_q();
  std::vector<double> out;
  for (int64_t b = 0; b < p.batch(); ++b)
    for (int64_t h = 0; h < p.hq; ++h)
      for (int64_t s = 0; s < S; ++s) out.push_back(lse[h * nq + b * S + s]);
  return out;
}

// Accuracy a fused kernel in `dtype` must reach against the double reference: relative L2 error
// and the largest element error relative to the largest reference magnitude.
struct AttnTolerance {
  double rel_l2, rel_max;
};
inline AttnTolerance attention_tolerance(DType dtype, bool gradient = false) {
  const double g = gradient ? 2.0 : 1.0;
  switch (dtype) {
    case DType::F64:  // the backward recomputes probabilities from the f32 lse
      return gradient ? AttnTolerance{1e-6, 1e-6} : AttnTolerance{1e-10, 1e-10};
    case DType::F32:
      return {2e-5 * g, 1e-4 * g};
    case DType::F16:
      return {2e-3 * g, 1e-2 * g};
    default:  // bf16
      return {1.2e-2 * g, 4e-2 * g};
  }
}

// Compares `got` with `ref` (same layout); `what` names the tensor in the message. Non-finite
// values in got fail unless the reference has the same non-finite value there.
inline ::testing::AssertionResult attention_close(const std::vector<double>& got,
                                                  const std::vector<double>& ref, AttnTolerance tol,
                                                  const std::string& what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, reference " << ref.size();
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) {
      if (got[i] == ref[i]) continue;
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
    }
    const double e = std::fabs(got[i] - ref[i]);
    err2 += e * e;
    ref2 += ref[i] * ref[i];
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    if (e > max_err) max_err = e, worst = i;
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  const double rel_max = max_ref > 0 ? max_err / max_ref : max_err;
  if (rel <= tol.rel_l2 && rel_max <= tol.rel_max) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": relative L2 error " << rel << " (limit " << tol.rel_l2 << "), max error "
         << max_err << " = " << rel_max << " of max |ref| " << max_ref << " (limit " << tol.rel_max
         << ") at [" << worst << "]: got " << got[worst] << " ref " << ref[worst];
}

}  // namespace hk::test
