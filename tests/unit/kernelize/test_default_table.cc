// The default table row by row (Transformers' integrations/hub_kernels.py, see
// src/kernelize/default_mapping.cc) and what it binds on the embedded hub: every activation a
// Qwen3/Llama config can name (silu, gelu, gelu_pytorch_tanh, gelu_new, gelu_fast, quick_gelu)
// bound to its kernels-community/activation entry with unchanged logits, a GELU-gated MLP mapped
// to the GeGLU entry, LigerLinear, the ROCm rows (routed, and refused for lack of a rocm build),
// the simulated selection for devices this machine does not have (nothing loaded), and the
// warning an explicit request that falls back prints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"
#include "hk/layers.h"
#include "hk/models.h"
#include "kernelize/mapping.h"

namespace hk {
namespace {

namespace fs = std::filesystem;
using kernel_binding::choose_rule;
using kernel_binding::effective_rules;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
fs::path fixture() {
  return fs::path(env("HK_SOURCE_DIR")) / "tests/fixtures/models/qwen3-tiny";
}

// Transformers 5.17's rows: (layer, device, mode) → spec, version; "" = no kernel.
struct Row {
  const char* layer;
  const char* device;
  Mode mode;
  const char* spec;
  int version;
};

TEST(DefaultTable, EveryTransformersRowPerDeviceAndMode) {
  const Mode I = Mode::Inference, T = Mode::Training, IC = Mode::Inference | Mode::Capture,
             TC = Mode::Training | Mode::Capture;
  const char* liger_rms = "kernels-community/liger-kernels:LigerRMSNorm";
  const char* rotary = "kernels-community/rotary:apply_rotary_transformers";
  const Row rows[] = {
      {"MultiScaleDeformableAttention", "cuda", I,
       "kernels-community/deformable-detr:MultiScaleDeformableAttention", 1},
      {"MultiScaleDeformableAttention", "cuda", T,
       "kernels-community/deformable-detr:MultiScaleDeformableAttention", 1},
      {"SwiGLUMLP", "cuda", I, "kernels-community/liger-kernels:LigerSwiGLUMLP", 3},
      {"SwiGLUMLP", "cuda", IC, "kernels-community/liger-kernels:LigerSwiGLUMLP", 3},
      {"SwiGLUMLP", "cuda", T, "kernels-community/liger-kernels:LigerSwiGLUMLP", 3},
      {"GeGLUMLP", "cuda", I, "kernels-community/liger-kernels:LigerGEGLUMLP", 3},
      {"GeGLUMLP", "cuda", T, "kernels-community/liger-kernels:LigerGEGLUMLP", 3},
      {"SwiGLUMLP", "rocm", I, "", 0},
      {"Linear", "cuda", T, "kernels-community/liger-kernels:LigerLinear", 3},
      {"Linear", "cuda", TC, "kernels-community/liger-kernels:LigerLinear", 3},
      {"RMSNorm", "cuda", I, liger_rms, 3},
      {"RMSNorm", "cuda", T, liger_rms, 3},
      {"RMSNorm", "rocm", I, liger_rms, 3},
      {"RMSNorm", "rocm", T, liger_rms, 3},
      {"RMSNorm", "xpu", I, "kernels-community/rmsnorm:RMSNorm", 1},
      {"RMSNorm", "xpu", T, "", 0},  // xpu RMSNorm is inference-only in Transformers' table
      {"RMSNorm", "mps", I, "kernels-community/mlx_rmsnorm:RMSNorm", 1},
      {"RMSNorm", "npu", T, liger_rms, 3},
      {"RMSNorm", "cpu", I, "kernels-community/rmsnorm:RMSNorm", 1},
      {"MoeMLP", "cuda", T, "kernels-community/megablocks:MegaBlocksMoeMLP", 1},
      {"MoeMLP", "xpu", I, "kernels-community/megablocks:MegaBlocksMoeMLP", 1},
      {"MoeMLP", "cpu", I, "", 0},  // the built-in block is faster than megablocks' cpu variant
      {"SiLU", "cuda", I, "kernels-community/activation:Silu", 1},
      {"SiLU", "cuda", T, "", 0},  // Transformers maps activations for inference only
      {"GeLU", "cuda", I, "kernels-community/activation:Gelu", 1},
      {"GeluTanh", "cuda", IC, "kernels-community/activation:GeluTanh", 1},
      {"NewGELU", "cuda", I, "kernels-community/activation:NewGELU", 1},
      {"FastGELU", "cuda", I, "kernels-community/activation:FastGELU", 1},
      {"QuickGELU", "cuda", I, "kernels-community/activation:QuickGELU", 1},
      {"QuickGELU", "cpu", T, "kernels-community/activation:QuickGELU", 1},
      {"rotary_pos_emb", "cuda", I, rotary, 2},
      {"rotary_pos_emb", "cuda", T, rotary, 2},
      {"rotary_pos_emb", "xpu", I, rotary, 2},
      {"rotary_pos_emb", "rocm", I, "kernels-community/aiter-rope:apply_rotary_transformers", 2},
      {"rotary_pos_emb", "rocm", T, "", 0},
      {"rotary_pos_emb", "cpu", T, rotary, 2},
      {"ForCausalLMLoss", "cuda", T, "kernels-community/liger-kernels:LigerForCausalLMLossLayer",
       3},
      {"ForCausalLMLoss", "cpu", T, "", 0},
  };
  const auto rules = effective_rules(KernelConfig{});
  for (const Row& r : rows) {
    SCOPED_TRACE(std::string(r.layer) + " on " + r.device + " in " + mode_name(r.mode));
    auto choice = choose_rule(rules, r.layer, r.device, 90, r.mode);
    if (std::string(r.spec).empty()) {
      EXPECT_FALSE(choice) << choice->rule.kernel.spec;
      continue;
    }
    ASSERT_TRUE(choice);
    EXPECT_EQ(choice->rule.kernel.spec, r.spec);
    EXPECT_EQ(choice->rule.kernel.options.version.value_or(0), r.version);
    EXPECT_EQ(choice->rule.source, "default table");
  }
  // hk keeps the built-in GEMM for Linear in inference, captured or not (see default_mapping.cc)
  for (Mode m : {Mode::Inference, Mode::Inference | Mode::Capture}) {
    auto linear = choose_rule(rules, "Linear", "cuda", 90, m);
    ASSERT_TRUE(linear);
    EXPECT_TRUE(linear->rule.kernel.disabled());
  }
}

// A copy of the tiny Qwen3 fixture whose config says `hidden_act`.
fs::path model_with_activation(const std::string& hidden_act) {
  const fs::path dir =
      fs::temp_directory_path() / ("hk-act-" + hidden_act + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(fixture(), dir, fs::copy_options::recursive);
  std::ifstream in(dir / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  in.close();
  config["hidden_act"] = hidden_act;
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

class EmbeddedHub : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("USE_HUB_KERNELS");
    cache_ = fs::temp_directory_path() / ("hk-default-table-cache-" + std::to_string(getpid()));
  }
  void TearDown() override { fs::remove_all(cache_); }
  KernelizeOptions options(const CausalLM& model, KernelConfig config = {}) {
    hub::HubConfig hc = hub::HubConfig::from_environment();
    hc.endpoint.clear();
    hc.hub_dir = fs::path(env("HK_BINARY_DIR")) / "hub";
    hc.cache_dir = cache_;
    hc.offline = false;
    hc.local_kernels.clear();
    KernelizeOptions o;
    o.device = model.device();
    o.dtype = model.dtype();
    o.config = std::move(config);
    o.hub = std::make_shared<hub::Hub>(hc);
    return o;
  }
  fs::path cache_;
};

TEST_F(EmbeddedHub, EveryActivationAConfigCanNameBindsItsEntry) {
  struct Case {
    const char* hidden_act;
    const char* layer;
    const char* type_name;
    const char* entry;
  };
  const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3}, {1, 6});
  for (const Case& c : {Case{"silu", "SiLU", "SiLUActivation", "Silu"},
                        Case{"gelu", "GeLU", "GELUActivation", "Gelu"},
                        Case{"gelu_pytorch_tanh", "GeluTanh", "GELUTanh", "GeluTanh"},
                        Case{"gelu_new", "NewGELU", "NewGELUActivation", "NewGELU"},
                        Case{"gelu_fast", "FastGELU", "FastGELUActivation", "FastGELU"},
                        Case{"quick_gelu", "QuickGELU", "QuickGELUActivation", "QuickGELU"}}) {
    SCOPED_TRACE(c.hidden_act);
    const fs::path dir = model_with_activation(c.hidden_act);
    CausalLM model = AutoModelForCausalLM::from_pretrained(dir.string(), {});
    const std::string act_path = "model.layers.0.mlp.act_fn";
    const nn::Module* act = model.module().find_module(act_path);
    ASSERT_NE(act, nullptr);
    EXPECT_EQ(act->layer_interface(), c.layer);
    EXPECT_EQ(act->type_name(), c.type_name);
    const std::vector<double> builtin = model.forward(ids).logits.to_doubles();
    // Only the activations: the MLP's act(gate)·up then goes through the kernel as well.
    KernelConfig config;
    config.inherit_mapping = false;
    config.kernel_mapping[c.layer] = "kernels-community/activation:" + std::string(c.entry);
    KernelizeReport report = kernelize(model.module(), Mode::Inference, options(model, config));
    const LayerDecision* d = report.find(act_path);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->kernel, "kernels-community/activation:" + std::string(c.entry)) << d->reason;
    EXPECT_EQ(act->impl()->name(), d->kernel);
    const std::vector<double> kernelized = model.forward(ids).logits.to_doubles();
    ASSERT_EQ(kernelized.size(), builtin.size());
    for (size_t i = 0; i < builtin.size(); ++i)
      ASSERT_NEAR(kernelized[i], builtin[i], 1e-5 + 1e-5 * std::fabs(builtin[i])) << i;
    // and the default table picks the same entry on cpu
    KernelizeReport defaults = kernelize(model.module(), Mode::Inference, options(model));
    EXPECT_EQ(defaults.find(act_path)->kernel, d->kernel) << defaults.find(act_path)->reason;
    fs::remove_all(dir);
  }
}

