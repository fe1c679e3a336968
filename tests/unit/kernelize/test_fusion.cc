// Fusion and layouts in general, on cpu with the test kernels of repos/layout_test_kernels.cc:
// every pair of adjacent modules the Qwen3 and Llama trees let hk fuse, each through
// from_pretrained (the layout re-declared before the checkpoint loads) with the logits of the
// unfused model and the same peak host memory as the unfused load; kernelize after the load
// (converted in place, originals released, reverted exactly); stateful kernels for RMSNorm, Linear
// and MLP; training through layouts (gradients reach the layouts' parameters); Transformers'
// class names as keys; and the fusions hk refuses, with their reasons.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "hk/allocator.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"
#include "hk/models.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
std::string model_dir(const std::string& name) {
  return (fs::path(env("HK_SOURCE_DIR")) / "tests/fixtures/models" / name).string();
}
const char* kRepo = "kernels-community/layout-test-kernels:";

using Pattern = std::pair<std::string, std::string>;
FusionRule rule(std::vector<Pattern> modules, const std::string& entry) {
  FusionRule r;
  r.modules = std::move(modules);
  r.kernel.spec = kRepo + entry;
  return r;
}
KernelConfig fusion_config(std::vector<FusionRule> rules) {
  KernelConfig c;
  c.inherit_mapping = false;  // only the fusion: every other layer stays built-in
  c.fusions = std::move(rules);
  return c;
}

class Fusion : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* v : {"USE_HUB_KERNELS", "HK_ENDPOINT", "LOCAL_KERNELS", "HK_TRUSTED_ORGS"})
      unsetenv(v);
    // the test kernels first, then the embedded hub (liger-kernels' fused RMSNorm → SwiGLU MLP)
    const fs::path bin = env("HK_BINARY_DIR");
    setenv("HK_HUB_DIR",
           ((bin / "kernelize-test-hub").string() + ":" + (bin / "hub").string()).c_str(), 1);
    setenv("HK_KERNELS_CACHE",
           (fs::temp_directory_path() / ("hk-fusion-cache-" + std::to_string(getpid()))).c_str(),
           1);
  }
  static void TearDownTestSuite() { fs::remove_all(env("HK_KERNELS_CACHE")); }

  struct Loaded {
    CausalLM model;
    size_t peak = 0;  // host bytes the load allocated at its peak
  };
  // from_pretrained in f32 (the test kernels' dtype; the Llama fixture is stored in bf16).
  static Loaded load(const std::string& name, std::optional<KernelConfig> config = std::nullopt,
                     DType dtype = DType::F32) {
    LoadOptions o;
    o.dtype = dtype;
    o.kernel_config = std::move(config);
    reset_peak_memory_stats(Device::cpu());
    const size_t before = memory_stats(Device::cpu()).allocated;
    Loaded out;
    out.model = AutoModelForCausalLM::from_pretrained(model_dir(name), o);
    out.peak = memory_stats(Device::cpu()).peak_allocated - before;
    return out;
  }
  static std::vector<double> logits(const CausalLM& m) {
    return m.forward(Tensor::from_ints({1, 5, 9, 42, 7, 3, 11, 2}, {2, 4})).logits.to_doubles();
  }
  static void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                           double tol = 2e-5) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol + tol * std::fabs(want[i])) << i;
  }
  static std::set<std::string> parameter_names(const CausalLM& m) {
    std::set<std::string> out;
    for (auto& [name, p] : m.named_parameters()) out.insert(name);
    return out;
  }
  static const LayerDecision& decision(const CausalLM& m, const std::string& path) {
    const LayerDecision* d = m.kernelize_report()->find(path);
    if (!d) throw NotFound("no decision for " + path);
    return *d;
  }
  static KernelizeOptions kernelize_options(const CausalLM& m, KernelConfig config) {
    KernelizeOptions k;
    k.device = m.device();
    k.dtype = m.dtype();
    k.config = std::move(config);
    return k;
  }
};

struct PairCase {
  std::string model;
  std::vector<Pattern> modules;
  std::string entry;
  std::vector<std::string> made;     // parameters of layer 0 the layout adds
  std::vector<std::string> removed;  // ... and the ones it takes out
};

