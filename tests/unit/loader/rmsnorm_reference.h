// Double-precision reference of rms_norm@1 and the tolerance rule, shared by the cpu and gpu
// kernel tests (ARCHITECTURE.md "Tests": atol + rtol·|ref|, the reference rounded to the output
// dtype first).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hk/dtype.h"
#include "hk/layer_interfaces.h"

namespace hk {

// Tolerances: atol + rtol·|ref|, the reference first rounded to the output dtype. Two units of
// rounding for 16-bit outputs (the llama casting rounds twice), f32 accumulation error for f32.
inline double rtol(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 2.0 * std::ldexp(1.0, -8);
    case DType::F16:
      return 2.0 * std::ldexp(1.0, -11);
    default:
      return 2e-5;
  }
}

struct Reference {
  std::vector<double> y, rstd, dx, dweight;
  std::vector<double> dweight_abs;  // Σ|dy·n| per column: scale of dweight's rounding error
};

// Double-precision reference of rms_norm@1 (inputs already rounded to their dtype).
inline Reference reference(const std::vector<double>& x, const std::vector<double>& w,
                           const std::vector<double>& dy, int64_t rows, int64_t h, DType dtype,
                           const RmsNormAttrs& attrs) {
  Reference ref;
  ref.dweight.assign(h, 0.0);
  ref.dweight_abs.assign(h, 0.0);
  const bool llama = attrs.casting_mode == kRmsNormCastingLlama;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += x[r * h + j] * x[r * h + j];
    const double rs = 1.0 / std::sqrt(ss / h + attrs.eps);
    ref.rstd.push_back(rs);
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      double n = x[r * h + j] * rs;
      if (llama) n = round_to(dtype, static_cast<float>(n));
      ref.y.push_back(n * (attrs.offset + w[j]));
      if (!dy.empty()) {
        dot += dy[r * h + j] * (attrs.offset + w[j]) * x[r * h + j] * rs;
        ref.dweight[j] += dy[r * h + j] * n;
        ref.dweight_abs[j] += std::abs(dy[r * h + j] * n);
      }
    }
    if (dy.empty()) continue;
    for (int64_t j = 0; j < h; ++j) {
      const double g = dy[r * h + j] * (attrs.offset + w[j]);
      ref.dx.push_back(rs * (g - x[r * h + j] * rs * dot / h));
    }
  }
  return ref;
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& ref,
                         DType dtype, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = round_to(dtype, static_cast<float>(ref[i]));
    if (std::abs(got[i] - r) > atol + rtol(dtype) * std::abs(r)) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << r;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " out of tolerance";
}

}  // namespace hk