TEST_F(EmbeddedHub, ActivationKernelsTrainWithTheBuiltinGradients) {
  // Training through the activation entries' backward (and the gated product composed as
  // autograd sees it): loss and every gradient as with the built-in activations.
  const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3}, {1, 6});
  for (const char* hidden_act : {"gelu", "quick_gelu", "silu"}) {
    SCOPED_TRACE(hidden_act);
    const fs::path dir = model_with_activation(hidden_act);
    auto grads = [&](bool kernels) {
      CausalLM model = AutoModelForCausalLM::from_pretrained(dir.string(), {});
      if (kernels) {
        KernelConfig config;
        config.inherit_mapping = false;
        const std::string layer =
            model.module().find_module("model.layers.0.mlp.act_fn")->layer_interface();
        const std::string entry = layer == "GeLU" ? "Gelu" : layer == "SiLU" ? "Silu" : layer;
        config.kernel_mapping[layer] = "kernels-community/activation:" + entry;
        KernelizeReport r = kernelize(model.module(), Mode::Training, options(model, config));
        EXPECT_EQ(r.find("model.layers.0.mlp.act_fn")->kernel,
                  "kernels-community/activation:" + entry)
            << r.find("model.layers.0.mlp.act_fn")->reason;
      }
      model.train(true);
      auto out = model.forward(ids, ids);
      out.loss.backward();
      std::vector<double> all = out.loss.to_doubles();
      for (auto& [name, p] : model.named_parameters())
        if (p->grad.defined())
          for (double g : p->grad.to_doubles()) all.push_back(g);
      return all;
    };
    const std::vector<double> builtin = grads(false), kernelized = grads(true);
    ASSERT_EQ(kernelized.size(), builtin.size());
    for (size_t i = 0; i < builtin.size(); ++i)
      ASSERT_NEAR(kernelized[i], builtin[i], 1e-5 + 1e-5 * std::fabs(builtin[i])) << i;
    fs::remove_all(dir);
  }
}

