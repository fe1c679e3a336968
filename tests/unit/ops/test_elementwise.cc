// Elementwise ops on CPU: activations (and backward), act_mul (and backward), add/mul with
// broadcasting and aliasing, scale, cast between every dtype pair, fill — against double
// references, with backward by finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;
using ops::Activation;

constexpr Activation kActs[] = {Activation::SiLU, Activation::GELU, Activation::GELUTanh,
                                Activation::QuickGELU};

double ref_act(Activation a, double x) {
  switch (a) {
    case Activation::SiLU:
      return x / (1 + std::exp(-x));
    case Activation::GELU:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::GELUTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::QuickGELU:
      return x / (1 + std::exp(-1.702 * x));
  }
  return 0;
}

// Derivative by a high-order central difference in double (independent of the op's formulas).
double ref_act_grad(Activation a, double x) {
  const double h = 1e-4;
  return (-ref_act(a, x + 2 * h) + 8 * ref_act(a, x + h) - 8 * ref_act(a, x - h) +
          ref_act(a, x - 2 * h)) /
         (12 * h);
}

std::vector<double> map(const std::vector<double>& v, const std::function<double(double)>& f) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f(v[i]);
  return out;
}

const Shape kShapes[] = {{1}, {7}, {3, 33}, {2, 129}};

TEST(Activation, ForwardAndBackwardMatchReference) {
  uint64_t seed = 1;
  for (Activation a : kActs)
    for (DType dt : kTestDtypes)
      for (const Shape& shape : kShapes)
        for (Layout l : kAllLayouts) {
          SCOPED_TRACE(::testing::Message()
                       << "act " << static_cast<int>(a) << " " << dtype_name(dt) << " "
                       << shape_str(shape) << " " << layout_name(l));
          Tensor x = with_layout(random_tensor(shape, dt, seed++, -6, 6), l);
          Tensor y = empty_with_layout(shape, dt, kAllLayouts[(static_cast<int>(l) + 1) % 4]);
          ops::activation(a, x, y);
          const auto xv = values(x);
          EXPECT_TRUE(all_close(y, map(xv, [a](double v) { return ref_act(a, v); })));
          Tensor dy = random_tensor(shape, dt, seed++);
          Tensor dx = empty_with_layout(shape, dt, l);
          ops::activation_backward(a, dy, x, dx);
          const auto g = values(dy);
          std::vector<double> ref(g.size());
          for (size_t i = 0; i < g.size(); ++i) ref[i] = g[i] * ref_act_grad(a, xv[i]);
          Tolerance tol = default_tolerance(dt);
          tol.atol = std::max(tol.atol, 1e-6);  // the reference derivative is itself numeric
          EXPECT_TRUE(all_close(dx, ref, tol));
        }
}

TEST(ActMul, ForwardRoundsActivationThenMultiplies) {
  uint64_t seed = 100;
  for (Activation a : kActs)
    for (DType dt : kTestDtypes)
      for (const Shape& shape : kShapes) {
        SCOPED_TRACE(::testing::Message() << "act " << static_cast<int>(a) << " " << dtype_name(dt)
                                          << " " << shape_str(shape));
        Tensor gate = with_layout(random_tensor(shape, dt, seed++, -4, 4), Layout::Strided);
        Tensor up = with_layout(random_tensor(shape, dt, seed++, -4, 4), Layout::Transposed);
        Tensor out = empty_with_layout(shape, dt, Layout::PaddedRows);
        ops::act_mul(a, gate, up, out);
        const auto g = values(gate), u = values(up);
        std::vector<double> ref(g.size());
        for (size_t i = 0; i < g.size(); ++i) ref[i] = round_to_dtype(ref_act(a, g[i]), dt) * u[i];
        EXPECT_TRUE(all_close(out, ref));
        if (dt != DType::F32 && g.size() > 30) EXPECT_GE(exact_fraction(out, ref), 0.97);

        Tensor dout = random_tensor(shape, dt, seed++);
        Tensor dgate = empty_with_layout(shape, dt, Layout::Transposed);
        Tensor dup = empty_with_layout(shape, dt, Layout::Strided);
        ops::act_mul_backward(a, dout, gate, up, dgate, dup);
        const auto d = values(dout);
        std::vector<double> dg(g.size()), du(g.size());
        for (size_t i = 0; i < g.size(); ++i) {
          du[i] = d[i] * round_to_dtype(ref_act(a, g[i]), dt);
          dg[i] = d[i] * u[i] * ref_act_grad(a, g[i]);
        }
        Tolerance tol = default_tolerance(dt);
        tol.atol = std::max(tol.atol, 1e-6);
        EXPECT_TRUE(all_close(dgate, dg, tol));
        EXPECT_TRUE(all_close(dup, du));
      }
}

