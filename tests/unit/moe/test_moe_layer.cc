// Unit tests of the MoE pieces: the config fields (Qwen3MoeConfig's names, defaults and the
// sparse-layer rule), the host routing (top-k order and ties, renormalisation, the canonical
// grouping), the built-in MoE block's backward and the load-balancing loss's gradient against
// central finite differences in f64, accumulation and frozen parameters, and the stacking of
// per-expert checkpoint keys (and its refusals).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/op_testing.h"
#include "hk/error.h"
#include "hk/model_config.h"
#include "hk/moe.h"
#include "models/qwen3_moe/stacked_experts.h"
#include "nn/moe_routing.h"

namespace hk {
namespace {

uint64_t next_seed() {
  static uint64_t seed = 101;
  return seed++;
}
Tensor randn(const Shape& shape, double scale = 1.0) {
  return test::random_tensor(shape, DType::F64, next_seed(), -scale, scale);
}
double dot(const Tensor& a, const Tensor& b) {
  return test::weighted_sum(a, b.to_doubles());
}
void check_fd(const Tensor& x, const Tensor& analytic, const std::function<double()>& objective,
              const std::string& what) {
  ASSERT_TRUE(analytic.defined()) << what;
  ASSERT_EQ(analytic.sizes(), x.sizes()) << what;
  const std::vector<double> a = analytic.to_doubles();
  const std::vector<double> numeric = test::numeric_gradient(x, objective, 1e-6);
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], numeric[i], 1e-7 + 1e-6 * std::abs(numeric[i])) << what << " element " << i;
}

// ---- config ------------------------------------------------------------------------------------

const char* kBase = R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 4, "num_attention_heads": 4)";

TEST(MoeConfig, Qwen3MoeDefaultsAndFields) {
  auto d = ModelConfig::from_json(std::string(R"({"model_type": "qwen3_moe", )") + kBase + "}");
  EXPECT_EQ(d.moe.num_experts, 128);  // Qwen3MoeConfig's defaults
  EXPECT_EQ(d.moe.num_experts_per_tok, 8);
  EXPECT_EQ(d.moe.moe_intermediate_size, 768);
  EXPECT_FALSE(d.moe.norm_topk_prob);
  EXPECT_EQ(d.moe.decoder_sparse_step, 1);
  EXPECT_DOUBLE_EQ(d.moe.router_aux_loss_coef, 0.001);
  EXPECT_FALSE(d.moe.output_router_logits);
  auto c = ModelConfig::from_json(std::string(R"({"model_type": "qwen3_moe", )") + kBase + R"(,
    "num_local_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
    "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [3],
    "router_aux_loss_coef": 0.05, "output_router_logits": true})");
  EXPECT_EQ(c.moe.num_experts, 6);
  EXPECT_EQ(c.moe.num_experts_per_tok, 3);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.moe.output_router_logits);
  // Qwen3MoeDecoderLayer: sparse when not mlp_only and (i + 1) % step == 0.
  EXPECT_FALSE(c.moe.is_sparse_layer(0));
  EXPECT_TRUE(c.moe.is_sparse_layer(1));
  EXPECT_FALSE(c.moe.is_sparse_layer(2));
  EXPECT_FALSE(c.moe.is_sparse_layer(3));  // mlp_only_layers
  auto dense = ModelConfig::from_json(std::string(R"({"model_type": "qwen3", )") + kBase + "}");
  EXPECT_EQ(dense.moe.num_experts, 0);
  EXPECT_FALSE(dense.moe.is_sparse_layer(0));
}