TEST_F(EmbeddedHub, AnActivationEntryOfAnotherFunctionIsRefusedAtBind) {
  const fs::path dir = model_with_activation("gelu");
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir.string(), {});
  auto o = options(model, KernelConfig{{{"GeLU", "kernels-community/activation:QuickGELU"}}});
  o.warn_on_fallback = false;
  KernelizeReport report = kernelize(model.module(), Mode::Inference, o);
  const LayerDecision* d = report.find("model.layers.0.mlp.act_fn");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->kernel.empty());
  EXPECT_NE(d->reason.find("computes another activation"), std::string::npos) << d->reason;
  // hk's earlier layer name still works as a key
  KernelizeReport old_name =
      kernelize(model.module(), Mode::Inference,
                options(model, KernelConfig{{{"GELU", "kernels-community/activation:GELU"}}}));
  EXPECT_EQ(old_name.find("model.layers.0.mlp.act_fn")->kernel,
            "kernels-community/activation:GELU");
  fs::remove_all(dir);
}

TEST_F(EmbeddedHub, LigerLinearBindsAndKeepsLogits) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(fixture().string(), {});
  const Tensor ids = Tensor::from_ints({3, 1, 4, 1, 5}, {1, 5});
  const std::vector<double> builtin = model.forward(ids).logits.to_doubles();
  KernelConfig config{
      {{"Linear", {"kernels-community/liger-kernels:LigerLinear", {.version = 3}}}}};
  config.inherit_mapping = false;
  KernelizeReport report = kernelize(model.module(), Mode::Inference, options(model, config));
  const LayerDecision* d = report.find("model.layers.0.self_attn.q_proj");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kernel, "kernels-community/liger-kernels:LigerLinear") << d->reason;
  const std::vector<double> kernelized = model.forward(ids).logits.to_doubles();
  for (size_t i = 0; i < builtin.size(); ++i)
    ASSERT_NEAR(kernelized[i], builtin[i], 1e-4 + 1e-4 * std::fabs(builtin[i])) << i;
}

