// tests/kernels/liger_kernels_cpu_test.cc — the cpu variant of the liger kernels against the
// double references (shared cases in liger_cases.inc), plus finite-difference checks of the
// reference gradients themselves. Runs in CI.
#include <memory>
#include <vector>

#include "liger/cpu_ops.h"
#include "liger_reference.h"
#include "liger_test_support.h"

namespace liger_test {
void* dev_alloc(size_t bytes) {
  static std::vector<std::unique_ptr<char[]>> keep;
  keep.emplace_back(new char[bytes + 64]);
  return keep.back().get();
}
void dev_upload(void* dst, const void* src, size_t bytes) {
  if (dst != src) std::memcpy(dst, src, bytes);
}
void dev_download(void* dst, const void* src, size_t bytes) {
  if (dst != src) std::memcpy(dst, src, bytes);
}
}  // namespace liger_test

namespace be {
using namespace liger::cpu;
inline void* workspace(size_t) {
  return nullptr;
}
inline size_t rms_bwd_workspace(int64_t, int64_t) {
  return 0;
}
inline size_t ln_bwd_workspace(int64_t, int64_t) {
  return 0;
}
inline size_t ce_workspace(int64_t) {
  return 0;
}
inline size_t mlp_workspace(int64_t, int64_t, liger::Dt, bool, bool) {
  return 0;
}
inline size_t flce_workspace(int64_t, int64_t, int64_t, liger::Dt, int64_t) {
  return 0;
}
inline void flce_fwd(const liger::FusedLinearCrossEntropyArgs& a) {
  fused_linear_cross_entropy_fwd(a);
}
}  // namespace be

#include "liger_cases.inc"

namespace liger_test {
namespace {

// Central differences of a scalar function of a vector.
template <class F>
std::vector<double> numeric_grad(std::vector<double> x, F f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double h = 1e-6 * std::fmax(1.0, std::fabs(x[i])), keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

TEST(LigerReference, RmsNormGradientsMatchFiniteDifferences) {
  const int64_t rows = 3, h = 5;
  std::vector<double> x(rows * h), w(h), dy(rows * h);
  std::normal_distribution<double> d;
  for (auto& v : x) v = d(rng());
  for (auto& v : w) v = 1 + 0.2 * d(rng());
  for (auto& v : dy) v = d(rng());
  auto loss_x = [&](const std::vector<double>& xx) {
    auto y = ref::rms_fwd(xx, rows, h, w, 1e-6, 0.5, false, Dt::F32).y;
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  auto loss_w = [&](const std::vector<double>& ww) {
    auto y = ref::rms_fwd(x, rows, h, ww, 1e-6, 0.5, false, Dt::F32).y;
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  ref::M dx;
  std::vector<double> dw;
  ref::rms_bwd(dy, x, rows, h, w, 1e-6, 0.5, false, Dt::F32, &dx, &dw);
  auto nx = numeric_grad(x, loss_x), nw = numeric_grad(w, loss_w);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], nx[i], 1e-6);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], nw[i], 1e-6);
}

TEST(LigerReference, LayerNormGradientsMatchFiniteDifferences) {
  const int64_t rows = 2, h = 6;
  std::vector<double> x(rows * h), w(h), b(h, 0.1), dy(rows * h);
  std::normal_distribution<double> d;
  for (auto& v : x) v = d(rng());
  for (auto& v : w) v = 1 + 0.2 * d(rng());
  for (auto& v : dy) v = d(rng());
  auto dot = [&](const ref::M& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  ref::M dx;
  std::vector<double> dw, db;
  ref::ln_bwd(dy, x, rows, h, w, 1e-5, &dx, &dw, &db);
  auto nx = numeric_grad(
      x, [&](const std::vector<double>& v) { return dot(ref::ln_fwd(v, rows, h, w, b, 1e-5)); });
  auto nw = numeric_grad(
      w, [&](const std::vector<double>& v) { return dot(ref::ln_fwd(x, rows, h, v, b, 1e-5)); });
  auto nb = numeric_grad(
      b, [&](const std::vector<double>& v) { return dot(ref::ln_fwd(x, rows, h, w, v, 1e-5)); });
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], nx[i], 1e-6);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], nw[i], 1e-6);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db[i], nb[i], 1e-6);
}

TEST(LigerReference, CrossEntropyGradientMatchesFiniteDifferences) {
  ref::CeOpts o;
  o.eps = 0.1, o.zscale = 1e-2, o.softcap = 3;
  std::vector<double> x(9);
  std::normal_distribution<double> d(0, 2);
  for (auto& v : x) v = d(rng());
  const auto g = ref::ce_row(x, 4, o).grad;
  const auto n =
      numeric_grad(x, [&](const std::vector<double>& v) { return ref::ce_row(v, 4, o).loss; });
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(g[i], n[i], 1e-6);
}

// The FLCE chunk plan at the Qwen3-0.6B loss shape keeps the extra memory under the 1.3 GB target
// (chunk of bf16 logits + f32 d(weight) accumulator + 32 MiB GEMM workspace) with few chunks.
TEST(LigerChunking, FusedLinearCrossEntropyPlanFitsTheMemoryTarget) {
  const int64_t n = 8192, v = 151936, h = 1024;
  const int64_t c = liger::default_chunk_tokens(n, v, h, 2, true);
  EXPECT_EQ(c % 128, 0);
  const double extra = double(c) * v * 2 + 4.0 * v * h + (32 << 20);
  EXPECT_LE(extra, 1.3e9);
  EXPECT_LE((n + c - 1) / c, 6) << "chunk " << c;
  // Without the f32 accumulator (f32 dweight) the chunks grow; tiny problems are one chunk.
  EXPECT_GT(liger::default_chunk_tokens(n, v, h, 2, false), c);
  EXPECT_EQ(liger::default_chunk_tokens(45, 1000, 64, 4, false), 128);
}

TEST(LigerReference, HostHalfConversionsRoundToNearestEven) {
  using liger::host::f16_bits_to_float;
  using liger::host::float_to_f16_bits;
  for (uint32_t b = 0; b < 0x7c00u; ++b) {  // every finite positive f16 round-trips
    const float f = f16_bits_to_float(static_cast<uint16_t>(b));
    ASSERT_EQ(float_to_f16_bits(f), b) << b;
    ASSERT_EQ(float_to_f16_bits(-f), b | 0x8000u) << b;
  }
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00u);            // overflow → inf
  EXPECT_EQ(float_to_f16_bits(1.0f + 1.0f / 2048), 0x3c00u);  // tie → even
}

}  // namespace
}  // namespace liger_test