// Every pair (and the q/k/v triple) of adjacent modules under one parent that hk fuses, per tree.
std::vector<PairCase> pair_cases() {
  const std::string L = "model.layers.0.";
  return {
      // Qwen3: post_attention_layernorm → mlp, gate ‖ up, q ‖ k, k ‖ v, q ‖ k ‖ v, q → q_norm,
      // k → k_norm
      {"qwen3-tiny",
       {{"RMSNorm", "model.layers.*.post_attention_layernorm"}, {"MLP", "model.layers.*.mlp"}},
       "RMSNormMLP",
       {L + "mlp.gate_up_proj.weight"},
       {L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"}},
      {"qwen3-tiny",
       {{"Linear", "model.layers.*.mlp.gate_proj"}, {"Linear", "model.layers.*.mlp.up_proj"}},
       "GateUpProj",
       {L + "mlp.gate_up_proj.weight"},
       {L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"}},
      {"qwen3-tiny",
       {{"Linear", "model.layers.*.self_attn.q_proj"},
        {"Linear", "model.layers.*.self_attn.k_proj"}},
       "QKProj",
       {L + "self_attn.qk_proj.weight"},
       {L + "self_attn.q_proj.weight", L + "self_attn.k_proj.weight"}},
      {"qwen3-tiny",
       {{"Linear", "model.layers.*.self_attn.k_proj"},
        {"Linear", "model.layers.*.self_attn.v_proj"}},
       "KVProj",
       {L + "self_attn.kv_proj.weight"},
       {L + "self_attn.k_proj.weight", L + "self_attn.v_proj.weight"}},
      {"qwen3-tiny",
       {{"Linear", "model.layers.*.self_attn.q_proj"},
        {"Linear", "model.layers.*.self_attn.k_proj"},
        {"Linear", "model.layers.*.self_attn.v_proj"}},
       "QKVProj",
       {L + "self_attn.qkv_proj.weight"},
       {L + "self_attn.q_proj.weight", L + "self_attn.v_proj.weight"}},
      {"qwen3-tiny",
       {{"Linear", "model.layers.*.self_attn.q_proj"},
        {"RMSNorm", "model.layers.*.self_attn.q_norm"}},
       "QNormProj",
       {L + "self_attn.q_proj.head_norm_weight", L + "self_attn.q_proj.weight"},
       {L + "self_attn.q_norm.weight"}},
      {"qwen3-tiny",
       {{"Linear", "model.layers.*.self_attn.k_proj"},
        {"RMSNorm", "model.layers.*.self_attn.k_norm"}},
       "KNormProj",
       {L + "self_attn.k_proj.head_norm_weight"},
       {L + "self_attn.k_norm.weight"}},
      // Llama (attention_bias, mlp_bias): the same pairs with their biases; no q/k norms
      {"llama-tiny-bf16",
       {{"RMSNorm", "model.layers.*.post_attention_layernorm"}, {"MLP", "model.layers.*.mlp"}},
       "RMSNormMLPBias",
       {L + "mlp.gate_up_proj.weight", L + "mlp.gate_up_proj.bias"},
       {L + "mlp.gate_proj.weight", L + "mlp.up_proj.bias"}},
      {"llama-tiny-bf16",
       {{"Linear", "model.layers.*.mlp.gate_proj"}, {"Linear", "model.layers.*.mlp.up_proj"}},
       "GateUpProjBias",
       {L + "mlp.gate_up_proj.weight", L + "mlp.gate_up_proj.bias"},
       {L + "mlp.gate_proj.bias", L + "mlp.up_proj.weight"}},
      {"llama-tiny-bf16",
       {{"Linear", "model.layers.*.self_attn.q_proj"},
        {"Linear", "model.layers.*.self_attn.k_proj"}},
       "QKProjBias",
       {L + "self_attn.qk_proj.weight", L + "self_attn.qk_proj.bias"},
       {L + "self_attn.q_proj.weight", L + "self_attn.k_proj.bias"}},
      {"llama-tiny-bf16",
       {{"Linear", "model.layers.*.self_attn.k_proj"},
        {"Linear", "model.layers.*.self_attn.v_proj"}},
       "KVProjBias",
       {L + "self_attn.kv_proj.weight", L + "self_attn.kv_proj.bias"},
       {L + "self_attn.v_proj.weight"}},
      {"llama-tiny-bf16",
       {{"Linear", "model.layers.*.self_attn.q_proj"},
        {"Linear", "model.layers.*.self_attn.k_proj"},
        {"Linear", "model.layers.*.self_attn.v_proj"}},
       "QKVProjBias",
       {L + "self_attn.qkv_proj.weight", L + "self_attn.qkv_proj.bias"},
       {L + "self_attn.k_proj.weight", L + "self_attn.v_proj.bias"}},
  };
}

TEST_F(Fusion, EveryAdjacentPairOfBothTreesLoadsFusedWithTheUnfusedLogitsAndPeakMemory) {
  std::map<std::string, Loaded> unfused;
  std::map<std::string, std::vector<double>> reference;
  for (const std::string name : {"qwen3-tiny", "llama-tiny-bf16"}) {
    unfused[name] = load(name);
    reference[name] = logits(unfused[name].model);
  }
  for (const PairCase& c : pair_cases()) {
    SCOPED_TRACE(c.model + ": " + c.entry);
    Loaded fused = load(c.model, fusion_config({rule(c.modules, c.entry)}));
    // every member of every layer's group is bound to the kernel, its layout declared before the
    // checkpoint loaded
    for (const std::string layer : {"0", "1"})
      for (const Pattern& m : c.modules) {
        std::string path = m.second;
        path.replace(path.find('*'), 1, layer);
        const LayerDecision& d = decision(fused.model, path);
        EXPECT_EQ(d.kernel, kRepo + c.entry) << path << ": " << d.reason;
        EXPECT_NE(d.reason.find("declared before the checkpoint loads"), std::string::npos)
            << d.reason;
      }
    const auto names = parameter_names(fused.model);
    for (const std::string& p : c.made) EXPECT_TRUE(names.count(p)) << p;
    for (const std::string& p : c.removed) EXPECT_FALSE(names.count(p)) << p;
    expect_close(logits(fused.model), reference[c.model]);
    // one copy of the weights: the load peaks where the unfused load does
    EXPECT_EQ(fused.peak, unfused[c.model].peak);
    EXPECT_EQ(fused.model.module().num_parameters(),
              unfused[c.model].model.module().num_parameters());
  }
}

TEST_F(Fusion, KernelizeAfterTheLoadConvertsInPlaceAndRevertsExactly) {
  Loaded loaded = load("qwen3-tiny");
  CausalLM& m = loaded.model;
  const auto reference = logits(m);
  const auto names = parameter_names(m);
  const size_t allocated = memory_stats(Device::cpu()).allocated;
  const KernelConfig config = fusion_config(
      {rule({{"RMSNorm", "model.layers.*.post_attention_layernorm"}, {"MLP", "model.layers.*.mlp"}},
            "RMSNormMLP"),
       rule({{"Linear", "model.layers.*.self_attn.q_proj"},
             {"Linear", "model.layers.*.self_attn.k_proj"},
             {"Linear", "model.layers.*.self_attn.v_proj"}},
            "QKVProj")});
  auto report = kernelize(m.module(), Mode::Inference, kernelize_options(m, config));
  const LayerDecision* d = report.find("model.layers.1.mlp");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kernel, std::string(kRepo) + "RMSNormMLP") << d->reason;
  EXPECT_NE(d->reason.find("converted in place"), std::string::npos) << d->reason;
  EXPECT_TRUE(parameter_names(m).count("model.layers.1.self_attn.qkv_proj.weight"));
  EXPECT_FALSE(parameter_names(m).count("model.layers.1.self_attn.q_proj.weight"));
  // the originals were released: the concatenated weights take exactly their place
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, allocated);
  expect_close(logits(m), reference);
  // the same config again changes nothing
  report = kernelize(m.module(), Mode::Inference, kernelize_options(m, config));
  EXPECT_NE(report.find("model.layers.1.mlp")->reason.find("already in place"), std::string::npos);
  // back to built-in: the original parameters, the same values, the same memory
  KernelConfig none;
  none.inherit_mapping = false;
  kernelize(m.module(), Mode::Inference, kernelize_options(m, none));
  EXPECT_EQ(parameter_names(m), names);
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, allocated);
  EXPECT_EQ(logits(m), reference);
}

TEST_F(Fusion, StatefulKernelsForRMSNormLinearAndMLP) {
  Loaded unfused = load("qwen3-tiny");
  const auto reference = logits(unfused.model);
  struct Case {
    std::string layer, entry, path, made, removed;
  };
  for (const Case& c : std::vector<Case>{
           {"RMSNorm", "ScaledRMSNorm", "model.layers.0.input_layernorm", "scale", "weight"},
           {"Linear", "TransposedLinear", "model.layers.1.self_attn.o_proj", "weight_t", "weight"},
           {"MLP", "GateUpMLP", "model.layers.0.mlp", "gate_up_proj.weight", "gate_proj.weight"}}) {
    SCOPED_TRACE(c.entry);
    KernelConfig config{{{c.layer, kRepo + c.entry}}};
    config.inherit_mapping = false;
    Loaded stateful = load("qwen3-tiny", config);
    const LayerDecision& d = decision(stateful.model, c.path);
    EXPECT_EQ(d.kernel, kRepo + c.entry) << d.reason;
    EXPECT_NE(d.reason.find("layout " + c.entry + "Layout, declared before the checkpoint loads"),
              std::string::npos)
        << d.reason;
    const auto names = parameter_names(stateful.model);
    EXPECT_TRUE(names.count(c.path + "." + c.made));
    EXPECT_FALSE(names.count(c.path + "." + c.removed));
    expect_close(logits(stateful.model), reference);
    EXPECT_EQ(stateful.peak, unfused.peak);
  }
  // lm_head shares its weight with the embedding (tie_word_embeddings): not converted, and said so
  KernelConfig config{{{"Linear", std::string(kRepo) + "TransposedLinear"}}};
  config.inherit_mapping = false;
  Loaded tied = load("qwen3-tiny", config);
  const LayerDecision& head = decision(tied.model, "lm_head");
  EXPECT_TRUE(head.kernel.empty());
  EXPECT_NE(head.reason.find("tied"), std::string::npos) << head.reason;
  // Llama's projections have biases, which TransposedLinearLayout does not hold
  Loaded llama = load("llama-tiny-bf16", config);
  const LayerDecision& q = decision(llama.model, "model.layers.0.self_attn.q_proj");
  EXPECT_TRUE(q.kernel.empty());
  EXPECT_NE(q.reason.find("does not hold the parameter 'bias'"), std::string::npos) << q.reason;
}

// Gradients through layouts: a stateful RMSNorm ("scale"), the RMSNorm → MLP fusion and the
// q/k/v group, all with a backward, against the unfused model's gradients.
TEST_F(Fusion, TrainingThroughLayoutsGivesTheLayoutParametersTheirGradients) {
  KernelConfig config = fusion_config(
      {rule({{"RMSNorm", "model.layers.*.post_attention_layernorm"}, {"MLP", "model.layers.*.mlp"}},
            "RMSNormMLP"),
       rule({{"Linear", "model.layers.*.self_attn.q_proj"},
             {"Linear", "model.layers.*.self_attn.k_proj"},
             {"Linear", "model.layers.*.self_attn.v_proj"}},
            "QKVProj")});
  config.kernel_mapping["RMSNorm"] = std::string(kRepo) + "ScaledRMSNorm";
  Loaded fused = load("qwen3-tiny", config);
  Loaded plain = load("qwen3-tiny");
  fused.model.train();
  plain.model.train();
  const KernelizeReport& t = *fused.model.kernelize_report();
  EXPECT_EQ(t.mode, Mode::Training);
  for (const char* p : {"model.layers.0.mlp", "model.layers.0.self_attn.v_proj",
                        "model.layers.0.input_layernorm", "model.norm"})
    EXPECT_FALSE(t.find(p)->kernel.empty()) << p << ": " << t.find(p)->reason;
  EXPECT_NE(t.find("model.layers.0.mlp")->reason.find("already in place"), std::string::npos);
  const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3, 11, 2}, {2, 4});
  auto a = fused.model.forward(ids, ids);
  auto b = plain.model.forward(ids, ids);
  EXPECT_NEAR(a.loss.to_doubles()[0], b.loss.to_doubles()[0], 1e-5);
  a.loss.backward();
  b.loss.backward();
  std::map<std::string, std::vector<double>> g;
  for (auto& [name, p] : plain.model.named_parameters()) g[name] = p->grad.to_doubles();
  auto cat = [&](std::initializer_list<std::string> parts) {
    std::vector<double> out;
    for (const std::string& n : parts) out.insert(out.end(), g.at(n).begin(), g.at(n).end());
    return out;
  };
  size_t compared = 0;
  for (auto& [name, p] : fused.model.named_parameters()) {
    ASSERT_TRUE(p->grad.defined()) << name;
    std::vector<double> want;
    const std::string L = name.substr(0, name.find(".", name.find("layers.") + 7) + 1);
    if (name.find(".scale") != std::string::npos)
      want = g.at(name.substr(0, name.size() - 5) + "weight");
    else if (name.find("gate_up_proj.weight") != std::string::npos)
      want = cat({L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"});
    else if (name.find("qkv_proj.weight") != std::string::npos)
      want = cat({L + "self_attn.q_proj.weight", L + "self_attn.k_proj.weight",
                  L + "self_attn.v_proj.weight"});
    else
      want = g.at(name);
    const std::vector<double> got = p->grad.to_doubles();
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-3 * std::fabs(want[i])) << name << " " << i;
    ++compared;
  }
  EXPECT_GT(compared, 10u);
}

