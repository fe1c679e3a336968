// rotary_tables, rotary_embedding and its backward on CPU against double references (odd head
// dims, batch-1 tables, strided/aliased outputs), and the backward by finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

TEST(RotaryTables, MatchesDoubleReferenceWithinF32AngleError) {
  for (int64_t d : {2, 10, 64})
    for (double theta : {10000.0, 1000000.0})
      for (float scaling : {1.0f, 0.7f}) {
        SCOPED_TRACE(::testing::Message()
                     << "d " << d << " theta " << theta << " scaling " << scaling);
        Tensor pos = random_ints({2, 7}, DType::I64, 0, 4096, 1);
        Tensor cos = with_layout(Tensor::empty({2, 7, d}, DType::F32), Layout::Contiguous);
        Tensor sin = empty_with_layout({2, 7, d}, DType::F32, Layout::Strided);
        ops::rotary_tables(pos, d, theta, scaling, cos, sin);
        const auto p = pos.to_int64s();
        std::vector<double> c_ref, s_ref, angle_err;
        for (int64_t t : p)
          for (int64_t i = 0; i < d; ++i) {
            const double inv = std::pow(theta, -2.0 * static_cast<double>(i % (d / 2)) / d);
            c_ref.push_back(std::cos(t * inv) * scaling);
            s_ref.push_back(std::sin(t * inv) * scaling);
            // the angle is formed in f32 (as Transformers does): a few ulps of position·inv_freq
            angle_err.push_back(8 * unit_roundoff(DType::F32) * (t * inv + 1));
          }
        EXPECT_TRUE(all_close(cos, c_ref, angle_err));
        EXPECT_TRUE(all_close(sin, s_ref, angle_err));
      }
}

// y = x·cos + rotate_half(x)·sin for x [B, S, H, D] and tables [Bt, S, D].
std::vector<double> ref_rotary(const std::vector<double>& x, const std::vector<double>& c,
                               const std::vector<double>& s, int64_t b, int64_t sq, int64_t h,
                               int64_t d, int64_t table_batch) {
  std::vector<double> y(x.size());
  const int64_t half = d / 2;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < sq; ++si)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t j = 0; j < d; ++j) {
          const int64_t xi = ((bi * sq + si) * h + hi) * d;
          const int64_t ti = ((table_batch == 1 ? 0 : bi) * sq + si) * d;
          const double rot = j < half ? -x[xi + j + half] : x[xi + j - half];
          y[xi + j] = x[xi + j] * c[ti + j] + rot * s[ti + j];
        }
  return y;
}

TEST(RotaryEmbedding, MatchesReference) {
  uint64_t seed = 10;
  for (DType dt : kTestDtypes)
    for (int64_t d : {2, 8, 66})
      for (int64_t table_batch : {1, 2})
        for (Layout lx : kAllLayouts) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " d " << d << " table batch "
                                            << table_batch << " x " << layout_name(lx));
          const int64_t b = 2, s = 5, h = 3;
          Tensor x = with_layout(random_tensor({b, s, h, d}, dt, seed++), lx);
          Tensor cos = random_tensor({table_batch, s, d}, DType::F32, seed++);
          Tensor sin = random_tensor({table_batch, s, d}, DType::F32, seed++);
          Tensor y =
              empty_with_layout({b, s, h, d}, dt, kAllLayouts[(static_cast<int>(lx) + 1) % 4]);
          ops::rotary_embedding(x, cos, sin, y);
          EXPECT_TRUE(all_close(
              y, ref_rotary(values(x), values(cos), values(sin), b, s, h, d, table_batch)));
        }
}

TEST(RotaryEmbedding, InPlaceOnAStridedView) {
  // q as a [B, S, H, D] view of a fused projection output (heads strided), rotated in place.
  Tensor fused = random_tensor({2, 4, 3 * 16}, DType::BF16, 40);
  Tensor q = fused.slice(2, 0, 32).reshape({2, 4, 2, 16});
  Tensor cos = random_tensor({1, 4, 16}, DType::F32, 41),
         sin = random_tensor({1, 4, 16}, DType::F32, 42);
  const auto ref = ref_rotary(values(q), values(cos), values(sin), 2, 4, 2, 16, 1);
  const auto untouched = values(fused.slice(2, 32, 48));
  ops::rotary_embedding(q, cos, sin, q);
  EXPECT_TRUE(all_close(q, ref));
  EXPECT_TRUE(all_close(fused.slice(2, 32, 48), untouched, Tolerance{0, 0}));
}

TEST(RotaryEmbeddingBackward, MatchesTransposeAndFiniteDifferences) {
  // Backward is the transpose of the forward map: <dy, R x> = <Rᵀ dy, x> for random x, dy.
  for (DType dt : kTestDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t b = 2, s = 3, h = 2, d = 10;
    Tensor dy = with_layout(random_tensor({b, s, h, d}, dt, 60), Layout::Transposed);
    Tensor cos = random_tensor({b, s, d}, DType::F32, 61),
           sin = random_tensor({b, s, d}, DType::F32, 62);
    Tensor dx = empty_with_layout({b, s, h, d}, dt, Layout::Strided);
    ops::rotary_embedding_backward(dy, cos, sin, dx);
    // reference: dx_j = Σ_i dy_i ∂y_i/∂x_j, with ∂y/∂x from the forward reference on unit vectors
    const auto g = values(dy), c = values(cos), sn = values(sin);
    std::vector<double> ref(g.size(), 0), e(g.size(), 0);
    for (size_t j = 0; j < g.size(); ++j) {
      e[j] = 1;
      const auto col = ref_rotary(e, c, sn, b, s, h, d, b);
      e[j] = 0;
      for (size_t i = 0; i < g.size(); ++i) ref[j] += g[i] * col[i];
    }
    EXPECT_TRUE(all_close(dx, ref));
  }
  const int64_t b = 1, s = 2, h = 2, d = 6;
  Tensor x = random_tensor({b, s, h, d}, DType::F64, 70);
  Tensor cos = random_tensor({1, s, d}, DType::F64, 71),
         sin = random_tensor({1, s, d}, DType::F64, 72);
  Tensor w = random_tensor({b, s, h, d}, DType::F64, 73);
  Tensor y = Tensor::empty({b, s, h, d}, DType::F64), dx = Tensor::empty({b, s, h, d}, DType::F64);
  const auto wv = values(w);
  auto loss = [&] {
    ops::rotary_embedding(x, cos, sin, y);
    return weighted_sum(y, wv);
  };
  ops::rotary_embedding_backward(w, cos, sin, dx);
  EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), Tolerance{1e-8, 1e-7}));
}

}  // namespace
}  // namespace hk