TEST(ActMul, BackwardFiniteDifferencesF64) {
  for (Activation a : kActs) {
    SCOPED_TRACE(static_cast<int>(a));
    Tensor gate = random_tensor({2, 5}, DType::F64, 200, -3, 3);
    Tensor up = random_tensor({2, 5}, DType::F64, 201);
    Tensor w = random_tensor({2, 5}, DType::F64, 202);
    Tensor out = Tensor::empty({2, 5}, DType::F64);
    const auto wv = values(w);
    auto loss = [&] {
      ops::act_mul(a, gate, up, out);
      return weighted_sum(out, wv);
    };
    Tensor dgate = Tensor::empty({2, 5}, DType::F64), dup = Tensor::empty({2, 5}, DType::F64);
    ops::act_mul_backward(a, w, gate, up, dgate, dup);
    EXPECT_TRUE(all_close(dgate, numeric_gradient(gate, loss), Tolerance{1e-8, 1e-7}));
    EXPECT_TRUE(all_close(dup, numeric_gradient(up, loss), Tolerance{1e-8, 1e-7}));
    // activation_backward by finite differences too
    Tensor y = Tensor::empty({2, 5}, DType::F64), dx = Tensor::empty({2, 5}, DType::F64);
    auto act_loss = [&] {
      ops::activation(a, gate, y);
      return weighted_sum(y, wv);
    };
    ops::activation_backward(a, w, gate, dx);
    EXPECT_TRUE(all_close(dx, numeric_gradient(gate, act_loss), Tolerance{1e-8, 1e-7}));
  }
}

TEST(AddMul, BroadcastAliasAndLayouts) {
  uint64_t seed = 300;
  for (DType dt : kTestDtypes)
    for (Layout l : kAllLayouts)
      for (int bshape = 0; bshape < 4; ++bshape) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " " << layout_name(l) << " b#" << bshape);
        const Shape shape{3, 33};
        // b: full, [33] (fewer dims), [1, 33] (size-1 dim), expand()ed [3, 33] with stride 0
        const Shape b_shapes[] = {{3, 33}, {33}, {1, 33}, {1, 33}};
        Tensor a = with_layout(random_tensor(shape, dt, seed++), l);
        Tensor b = random_tensor(b_shapes[bshape], dt, seed++);
        if (bshape == 3) b = b.expand(shape);
        const auto av = values(a), bv = values(b);
        auto bval = [&](size_t i) { return bv.size() == av.size() ? bv[i] : bv[i % 33]; };
        Tensor out = empty_with_layout(shape, dt, kAllLayouts[(static_cast<int>(l) + 3) % 4]);
        ops::add(a, b, out, -0.5f);
        std::vector<double> ref(av.size());
        for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] - 0.5 * bval(i);
        EXPECT_TRUE(all_close(out, ref));
        ops::mul(a, b, out);
        for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] * bval(i);
        EXPECT_TRUE(all_close(out, ref));
        ops::add(a, b, a);  // out aliases a
        for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] + bval(i);
        EXPECT_TRUE(all_close(a, ref));
        ops::scale(a, 3.0f, out);
        const auto a2 = values(a);
        for (size_t i = 0; i < av.size(); ++i) ref[i] = a2[i] * 3.0;
        EXPECT_TRUE(all_close(out, ref));
      }
}

TEST(Cast, EveryDtypePairRoundsOnceToNearestEven) {
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::I32,
                       DType::I64, DType::U8,  DType::Bool, DType::F64};
  // values exact in every dtype's range handling: integers survive all, fractions test rounding
  const std::vector<double> v = {0,           1,     2, 3, 7, 100, 1 + 0x1p-8, 1 + 3 * 0x1p-9,
                                 1 + 0x1p-11, 250.75};
  for (DType from : all)
    for (DType to : all) {
      SCOPED_TRACE(::testing::Message() << dtype_name(from) << " -> " << dtype_name(to));
      Tensor x = tensor_from_doubles(v, {static_cast<int64_t>(v.size())}, from);
      Tensor out = empty_with_layout({static_cast<int64_t>(v.size())}, to, Layout::Strided);
      ops::cast(x, out);
      std::vector<double> ref;
      for (double e : values(x)) {
        if (to == DType::Bool)
          ref.push_back(e != 0);
        else if (!is_floating(to))
          ref.push_back(std::trunc(e));
        else
          ref.push_back(e);  // all_close rounds the reference to `to`
      }
      EXPECT_TRUE(all_close(out, ref, Tolerance{0, 0}));
    }
  // large i64 values cast to i64/i32-free paths stay exact
  Tensor big = Tensor::from_ints({(int64_t{1} << 53) + 1, -5}, {2});
  Tensor big_out = Tensor::empty({2}, DType::I64);
  ops::cast(big.slice(0, 0, 2), big_out);
  EXPECT_EQ(big_out.to_int64s(), big.to_int64s());
}

TEST(Fill, WritesEveryElementOfAView) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::I64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor base = Tensor::zeros({4, 6}, dt);
    Tensor view = base.slice(1, 1, 6, 2);  // columns 1, 3, 5
    ops::fill(view, 3.0);
    const auto all_values = values(base);
    for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(all_values[i], (i % 6) % 2 == 1 ? 3.0 : 0.0) << i;
  }
}

}  // namespace
}  // namespace hk