// A layout kernel without a backward falls back in training: the originals come back (the
// built-in trains them), and eval() puts the layout in place again.
TEST_F(Fusion, AnInferenceOnlyLayoutKernelGivesItsParametersBackInTraining) {
  KernelConfig config{{{"MLP", std::string(kRepo) + "GateUpMLP"}}};
  config.inherit_mapping = false;
  Loaded loaded = load("qwen3-tiny", config);
  CausalLM& m = loaded.model;
  const auto reference = logits(m);
  m.train();
  const LayerDecision* d = m.kernelize_report()->find("model.layers.0.mlp");
  EXPECT_TRUE(d->kernel.empty());
  EXPECT_NE(d->reason.find("no backward"), std::string::npos) << d->reason;
  EXPECT_TRUE(parameter_names(m).count("model.layers.0.mlp.gate_proj.weight"));
  const Tensor ids = Tensor::from_ints({1, 5, 9, 42}, {1, 4});
  auto out = m.forward(ids, ids);
  out.loss.backward();
  m.eval();
  EXPECT_EQ(m.kernelize_report()->find("model.layers.0.mlp")->kernel,
            std::string(kRepo) + "GateUpMLP");
  EXPECT_TRUE(parameter_names(m).count("model.layers.0.mlp.gate_up_proj.weight"));
  expect_close(logits(m), reference);
}