TEST(MoeConfig, BadFieldsAreNamed) {
  auto parse = [](const std::string& extra) {
    return ModelConfig::from_json(std::string(R"({"model_type": "qwen3_moe", )") + kBase + ", " +
                                  extra + "}");
  };
  for (const auto& [extra, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"("num_experts": 8, "num_experts_per_tok": 9)", "num_experts_per_tok"},
           {R"("num_experts": 8, "num_local_experts": 4)", "disagree"},
           {R"("decoder_sparse_step": 0)", "decoder_sparse_step"},
           {R"("mlp_only_layers": [1, "x"])", "mlp_only_layers"},
           {R"("num_experts": -1)", "num_experts"},
           {R"("moe_intermediate_size": 0)", "moe_intermediate_size"}}) {
    try {
      parse(extra);
      ADD_FAILURE() << extra << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

// ---- routing ---------------------------------------------------------------------------------

TEST(MoeRouting, TopKOrderTiesRenormalisationAndGrouping) {
  // Token 0: experts 2 and 0 tie on the largest logit; token 1: expert 3 wins.
  const std::vector<double> logits{1.0, -1.0, 1.0, 0.5, 0.0, 0.2, -0.3, 2.0};
  nn::moe::Routing r = nn::moe::route(logits, 2, 4, 2, /*norm=*/true, /*f32=*/false);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2, 3, 1}));  // ties: the lower index first
  EXPECT_NEAR(r.weights[0], 0.5, 1e-12);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-12);
  EXPECT_NEAR(r.weights[2] + r.weights[3], 1.0, 1e-12);
  EXPECT_GT(r.weights[2], r.weights[3]);
  // Canonical order: expert 0 (t0), expert 1 (t1), expert 2 (t0), expert 3 (t1).
  EXPECT_EQ(r.offsets, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r.sorted_token, (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(r.sorted_slot, (std::vector<int64_t>{0, 3, 1, 2}));
  for (size_t a = 0; a < r.position.size(); ++a)
    EXPECT_EQ(r.sorted_slot[r.position[a]], int64_t(a));
  nn::moe::Routing plain = nn::moe::route(logits, 2, 4, 2, /*norm=*/false, false);
  EXPECT_NEAR(plain.weights[0], plain.probs[0], 1e-15);  // without renormalisation: p itself
}

// ---- the built-in block's backward by finite differences (f64) ---------------------------------

struct BlockFd : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(BlockFd, EveryGradientMatchesFiniteDifferences) {
  const int64_t k = std::get<0>(GetParam());
  const bool norm = std::get<1>(GetParam());
  const int64_t T = 5, H = 6, E = 4, I = 3;
  nn::MoeMLP block(nn::MoeShape{H, E, k, I, norm, "silu", "Qwen3Moe"});
  block.gate->slot("weight").value = randn({E, H});
  block.experts->slot("gate_up_proj").value = randn({E, 2 * I, H}, 0.7);
  block.experts->slot("down_proj").value = randn({E, H, I}, 0.7);
  Tensor x = randn({T, H}), r = randn({T, H}), rl = randn({T, E}, 0.3);
  // L = Σ y·r + Σ logits·rl: the second term exercises drouter_logits.
  auto objective = [&] {
    Tensor y = Tensor::empty({T, H}, DType::F64);
    block.forward(x, y);
    Tensor logits = Tensor::empty({T, E}, DType::F64);
    ops::linear(x, block.gate->weight(), nullptr, logits);
    return dot(y, r) + dot(logits, rl);
  };
  block.train();
  nn::LayerContext ctx;
  Tensor y = Tensor::empty({T, H}, DType::F64), logits = Tensor::empty({T, E}, DType::F64);
  block.forward_train(x, y, logits, ctx);
  Tensor dx = Tensor::zeros({T, H}, DType::F64);
  block.backward(x, ctx, r, &rl, dx);
  check_fd(x, dx, objective, "dx");
  check_fd(block.gate->slot("weight").value, block.gate->slot("weight").grad, objective, "router");
  check_fd(block.experts->slot("gate_up_proj").value, block.experts->slot("gate_up_proj").grad,
           objective, "gate_up_proj");
  check_fd(block.experts->slot("down_proj").value, block.experts->slot("down_proj").grad, objective,
           "down_proj");

  // A second backward adds into every gradient.
  const std::vector<double> g1 = block.experts->slot("down_proj").grad.to_doubles();
  nn::LayerContext ctx2;
  block.forward_train(x, y, logits, ctx2);
  block.backward(x, ctx2, r, &rl, dx);
  const std::vector<double> g2 = block.experts->slot("down_proj").grad.to_doubles();
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g2[i], 2 * g1[i], 1e-12);
}

INSTANTIATE_TEST_SUITE_P(TopK, BlockFd,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()));

TEST(MoeBlock, FrozenExpertsGetNoGradientAndAnImplWithoutBackwardIsRefused) {
  nn::MoeMLP block(nn::MoeShape{4, 3, 2, 2, true, "silu", "Qwen3Moe"});
  block.gate->slot("weight").value = randn({3, 4});
  block.experts->slot("gate_up_proj").value = randn({3, 4, 4});
  block.experts->slot("down_proj").value = randn({3, 4, 2});
  block.experts->slot("gate_up_proj").requires_grad = false;
  Tensor x = randn({3, 4}), y = Tensor::empty({3, 4}, DType::F64),
         logits = Tensor::empty({3, 3}, DType::F64), dx = Tensor::empty({3, 4}, DType::F64);
  nn::LayerContext ctx;
  block.forward_train(x, y, logits, ctx);
  block.backward(x, ctx, randn({3, 4}), nullptr, dx);
  EXPECT_FALSE(block.experts->slot("gate_up_proj").grad.defined());
  EXPECT_TRUE(block.experts->slot("down_proj").grad.defined());
  EXPECT_TRUE(block.gate->slot("weight").grad.defined());

  struct InferenceOnly final : nn::MoeMLPImpl {
    std::string name() const override { return "inference-only"; }
    void forward(const nn::MoeMLP&, const TensorView&, const TensorView&, Stream) const override {}
  };
  block.set_impl(std::make_shared<InferenceOnly>());
  EXPECT_FALSE(block.impl()->supports_training());
  nn::LayerContext c3;
  EXPECT_THROW(block.forward_train(x, y, logits, c3), Unsupported);
}

// ---- the load-balancing loss -------------------------------------------------------------------

