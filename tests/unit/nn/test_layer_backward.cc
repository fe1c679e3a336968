// Finite-difference checks of every built-in layer's backward on CPU in f64 (small shapes): the
// analytic gradient of L = Σ out·R (R random) from the layer's forward_train + backward against
// central differences of its forward, for the layer's inputs and every parameter. Also the
// backward contracts: dx written or added to, gradients accumulated, frozen parameters skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/op_testing.h"
#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/layers.h"
#include "hk/ops.h"

namespace hk {
namespace {

uint64_t next_seed() {
  static uint64_t seed = 7;
  return seed++;
}

// Uniform in offset ± scale, f64.
Tensor randn(const Shape& shape, double scale = 1.0, double offset = 0.0) {
  return test::random_tensor(shape, DType::F64, next_seed(), offset - scale, offset + scale);
}

double dot(const Tensor& a, const Tensor& b) {
  return test::weighted_sum(a, b.to_doubles());
}

// `analytic` against central differences of `objective` with respect to every element of `x`
// (a contiguous f64 CPU tensor the objective reads).
void check_fd(const Tensor& x, const Tensor& analytic, const std::function<double()>& objective,
              const std::string& what) {
  ASSERT_TRUE(analytic.defined()) << what << ": no gradient";
  ASSERT_EQ(analytic.sizes(), x.sizes()) << what;
  const std::vector<double> a = analytic.to_doubles();
  const std::vector<double> numeric = test::numeric_gradient(x, objective, 1e-5);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], numeric[i], 1e-7 + 1e-6 * std::abs(numeric[i])) << what << " element " << i;
}

void set_param(nn::Module& m, const std::string& name, Tensor value) {
  m.slot(name).value = std::move(value);
}
Tensor& grad(nn::Module& m, const std::string& name) {
  return m.slot(name).grad;
}
Tensor like(const Tensor& t) {
  return Tensor::zeros(t.sizes(), t.dtype());
}

// ---- Linear ----------------------------------------------------------------------------------

class LinearBackward : public ::testing::TestWithParam<bool> {};

TEST_P(LinearBackward, MatchesFiniteDifferences) {
  const bool bias = GetParam();
  nn::Linear lin(5, 4, bias);
  set_param(lin, "weight", randn({4, 5}));
  if (bias) set_param(lin, "bias", randn({4}));
  Tensor x = randn({2, 3, 5}), r = randn({2, 3, 4});
  auto objective = [&] {
    Tensor y = Tensor::empty({2, 3, 4}, DType::F64);
    lin.forward(x, y);
    return dot(y, r);
  };
  nn::LayerContext ctx;
  Tensor y = Tensor::empty({2, 3, 4}, DType::F64);
  lin.forward_train(x, y, ctx);
  Tensor dx = like(x);
  lin.backward(x, ctx, r, &dx);
  check_fd(x, dx, objective, "dx");
  check_fd(lin.slot("weight").value, grad(lin, "weight"), objective, "dweight");
  if (bias) check_fd(lin.slot("bias").value, grad(lin, "bias"), objective, "dbias");

  // A second backward accumulates into the parameter gradients and, when asked, into dx.
  const std::vector<double> dw1 = grad(lin, "weight").to_doubles(), dx1 = dx.to_doubles();
  lin.backward(x, ctx, r, &dx, /*accumulate_dx=*/true);
  const std::vector<double> dw2 = grad(lin, "weight").to_doubles(), dx2 = dx.to_doubles();
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw1[i], 1e-12);
  for (size_t i = 0; i < dx1.size(); ++i) EXPECT_NEAR(dx2[i], 2 * dx1[i], 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Bias, LinearBackward, ::testing::Bool());

TEST(LayerBackward, FrozenLinearWeightGetsNoGradientButDxFlows) {
  nn::Linear lin(3, 2, true);
  set_param(lin, "weight", randn({2, 3}));
  set_param(lin, "bias", randn({2}));
  lin.slot("weight").requires_grad = false;
  Tensor x = randn({4, 3}), r = randn({4, 2}), dx = like(x);
  nn::LayerContext ctx;
  lin.backward(x, ctx, r, &dx);
  EXPECT_FALSE(grad(lin, "weight").defined());
  EXPECT_TRUE(grad(lin, "bias").defined());
  EXPECT_NE(dot(dx, dx), 0.0);
}

// ---- Embedding ---------------------------------------------------------------------------------