TEST_F(Fusion, TransformersClassNamesAreKeysBesideHks) {
  KernelConfig config{{{"Qwen3RMSNorm", "kernels-community/rmsnorm:RMSNorm"}}};
  config.inherit_mapping = false;
  Loaded qwen = load("qwen3-tiny", config);
  const LayerDecision& n = decision(qwen.model, "model.layers.1.self_attn.k_norm");
  EXPECT_EQ(n.kernel, "kernels-community/rmsnorm:RMSNorm") << n.reason;
  EXPECT_NE(n.reason.find("(as Qwen3RMSNorm)"), std::string::npos) << n.reason;
  KernelConfig mlp{{{"Qwen3MLP", std::string(kRepo) + "GateUpMLP"}}};
  mlp.inherit_mapping = false;
  EXPECT_EQ(decision(load("qwen3-tiny", mlp).model, "model.layers.0.mlp").kernel,
            std::string(kRepo) + "GateUpMLP");
  // Llama's classes in a fusion
  Loaded llama =
      load("llama-tiny-bf16",
           fusion_config({rule({{"LlamaRMSNorm", "model.layers.*.post_attention_layernorm"},
                                {"LlamaMLP", "model.layers.*.mlp"}},
                               "RMSNormMLPBias")}));
  EXPECT_EQ(decision(llama.model, "model.layers.1.mlp").kernel,
            std::string(kRepo) + "RMSNormMLPBias");
  // a class name the model does not have is an unknown key, as before
  KernelConfig wrong{{{"LlamaRMSNorm", "kernels-community/rmsnorm:RMSNorm"}}};
  EXPECT_THROW(load("qwen3-tiny", wrong), InvalidArgument);
}