TEST_F(EmbeddedHub, SimulatedCudaSelectionLoadsNothing) {
  const fs::path dir = model_with_activation("gelu_pytorch_tanh");
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir.string(), {});
  auto o = options(model);
  o.simulate = true;
  o.device = Device{DeviceType::CUDA, 0, 90};
  o.dtype = DType::BF16;
  o.simulated_cuda_runtime = 13000;
  KernelizeReport report = kernelize(model.module(), Mode::Inference, o);
  EXPECT_NE(report.simulated_target.find("cuda sm_90, CUDA 13.0"), std::string::npos);
  const LayerDecision* norm = report.find("model.layers.0.input_layernorm");
  ASSERT_NE(norm, nullptr);
  const bool have_cuda_build = fs::exists(fs::path(env("HK_BINARY_DIR")) / "hub" /
                                          "kernels-community/liger-kernels/refs/heads/v3");
  ASSERT_TRUE(have_cuda_build);
  // A build without CUDA has no cuda variants: the selection then says so instead.
  if (norm->kernel.empty()) {
    EXPECT_NE(norm->reason.find("cannot run on a cuda device"), std::string::npos) << norm->reason;
  } else {
    EXPECT_EQ(norm->kernel, "kernels-community/liger-kernels:LigerRMSNorm");
    EXPECT_NE(norm->variant.find("-cu"), std::string::npos);
    EXPECT_NE(norm->reason.find("nothing loaded"), std::string::npos) << norm->reason;
    // a GELU-gated MLP maps to the GeGLU entry
    const LayerDecision* mlp = report.find("model.layers.0.mlp");
    EXPECT_EQ(mlp->kernel, "kernels-community/liger-kernels:LigerGEGLUMLP") << mlp->reason;
    EXPECT_NE(mlp->reason.find("as GeGLUMLP"), std::string::npos) << mlp->reason;
    EXPECT_EQ(report.find("model.layers.0.mlp.act_fn")->kernel,
              "kernels-community/activation:GeluTanh");
  }
  // nothing was bound: every module still runs its built-in implementation
  for (auto& [path, module] : model.module().named_modules())
    if (!module->layer_interface().empty() && module->layer_interface() != "attention")
      EXPECT_EQ(module->impl()->name(), "builtin") << path;
  const auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["simulated"], true);
  EXPECT_NE(report.to_text().find("nothing was fetched or loaded"), std::string::npos);
  fs::remove_all(dir);
}