TEST(LayerBackward, EmbeddingScatterAddsRepeatedIds) {
  nn::Embedding emb(7, 3);
  set_param(emb, "weight", randn({7, 3}));
  Tensor ids = Tensor::from_ints({1, 4, 1, 6, 0, 4}, {2, 3});
  Tensor r = randn({2, 3, 3});
  auto objective = [&] {
    Tensor out = Tensor::empty({2, 3, 3}, DType::F64);
    emb.forward(ids, out);
    return dot(out, r);
  };
  nn::LayerContext ctx;
  Tensor out = Tensor::empty({2, 3, 3}, DType::F64);
  emb.forward_train(ids, out, ctx);
  emb.backward(ids, ctx, r);
  check_fd(emb.slot("weight").value, grad(emb, "weight"), objective, "dweight");
}

// ---- RMSNorm -----------------------------------------------------------------------------------

TEST(LayerBackward, RMSNormMatchesFiniteDifferences) {
  nn::RMSNorm norm("RMSNorm", 8, 1e-6);
  set_param(norm, "weight", randn({8}, 0.1, 1.0));
  Tensor x = randn({2, 3, 8}), r = randn({2, 3, 8});
  auto objective = [&] {
    Tensor y = Tensor::empty(x.sizes(), DType::F64);
    norm.forward(x, y);
    return dot(y, r);
  };
  nn::LayerContext ctx;
  Tensor y = Tensor::empty(x.sizes(), DType::F64);
  norm.forward_train(x, y, ctx);
  EXPECT_TRUE(ctx.has("rstd"));
  Tensor dx = like(x);
  norm.backward(x, ctx, r, dx);
  check_fd(x, dx, objective, "dx");
  check_fd(norm.slot("weight").value, grad(norm, "weight"), objective, "dweight");
}

// ---- rotary -----------------------------------------------------------------------------------

TEST(LayerBackward, RotaryMatchesFiniteDifferences) {
  nn::RotaryApply rope;
  const int64_t b = 2, s = 3, d = 6;
  Tensor positions = Tensor::from_ints({0, 1, 2, 5, 6, 7}, {b, s});
  Tensor cos = Tensor::empty({b, s, d}, DType::F32), sin = Tensor::empty({b, s, d}, DType::F32);
  ops::rotary_tables(positions, d, 10000.0, 1.0f, cos, sin);
  Tensor q = randn({b, s, 2, d}), k = randn({b, s, 1, d});
  Tensor rq = randn(q.sizes()), rk = randn(k.sizes());
  auto objective = [&] {
    Tensor q2 = q.clone(), k2 = k.clone();
    rope.forward(q2, k2, cos, sin);
    return dot(q2, rq) + dot(k2, rk);
  };
  Tensor dq = rq.clone(), dk = rk.clone();
  nn::LayerContext ctx;
  rope.backward(cos, sin, ctx, dq, dk);
  check_fd(q, dq, objective, "dq");
  check_fd(k, dk, objective, "dk");
}

// ---- activations
// ---------------------------------------------------------------------------------

class ActivationBackward : public ::testing::TestWithParam<std::string> {};

TEST_P(ActivationBackward, GatedAndPlainMatchFiniteDifferences) {
  nn::Activation act(GetParam());
  Tensor gate = randn({3, 6}), up = randn({3, 6}), r = randn({3, 6});
  auto gated = [&] {
    Tensor out = like(gate);
    act.forward_mul(gate, up, out);
    return dot(out, r);
  };
  Tensor dgate = like(gate), dup = like(up);
  act.backward_mul(gate, up, r, dgate, dup);
  check_fd(gate, dgate, gated, "dgate");
  check_fd(up, dup, gated, "dup");
  auto plain = [&] {
    Tensor out = like(gate);
    act.forward(gate, out);
    return dot(out, r);
  };
  Tensor dx = like(gate);
  act.backward(gate, r, dx);
  check_fd(gate, dx, plain, "dx");
}

INSTANTIATE_TEST_SUITE_P(Kinds, ActivationBackward,
                         ::testing::Values("silu", "gelu", "gelu_pytorch_tanh"));

// ---- MLP ---------------------------------------------------------------------------------------

class MLPBackward : public ::testing::TestWithParam<std::tuple<bool, std::string>> {};