TEST(MoeAuxLoss, ValueAndGradientMatchTheFormulaAndFiniteDifferences) {
  const int64_t B = 2, S = 3, E = 5, k = 2;
  std::vector<Tensor> logits{randn({B * S, E}, 2.0), randn({B * S, E}, 2.0)};
  const std::vector<int64_t> pad{0, 1};  // row 1's first position is padding
  const double scale = 0.7;
  nn::LoadBalancingLoss lb = nn::load_balancing_loss(logits, k, pad, S, scale);
  // By hand: counts and probabilities over both layers' non-padding rows.
  std::vector<double> count(E, 0), prob(E, 0);
  double rows = 0;
  for (const Tensor& l : logits) {
    const std::vector<double> p = nn::moe::softmax_rows(l.to_doubles(), B * S, E, false);
    for (int64_t r = 0; r < B * S; ++r) {
      if (r % S < pad[r / S]) continue;
      std::vector<int32_t> ids(k);
      nn::moe::top_k_row(&p[r * E], E, k, ids.data());
      for (int32_t e : ids) count[e] += 1;
      for (int64_t e = 0; e < E; ++e) prob[e] += p[r * E + e];
      rows += 1;
    }
  }
  double want = 0;
  for (int64_t e = 0; e < E; ++e) want += (count[e] / rows) * (prob[e] / rows);
  EXPECT_NEAR(lb.value, E * want, 1e-12);
  // The gradient (top-k choices held fixed, as autograd holds them) by finite differences.
  for (size_t l = 0; l < logits.size(); ++l)
    check_fd(
        logits[l], lb.grads[l],
        [&] { return scale * nn::load_balancing_loss(logits, k, pad, S, 1.0).value; },
        "layer " + std::to_string(l));
}

// ---- per-expert checkpoints --------------------------------------------------------------------

std::map<std::string, Tensor> per_expert(int64_t E, int64_t I, int64_t H) {
  std::map<std::string, Tensor> m;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    m[p + "gate_proj.weight"] = randn({I, H});
    m[p + "up_proj.weight"] = randn({I, H});
    m[p + "down_proj.weight"] = randn({H, I});
  }
  m["model.layers.0.mlp.gate.weight"] = randn({E, H});
  return m;
}

TEST(StackedExperts, StacksGateThenUpAndPassesTheRestThrough) {
  auto m = per_expert(3, 2, 4);
  nn::TensorMapSource base(m, "test checkpoint");
  StackedExpertsSource s(base);
  EXPECT_EQ(s.num_stacked(), 2u);
  EXPECT_EQ(s.shape("model.layers.0.mlp.experts.gate_up_proj"), (Shape{3, 4, 4}));
  EXPECT_EQ(s.shape("model.layers.0.mlp.experts.down_proj"), (Shape{3, 4, 2}));
  EXPECT_EQ(s.shape("model.layers.0.mlp.gate.weight"), (Shape{3, 4}));
  Tensor gu = s.load("model.layers.0.mlp.experts.gate_up_proj", Device::cpu(), std::nullopt, {});
  for (int64_t e = 0; e < 3; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    EXPECT_EQ(gu.select(0, e).slice(0, 0, 2).contiguous().to_doubles(),
              m[p + "gate_proj.weight"].to_doubles());
    EXPECT_EQ(gu.select(0, e).slice(0, 2, 4).contiguous().to_doubles(),
              m[p + "up_proj.weight"].to_doubles());
  }
  size_t per_expert_keys = 0;
  for (const std::string& k : s.keys())
    per_expert_keys += k.find(".experts.0.") != std::string::npos;
  EXPECT_EQ(per_expert_keys, 0u);
}

TEST(StackedExperts, RefusesIncompleteOrMixedLayouts) {
  auto expect_refusal = [](std::map<std::string, Tensor> m, const std::string& needle) {
    nn::TensorMapSource base(std::move(m), "test checkpoint");
    try {
      StackedExpertsSource s(base);
      ADD_FAILURE() << "accepted; expected a message with '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto m = per_expert(3, 2, 4);
  m.erase("model.layers.0.mlp.experts.1.down_proj.weight");
  expect_refusal(m, "experts.1.down_proj.weight");
  m = per_expert(3, 2, 4);
  m.erase("model.layers.0.mlp.experts.2.gate_proj.weight");
  m.erase("model.layers.0.mlp.experts.2.up_proj.weight");
  m.erase("model.layers.0.mlp.experts.2.down_proj.weight");
  m["model.layers.0.mlp.experts.3.gate_proj.weight"] = randn({2, 4});
  m["model.layers.0.mlp.experts.3.up_proj.weight"] = randn({2, 4});
  m["model.layers.0.mlp.experts.3.down_proj.weight"] = randn({4, 2});
  expect_refusal(m, "missing");  // experts 0, 1, 3: expert 2 is absent
  m = per_expert(2, 2, 4);
  m["model.layers.0.mlp.experts.1.up_proj.weight"] = randn({3, 4});
  expect_refusal(m, "differ from expert 0");
  m = per_expert(2, 2, 4);
  m["model.layers.0.mlp.experts.gate_up_proj"] = randn({2, 4, 4});
  expect_refusal(m, "keep one layout");
}

}  // namespace
}  // namespace hk