TEST_F(EmbeddedHub, RocmRowsAreRoutedAndRefusedForLackOfARocmBuild) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(fixture().string(), {});
  auto o = options(model);
  o.simulate = true;
  o.device = Device{DeviceType::ROCM, 0, 94};
  KernelizeReport report = kernelize(model.module(), Mode::Inference, o);
  EXPECT_EQ(report.device.substr(0, 4), "rocm");
  const LayerDecision* norm = report.find("model.layers.0.input_layernorm");
  ASSERT_NE(norm, nullptr);
  EXPECT_TRUE(norm->kernel.empty());
  EXPECT_NE(norm->reason.find("kernels-community/liger-kernels:LigerRMSNorm"), std::string::npos)
      << norm->reason;
  EXPECT_NE(norm->reason.find("cannot run on a rocm device"), std::string::npos) << norm->reason;
  const LayerDecision* rope = report.find("model.layers.0.self_attn.rotary_fn");
  EXPECT_NE(rope->reason.find("kernels-community/aiter-rope"), std::string::npos) << rope->reason;
  EXPECT_TRUE(rope->kernel.empty());
  // Transformers maps rotary on rocm for inference only
  KernelizeReport training = kernelize(model.module(), Mode::Training, o);
  EXPECT_NE(training.find("model.layers.0.self_attn.rotary_fn")->reason.find("no kernel mapped"),
            std::string::npos);
  // A cuda device that is ROCm underneath (HK_DEVICE_BACKEND=rocm simulates the detection) is
  // routed the same way.
  setenv("HK_DEVICE_BACKEND", "rocm", 1);
  o.device = Device{DeviceType::CUDA, 0, 94};
  KernelizeReport detected = kernelize(model.module(), Mode::Inference, o);
  unsetenv("HK_DEVICE_BACKEND");
  EXPECT_EQ(detected.device.substr(0, 4), "rocm");
  EXPECT_NE(detected.find("model.layers.0.self_attn.rotary_fn")->reason.find("aiter-rope"),
            std::string::npos);
}

TEST_F(EmbeddedHub, AnExplicitRequestThatFallsBackWarnsOnStderr) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(fixture().string(), {});
  testing::internal::CaptureStderr();
  KernelizeReport report = kernelize(
      model.module(), Mode::Inference,
      options(model, KernelConfig{{{"RMSNorm", "kernels-community/rmsnorm:NoSuchEntry"}}}));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(report.find("model.norm")->kernel.empty());
  // one line for all the RMSNorm layers, with the reason
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("hk: warning: an explicitly requested kernel falls back"), std::string::npos)
      << err;
  EXPECT_NE(err.find("has no entry NoSuchEntry"), std::string::npos) << err;
  EXPECT_NE(err.find(" more:"), std::string::npos) << err;
  // the default table's own fallbacks are not warned about
  testing::internal::CaptureStderr();
  kernelize(model.module(), Mode::Inference, options(model));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace hk