TEST_P(MLPBackward, MatchesFiniteDifferences) {
  const auto [bias, act] = GetParam();
  nn::MLP mlp("MLP", 8, 6, bias, act);
  for (auto* lin : {mlp.gate_proj.get(), mlp.up_proj.get(), mlp.down_proj.get()}) {
    set_param(*lin, "weight", randn(lin->slot("weight").shape, 0.5));
    if (bias) set_param(*lin, "bias", randn(lin->slot("bias").shape, 0.1));
  }
  Tensor x = randn({2, 3, 8}), r = randn({2, 3, 8});
  auto objective = [&] {
    Tensor y = like(x);
    mlp.forward(x, y);
    return dot(y, r);
  };
  nn::LayerContext ctx;
  Tensor y = like(x);
  mlp.forward_train(x, y, ctx);
  EXPECT_NEAR(dot(y, r), objective(), 1e-12) << "forward_train must compute forward's output";
  Tensor dx = like(x);
  mlp.backward(x, ctx, r, dx);
  check_fd(x, dx, objective, "dx");
  for (auto* lin : {mlp.gate_proj.get(), mlp.up_proj.get(), mlp.down_proj.get()}) {
    check_fd(lin->slot("weight").value, grad(*lin, "weight"), objective, "dweight");
    if (bias) check_fd(lin->slot("bias").value, grad(*lin, "bias"), objective, "dbias");
  }
}

INSTANTIATE_TEST_SUITE_P(BiasAct, MLPBackward,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values("silu", "gelu_pytorch_tanh")));

// ---- attention
// -----------------------------------------------------------------------------------

class AttentionBackward : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(AttentionBackward, MatchesFiniteDifferences) {
  const auto [qk_norm, bias, padded] = GetParam();
  nn::AttentionShape shape{.hidden_size = 8,
                           .num_heads = 4,
                           .num_kv_heads = 2,
                           .head_dim = 4,
                           .bias = bias,
                           .qk_norm = qk_norm};
  nn::Attention attn("Attention", shape);
  std::vector<nn::Module*> params_of;
  for (auto* lin : {attn.q_proj.get(), attn.k_proj.get(), attn.v_proj.get(), attn.o_proj.get()}) {
    set_param(*lin, "weight", randn(lin->slot("weight").shape, 0.5));
    if (bias) set_param(*lin, "bias", randn(lin->slot("bias").shape, 0.1));
  }
  if (qk_norm) {
    set_param(*attn.q_norm, "weight", randn({4}, 0.1, 1.0));
    set_param(*attn.k_norm, "weight", randn({4}, 0.1, 1.0));
  }
  const int64_t b = 2, s = 5;
  Tensor positions = Tensor::from_ints({0, 1, 2, 3, 4, 0, 0, 0, 1, 2}, {b, s});
  Tensor cos = Tensor::empty({b, s, 4}, DType::F32), sin = Tensor::empty({b, s, 4}, DType::F32);
  ops::rotary_tables(positions, 4, 10000.0, 1.0f, cos, sin);
  Tensor key_start = Tensor::from_ints({0, 2}, {b}, DType::I32);
  nn::AttentionState state;
  state.cos = &cos.view();
  state.sin = &sin.view();
  state.key_start = padded ? &key_start.view() : nullptr;

  Tensor x = randn({b, s, 8}), r = randn({b, s, 8});
  auto objective = [&] {
    Tensor y = like(x);
    attn.forward(x, y, state);
    return dot(y, r);
  };
  nn::LayerContext ctx;
  Tensor y = like(x);
  attn.forward_train(x, y, state, ctx);
  EXPECT_NEAR(dot(y, r), objective(), 1e-12) << "forward_train must compute forward's output";
  Tensor dx = like(x);
  attn.backward(x, state, ctx, r, dx);
  check_fd(x, dx, objective, "dx");
  for (auto* lin : {attn.q_proj.get(), attn.k_proj.get(), attn.v_proj.get(), attn.o_proj.get()}) {
    check_fd(lin->slot("weight").value, grad(*lin, "weight"), objective, "dweight");
    if (bias) check_fd(lin->slot("bias").value, grad(*lin, "bias"), objective, "dbias");
  }
  if (qk_norm) {
    check_fd(attn.q_norm->slot("weight").value, grad(*attn.q_norm, "weight"), objective, "q_norm");
    check_fd(attn.k_norm->slot("weight").value, grad(*attn.k_norm, "weight"), objective, "k_norm");
  }
}

INSTANTIATE_TEST_SUITE_P(QkNormBiasPadding, AttentionBackward,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()));