TEST_F(Fusion, FusionsHkCannotRunAreRefusedWithTheReason) {
  auto expect_error = [&](const std::string& model, const FusionRule& r,
                          const std::string& needle) {
    try {
      load(model, fusion_config({r}));
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // a chain, but attention is a composite hk binds through attn_implementation
  expect_error("qwen3-tiny",
               rule({{"RMSNorm", "model.layers.*.input_layernorm"},
                     {"attention", "model.layers.*.self_attn"}},
                    "RMSNormMLP"),
               "attention module runs its own projections");
  // not adjacent: the input norm does not feed the MLP
  expect_error("qwen3-tiny",
               rule({{"RMSNorm", "model.layers.*.input_layernorm"}, {"MLP", "model.layers.*.mlp"}},
                    "RMSNormMLP"),
               "not adjacent");
  expect_error(
      "llama-tiny-bf16",
      rule({{"Linear", "model.layers.*.mlp.up_proj"}, {"Linear", "model.layers.*.mlp.down_proj"}},
           "GateUpProj"),
      "not adjacent");
  expect_error(
      "qwen3-tiny",
      rule({{"RMSNorm", "model.layers.*.post_attention_layernorm"}, {"MLP", "model.layers.*.mlp"}},
           "RMSNormMLPNoLayout"),
      "Layout");
  // a sparse MoE block follows the norm in the same chain, but rms_norm_mlp@1 computes a dense MLP
  expect_error("qwen3-moe-tiny",
               rule({{"RMSNorm", "model.layers.*.post_attention_layernorm"},
                     {"MoeMLP", "model.layers.*.mlp"}},
                    "RMSNormMLP"),
               "no fusion interface for RMSNorm → MoeMLP");
  // a kernel whose layout does not cover the modules' parameters falls back, with the reason
  Loaded biased = load("llama-tiny-bf16",
                       fusion_config({rule({{"RMSNorm", "model.layers.*.post_attention_layernorm"},
                                            {"MLP", "model.layers.*.mlp"}},
                                           "RMSNormMLP")}));
  const LayerDecision& d = decision(biased.model, "model.layers.0.mlp");
  EXPECT_TRUE(d.kernel.empty());
  EXPECT_NE(d.reason.find("does not hold the parameter 'mlp.gate_proj.bias'"), std::string::npos)
      << d.reason;
  EXPECT_TRUE(parameter_names(biased.model).count("model.layers.0.mlp.gate_proj.weight"));
  // a kernel that does not compute in the model's dtype (the test kernels are f32 only): built-in,
  // the original parameters kept, and the reason
  Loaded bf16 = load("qwen3-tiny-bf16",
                     fusion_config({rule({{"RMSNorm", "model.layers.*.post_attention_layernorm"},
                                          {"MLP", "model.layers.*.mlp"}},
                                         "RMSNormMLP")}),
                     DType::BF16);
  const LayerDecision& b = decision(bf16.model, "model.layers.1.post_attention_layernorm");
  EXPECT_TRUE(b.kernel.empty());
  EXPECT_NE(b.reason.find("does not compute in bf16"), std::string::npos) << b.reason;
  EXPECT_TRUE(parameter_names(bf16.model).count("model.layers.1.mlp.up_proj.weight"));
}

// The shipped fused kernel: kernels-community/liger-kernels:LigerRMSNormSwiGLUMLP (rms_norm_mlp@1,
// its layout holding gate_up = [gate; up]) on every decoder layer, loaded from the embedded hub.
TEST_F(Fusion, LigerRMSNormSwiGLUMLPFusesEveryLayerWithTheUnfusedNumbers) {
  const std::string liger = "kernels-community/liger-kernels:LigerRMSNormSwiGLUMLP";
  auto norm_mlp = [&](const std::string& norm_class, const std::string& mlp_class) {
    FusionRule r;
    r.modules = {{norm_class, "model.layers.*.post_attention_layernorm"},
                 {mlp_class, "model.layers.*.mlp"}};
    r.kernel.spec = liger;
    return r;
  };
  const KernelConfig config = fusion_config({norm_mlp("Qwen3RMSNorm", "Qwen3MLP")});
  // f32: the logits of the built-in model, one copy of the weights
  Loaded plain = load("qwen3-tiny");
  Loaded fused = load("qwen3-tiny", config);
  for (const std::string p : {"model.layers.0.post_attention_layernorm", "model.layers.1.mlp"}) {
    const LayerDecision& d = decision(fused.model, p);
    EXPECT_EQ(d.kernel, liger) << d.reason;
    EXPECT_NE(d.reason.find("LigerRMSNormSwiGLUMLPLayout, declared before the checkpoint loads"),
              std::string::npos)
        << d.reason;
  }
  EXPECT_TRUE(parameter_names(fused.model).count("model.layers.1.mlp.gate_up_proj.weight"));
  EXPECT_FALSE(parameter_names(fused.model).count("model.layers.1.mlp.up_proj.weight"));
  expect_close(logits(fused.model), logits(plain.model));
  EXPECT_EQ(fused.peak, plain.peak);
  // bf16: the unfused pair of the same kernels (LigerRMSNorm, LigerSwiGLUMLP) gives the same logits
  KernelConfig pair{{{"RMSNorm", std::string("kernels-community/liger-kernels:LigerRMSNorm")},
                     {"MLP", std::string("kernels-community/liger-kernels:LigerSwiGLUMLP")}}};
  pair.inherit_mapping = false;
  Loaded pair16 = load("qwen3-tiny-bf16", pair, DType::BF16);
  Loaded fused16 = load("qwen3-tiny-bf16", config, DType::BF16);
  EXPECT_EQ(decision(fused16.model, "model.layers.0.mlp").kernel, liger);
  expect_close(logits(fused16.model), logits(pair16.model), 1e-6);
  // training: the entry has a backward; gradients reach gate_up as [d gate; d up]
  fused.model.train();
  plain.model.train();
  EXPECT_EQ(decision(fused.model, "model.layers.0.mlp").kernel, liger);
  const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3, 11, 2}, {2, 4});
  auto a = fused.model.forward(ids, ids);
  auto b = plain.model.forward(ids, ids);
  EXPECT_NEAR(a.loss.to_doubles()[0], b.loss.to_doubles()[0], 1e-5);
  a.loss.backward();
  b.loss.backward();
  std::map<std::string, std::vector<double>> want, got;
  for (auto& [name, p] : plain.model.named_parameters()) want[name] = p->grad.to_doubles();
  for (auto& [name, p] : fused.model.named_parameters()) got[name] = p->grad.to_doubles();
  for (const std::string L : {"model.layers.0.", "model.layers.1."}) {
    std::vector<double> cat = want.at(L + "mlp.gate_proj.weight");
    const auto& up = want.at(L + "mlp.up_proj.weight");
    cat.insert(cat.end(), up.begin(), up.end());
    expect_close(got.at(L + "mlp.gate_up_proj.weight"), cat, 1e-5);
    expect_close(got.at(L + "mlp.down_proj.weight"), want.at(L + "mlp.down_proj.weight"), 1e-5);
    expect_close(got.at(L + "post_attention_layernorm.weight"),
                 want.at(L + "post_attention_layernorm.weight"), 1e-5);
    expect_close(got.at(L + "input_layernorm.weight"), want.at(L + "input_layernorm.weight"), 1e-5);
  }
  // Inference | Capture (hk generate on cuda): the entry does not declare capture, so the layout
  // gives the original parameters back and the built-in runs, with the reason
  KernelizeOptions capture = kernelize_options(plain.model, config);
  Loaded again = load("qwen3-tiny", config);
  const KernelizeReport r =
      kernelize(again.model.module(), Mode::Inference | Mode::Capture, capture);
  const LayerDecision* c = r.find("model.layers.0.mlp");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->kernel.empty());
  EXPECT_NE(c->reason.find("not inference|capture"), std::string::npos) << c->reason;
  EXPECT_TRUE(parameter_names(again.model).count("model.layers.0.mlp.up_proj.weight"));
  expect_close(logits(again.model), logits(plain.model));
  // Llama's MLP has biases (mlp_bias), which the layout does not hold: built-in, with the reason
  Loaded llama = load("llama-tiny-bf16", fusion_config({norm_mlp("RMSNorm", "MLP")}));
  const LayerDecision& d = decision(llama.model, "model.layers.0.mlp");
  EXPECT_TRUE(d.kernel.empty());
  EXPECT_NE(d.reason.find("does not hold the parameter 'mlp.gate_proj.bias'"), std::string::npos)
      << d.reason;
}

}  // namespace
}  // namespace hk
