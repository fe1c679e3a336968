// AdamW, clip_grad_norm and the decay rule against torch (tests/fixtures/train/optim.json, made by
// tools/fixtures/make_trainer_fixtures.py), plus the 16-bit and master-weight recipes.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "hk/dtype.h"
#include "hk/error.h"
#include "hk/optim.h"
#include "train_test_util.h"

namespace hk {
namespace {

std::vector<float> floats(const nlohmann::json& j) {
  return j.get<std::vector<float>>();
}

TEST(AdamW, MatchesTorchOverFourStepsWithDecayGroups) {
  const auto ref = test::read_json(test::train_fixture("optim.json"));
  Tensor w = Tensor::from_floats(floats(ref["w0"]), {3, 5});
  Tensor b = Tensor::from_floats(floats(ref["b0"]), {5});
  Tensor gw, gb;
  // One AdamW per group so each group has its own weight decay, as torch's param_groups do.
  optim::AdamW opt_w({{"w", &w, &gw, true}}, {.weight_decay = 0.1});
  optim::AdamW opt_b({{"b", &b, &gb, false}}, {.weight_decay = 0.1});
  for (size_t s = 0; s < ref["grads"].size(); ++s) {
    gw = Tensor::from_floats(floats(ref["grads"][s]["w"]), {3, 5});
    gb = Tensor::from_floats(floats(ref["grads"][s]["b"]), {5});
    opt_w.step(0.01);
    opt_b.step(0.01);
    const auto ew = floats(ref["steps"][s]["w"]), eb = floats(ref["steps"][s]["b"]);
    const auto aw = w.to_doubles(), ab = b.to_doubles();
    for (size_t i = 0; i < ew.size(); ++i)
      EXPECT_NEAR(aw[i], ew[i], 2e-7 * std::max(1.0f, std::fabs(ew[i])))
          << "step " << s << " w" << i;
    for (size_t i = 0; i < eb.size(); ++i)
      EXPECT_NEAR(ab[i], eb[i], 2e-7 * std::max(1.0f, std::fabs(eb[i])))
          << "step " << s << " b" << i;
  }
  EXPECT_EQ(opt_w.steps(), 4);
}

TEST(AdamW, UndefinedGradientIsSkipped) {
  Tensor w = Tensor::from_floats({1, 2, 3}, {3});
  Tensor g;
  optim::AdamW opt({{"w", &w, &g, true}}, {.weight_decay = 0.5});
  opt.step(0.1);
  EXPECT_EQ(w.to_doubles(), (std::vector<double>{1, 2, 3}));
}

TEST(AdamW, Bf16ParametersAndMomentsRoundOnceFromF32Math) {
  const std::vector<float> p0 = {0.5f, -1.25f, 3.0f, 0.001f};
  const std::vector<float> g0 = {0.1f, -0.2f, 0.3f, -0.4f};
  Tensor p32 = Tensor::from_floats(p0, {4}), g32 = Tensor::from_floats(g0, {4});
  Tensor p16 = Tensor::from_floats(p0, {4}, DType::BF16),
         g16 = Tensor::from_floats(g0, {4}, DType::BF16);
  optim::AdamW a32({{"p", &p32, &g32, true}}, {.weight_decay = 0.01});
  optim::AdamW a16({{"p", &p16, &g16, true}}, {.weight_decay = 0.01});
  a32.step(1e-2);
  a16.step(1e-2);
  EXPECT_EQ(a16.state()[0].second.dtype(), DType::BF16);  // moments in the parameter dtype
  const auto r32 = p32.to_doubles(), r16 = p16.to_doubles();
  for (size_t i = 0; i < p0.size(); ++i)  // the f32 result rounded once (inputs are bf16-exact)
    EXPECT_EQ(r16[i], round_to(DType::BF16, static_cast<float>(r32[i]))) << i;
}

TEST(AdamW, MasterWeightsKeepF32AndRefreshTheModelCopy) {
  const std::vector<float> p0 = {0.5f, -1.25f, 3.0f};
  Tensor model = Tensor::from_floats(p0, {3}, DType::BF16);
  Tensor grad = Tensor::from_floats({1e-3f, -2e-3f, 5e-4f}, {3}, DType::F32);
  optim::AdamW opt({{"p", &model, &grad, true}}, {.weight_decay = 0.0, .master_weights = true});
  for (int i = 0; i < 5; ++i) opt.step(1e-4);
  Tensor master;
  for (auto& [name, t] : opt.state())
    if (name == "master.p") master = t;
  ASSERT_TRUE(master.defined());
  EXPECT_EQ(master.dtype(), DType::F32);
  const auto m = master.to_doubles(), b = model.to_doubles();
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_EQ(b[i], round_to(DType::BF16, static_cast<float>(m[i])));
    // 5 updates of ~1e-4 are below one bf16 step at these magnitudes: the master must move anyway.
    EXPECT_NE(m[i], p0[i]);
  }
}

TEST(AdamW, StateRoundTripsAndLoadChecksNames) {
  Tensor w = Tensor::from_floats({1, 2}, {2}), g = Tensor::from_floats({0.5, -0.5}, {2});
  optim::AdamW a({{"w", &w, &g, true}}, {});
  a.step(0.1);
  a.step(0.1);
  Tensor w2 = w.clone();
  Tensor g2 = g.clone();
  optim::AdamW b({{"w", &w2, &g2, true}}, {});
  std::vector<std::pair<std::string, Tensor>> saved;
  for (auto& [n, t] : a.state()) saved.emplace_back(n, t.clone());
  b.load_state(saved, a.steps());
  a.step(0.1);
  b.step(0.1);
  EXPECT_EQ(w.to_doubles(), w2.to_doubles());
  EXPECT_THROW(b.load_state({{"exp_avg.other", saved[0].second}}, 1), InvalidArgument);
  EXPECT_THROW(
      b.load_state(
          {{"exp_avg.w", Tensor::zeros({3}, DType::F32)}, {"exp_avg_sq.w", saved[1].second}}, 1),
      InvalidArgument);
}

TEST(AdamW, RejectsBadHyperparametersAndUnloadedParameters) {
  Tensor w = Tensor::from_floats({1}, {1}), g;
  EXPECT_THROW(optim::AdamW({{"w", &w, &g, true}}, {.beta1 = 1.0}), InvalidArgument);
  EXPECT_THROW(optim::AdamW({{"w", &w, &g, true}}, {.eps = -1}), InvalidArgument);
  Tensor empty;
  EXPECT_THROW(optim::AdamW({{"w", &empty, &g, true}}, {}), InvalidArgument);
  Tensor ids = Tensor::from_ints({1, 2}, {2});
  EXPECT_THROW(optim::AdamW({{"ids", &ids, &g, true}}, {}), InvalidArgument);
}

TEST(ClipGradNorm, MatchesTorchAndClipsThroughTheStep) {
  const auto ref = test::read_json(test::train_fixture("optim.json"))["clip"];
  Tensor w = Tensor::zeros({3, 5}, DType::F32), b = Tensor::zeros({5}, DType::F32);
  Tensor gw = Tensor::from_floats(floats(ref["grads_w"]), {3, 5});
  Tensor gb = Tensor::from_floats(floats(ref["grads_b"]), {5});
  std::vector<optim::OptimTensor> ts = {{"w", &w, &gw, true}, {"b", &b, &gb, false}};
  optim::GradNorm n = optim::clip_grad_norm(ts, 1.0);
  const double norm = n.norm.to_doubles()[0], coef = n.clip_coef.to_doubles()[0];
  EXPECT_NEAR(norm, ref["norm"].get<double>(), 1e-5 * norm);
  EXPECT_NEAR(coef, 1.0 / (norm + 1e-6), 1e-7);
  // torch's clipped gradient = g · coef: what AdamW sees through grad_scale.
  const auto clipped = floats(ref["clipped_w"]);
  const auto g = gw.to_doubles();
  for (size_t i = 0; i < clipped.size(); ++i)
    EXPECT_NEAR(static_cast<float>(g[i]) * static_cast<float>(coef), clipped[i], 1e-6) << i;
  EXPECT_EQ(optim::clip_grad_norm(ts, 0.0).clip_coef.to_doubles()[0], 1.0);  // off
  EXPECT_EQ(optim::clip_grad_norm(ts, 1e9).clip_coef.to_doubles()[0], 1.0);  // below the limit
}

TEST(ClipGradNorm, OptimizerMemberEqualsTheFreeFunction) {
  Tensor w = Tensor::zeros({2}, DType::F32), g = Tensor::from_floats({3, 4}, {2});
  Tensor b = Tensor::zeros({1}, DType::BF16), gb = Tensor::from_floats({12}, {1}, DType::BF16);
  std::vector<optim::OptimTensor> ts = {{"w", &w, &g, true}, {"b", &b, &gb, false}};
  optim::AdamW opt(ts, {});
  const auto member = opt.clip_grad_norm(1.0), free = optim::clip_grad_norm(ts, 1.0);
  EXPECT_EQ(member.norm.to_doubles(), free.norm.to_doubles());
  EXPECT_EQ(member.clip_coef.to_doubles(), free.clip_coef.to_doubles());
  EXPECT_NEAR(member.norm.to_doubles()[0], 13.0, 1e-5);
}

TEST(ClipGradNorm, SkipsUndefinedGradients) {
  Tensor w = Tensor::zeros({2}, DType::F32), g = Tensor::from_floats({3, 4}, {2});
  Tensor w2 = Tensor::zeros({2}, DType::F32), g2;
  auto n = optim::clip_grad_norm({{"w", &w, &g, true}, {"w2", &w2, &g2, true}}, 1.0);
  EXPECT_NEAR(n.norm.to_doubles()[0], 5.0, 1e-6);
}

TEST(DecayGroups, FollowTrainerGetDecayParameterNames) {
  // Names of the fixtures' models (and a few constructed ones), with Transformers' verdict.
  const std::pair<const char*, bool> cases[] = {
      {"model.embed_tokens.weight", false},
      {"model.layers.0.self_attn.q_proj.weight", false},
      {"model.layers.0.self_attn.q_proj.bias", true},
      {"model.layers.0.self_attn.q_norm.weight", true},
      {"model.layers.0.self_attn.k_norm.weight", true},
      {"model.layers.0.input_layernorm.weight", true},
      {"model.layers.0.post_attention_layernorm.weight", true},
      {"model.layers.0.mlp.down_proj.bias", true},
      {"model.norm.weight", true},
      {"lm_head.weight", false},
      {"model.normalizer.weight", false},  // "norm" must be a whole segment
      {"model.enorm.weight", false},
      {"model.final_norm.weight", true},
      {"model.RMSNorm_x.weight", true},  // case-insensitive
  };
  for (const auto& [name, excluded] : cases)
    EXPECT_EQ(optim::excluded_from_weight_decay(name), excluded) << name;
  EXPECT_TRUE(optim::excluded_from_weight_decay("model.ln.weight", "LayerNorm"));
}

TEST(DecayGroups, FixtureDecayListsAgree) {
  for (const char* g : {"golden-qwen3-b2.json", "golden-llama-b2.json"}) {
    const auto ref = test::read_json(test::train_fixture(g));
    std::set<std::string> decay(ref["decay_parameters"].begin(), ref["decay_parameters"].end());
    ASSERT_FALSE(decay.empty());
    for (const auto& name : decay)
      EXPECT_FALSE(optim::excluded_from_weight_decay(name)) << g << ": " << name;
  }
}

}  // namespace
}  // namespace hk