TEST(LayerBackward, AttentionWithoutTrainingFormIsRefusedByName) {
  nn::register_attention_function("test-inference-only",
                                  [](const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&, const nn::AttentionCall&, Stream) {});
  nn::Attention attn(
      "Attention",
      nn::AttentionShape{.hidden_size = 8, .num_heads = 2, .num_kv_heads = 2, .head_dim = 4});
  for (auto* lin : {attn.q_proj.get(), attn.k_proj.get(), attn.v_proj.get(), attn.o_proj.get()})
    set_param(*lin, "weight", randn(lin->slot("weight").shape));
  attn.set_attn_implementation("test-inference-only");
  EXPECT_EQ(nn::attention_training("test-inference-only"), nullptr);
  ASSERT_NE(nn::attention_training("eager"), nullptr);
  ASSERT_NE(nn::attention_training("sdpa"), nullptr);
  Tensor positions = Tensor::from_ints({0, 1}, {1, 2});
  Tensor cos = Tensor::empty({1, 2, 4}, DType::F32), sin = Tensor::empty({1, 2, 4}, DType::F32);
  ops::rotary_tables(positions, 4, 10000.0, 1.0f, cos, sin);
  nn::AttentionState state;
  state.cos = &cos.view();
  state.sin = &sin.view();
  Tensor x = randn({1, 2, 8}), y = like(x);
  nn::LayerContext ctx;
  try {
    attn.forward_train(x, y, state, ctx);
    FAIL() << "expected a refusal";
  } catch (const Unsupported& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test-inference-only"), std::string::npos) << what;
    EXPECT_NE(what.find("eager"), std::string::npos) << what;
    EXPECT_NE(what.find("sdpa"), std::string::npos) << what;
  }
}

// ---- ForCausalLMLoss
// ------------------------------------------------------------------------------

class LossBackward : public ::testing::TestWithParam<int64_t> {};

TEST_P(LossBackward, MatchesFiniteDifferences) {
  nn::CausalLMLoss loss_fn;
  const nn::CausalLMLossOptions options{GetParam()};
  Tensor logits = randn({2, 4, 7});
  Tensor labels = Tensor::from_ints({3, 1, -100, 6, -100, 0, 2, 5}, {2, 4});
  auto objective = [&] {
    Tensor loss = Tensor::empty({1}, DType::F64);
    loss_fn.forward(logits, labels, loss, options);
    return loss.to_doubles()[0];
  };
  nn::LayerContext ctx;
  Tensor loss = Tensor::empty({1}, DType::F64);
  loss_fn.typed_impl().forward_train(loss_fn, logits, labels, loss, options, ctx, {});
  EXPECT_NEAR(loss.to_doubles()[0], objective(), 1e-12);
  Tensor dlogits = like(logits);
  loss_fn.typed_impl().backward(loss_fn, logits, labels, options, ctx, 1.0f, dlogits, {});
  check_fd(logits, dlogits, objective, "dlogits");
  // The last position predicts nothing: its gradient is zero.
  for (int64_t r = 0; r < 2; ++r)
    for (double g : dlogits.select(0, r).select(0, 3).contiguous().to_doubles()) EXPECT_EQ(g, 0.0);
}

INSTANTIATE_TEST_SUITE_P(NumItems, LossBackward, ::testing::Values(0, 5));

TEST(LayerBackward, ShiftLabelsPadsWithIgnoreIndex) {
  Tensor shifted = nn::shift_labels(Tensor::from_ints({1, 2, 3, 4, 5, 6}, {2, 3}, DType::I32));
  EXPECT_EQ(shifted.dtype(), DType::I64);
  EXPECT_EQ(shifted.to_int64s(), (std::vector<int64_t>{2, 3, -100, 5, 6, -100}));
}

TEST(LayerBackward, ContextCountsEachStorageOnce) {
  nn::LayerContext ctx;
  Tensor a = Tensor::empty({10}, DType::F32);
  ctx.save("a", a);
  ctx.save("a_view", a.slice(0, 2, 5));
  ctx.child("sub").save("again", a);
  ctx.child("sub").save("b", Tensor::empty({3}, DType::F64));
  EXPECT_EQ(ctx.bytes(), 40u + 24u);
  ctx.clear();
  EXPECT_EQ(ctx.bytes(), 0u);
  EXPECT_THROW(ctx.saved("a"), InvalidArgument);
}

}  // namespace
}  // namespace hk
