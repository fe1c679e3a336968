// CPU f32 training golden tests: for the tiny Qwen3 (tied lm_head, q/k norm) and Llama (biases,
// llama3 rope) fixtures, on a batch with a left-padded row and ignored labels, hk's loss and the
// gradient of every parameter are within 1e-5 (relative, norm-wise per tensor) of Transformers'
// (tests/fixtures/grads, tools/fixtures/make_grad_fixtures.py): built-in layers, gradient
// checkpointing, num_items_in_batch, and the liger-kernels cpu variants bound in Mode::Training
// (rms_norm, rope, swiglu and fused linear cross-entropy; separately LigerForCausalLMLoss).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "golden/grad_fixture.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"

namespace hk {
namespace {

namespace fs = std::filesystem;
using testing::GradFixture;

constexpr double kTol = 1e-5;

CausalLM load_f32(const std::string& name) {
  return AutoModelForCausalLM::from_pretrained(testing::model_fixture(name), {.dtype = DType::F32});
}

double rel(double got, double want) {
  return std::abs(got - want) / std::abs(want);
}

class TrainingGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainingGolden, LossAndEveryGradientMatchTransformers) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  Loss loss = testing::train_step(model, f);
  EXPECT_LE(rel(loss.to_doubles()[0], f.loss()), kTol) << "loss";
  testing::expect_all_grads(model, f, kTol, "built-in");
}

TEST_P(TrainingGolden, ExplicitPositionsGiveTheSameGradients) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  testing::train_step(model, f, false, /*pass_positions=*/true);
  testing::expect_all_grads(model, f, kTol, "position_ids given");
}

TEST_P(TrainingGolden, GradientCheckpointingGivesTheSameGradients) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  model.gradient_checkpointing_enable();
  ASSERT_TRUE(model.is_gradient_checkpointing());
  Loss loss = testing::train_step(model, f);
  EXPECT_LE(rel(loss.to_doubles()[0], f.loss()), kTol);
  testing::expect_all_grads(model, f, kTol, "gradient checkpointing");
}

TEST_P(TrainingGolden, NumItemsInBatchSumsAndDivides) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  Loss loss = testing::train_step(model, f, /*num_items=*/true);
  EXPECT_LE(rel(loss.to_doubles()[0], f.loss("loss.num_items")), kTol);
  // Transformers' own gradients for a few tensors ...
  for (const auto& info : f.file.tensors()) {
    if (info.name.rfind("grad_num_items.", 0) != 0) continue;
    const std::string name = info.name.substr(std::string("grad_num_items.").size());
    nn::Parameter* p = nullptr;
    for (auto& [n, q] : model.named_parameters())
      if (n == name) p = q;
    ASSERT_NE(p, nullptr) << name;
    EXPECT_LE(testing::relative_error(testing::host_values(p->grad), f.values(info.name)), kTol)
        << name;
  }
  // ... and every gradient is the mean's times targets / num_items_in_batch.
  testing::expect_all_grads(model, f, kTol, "num_items_in_batch", f.num_items_scale());
}

TEST_P(TrainingGolden, BackwardAccumulatesAndZeroGradClears) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  testing::train_step(model, f);
  testing::train_step(model, f);
  testing::expect_all_grads(model, f, kTol, "two backwards", 2.0);
  model.zero_grad(/*set_to_none=*/false);
  for (auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p->grad.defined()) << name;
    for (double v : p->grad.to_doubles()) ASSERT_EQ(v, 0.0) << name;
  }
  testing::train_step(model, f);
  testing::expect_all_grads(model, f, kTol, "after zero_grad(false)");
  model.zero_grad();
  for (auto& [name, p] : model.named_parameters()) EXPECT_FALSE(p->grad.defined()) << name;
}

TEST_P(TrainingGolden, DroppedLogitsAreReusedForTheirGradient) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  CausalLMOutput out = model.forward(f.input_ids, {.key_start = f.key_start, .labels = f.labels});
  out.logits = Tensor();  // backward may now overwrite them with d(logits)
  out.loss.backward();
  testing::expect_all_grads(model, f, kTol, "logits dropped before backward");
}

TEST_P(TrainingGolden, FrozenParametersGetNoGradient) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  model.train();
  const std::string frozen = "model.layers.0.self_attn.q_proj.weight";
  for (auto& [name, p] : model.named_parameters())
    if (name == frozen) p->requires_grad = false;
  testing::train_step(model, f);
  for (auto& [name, p] : model.named_parameters()) {
    if (name == frozen) {
      EXPECT_FALSE(p->grad.defined());
      continue;
    }
    EXPECT_LE(testing::relative_error(testing::host_values(p->grad), f.values("grad." + name)),
              kTol)
        << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainingGolden, ::testing::ValuesIn(testing::grad_fixture_names()),
                         testing::fixture_case_name<::testing::TestParamInfo<std::string>>);

// ---- liger-kernels cpu variants in Mode::Training --------------------------------------------

class LigerTrainingGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    unsetenv("USE_HUB_KERNELS");
    cache_ = fs::temp_directory_path() / ("hk-train-golden-cache-" + std::to_string(getpid()));
  }
  void TearDown() override { fs::remove_all(cache_); }

  KernelizeReport kernelize_training(CausalLM& model, KernelConfig config) {
    KernelizeOptions o;
    o.device = model.device();
    o.dtype = model.dtype();
    o.config = std::move(config);
    o.config.inherit_mapping = false;
    o.hub = testing::local_hub(testing::build_dir() / "hub", cache_);  // the embedded hub
    model.train();
    return kernelize(model.module(), Mode::Training, o);
  }

  fs::path cache_;
};

const std::string kLiger = "kernels-community/liger-kernels:";
// A liger-kernels entry at its current major version (3).
KernelMappingValue liger(const std::string& entry) {
  return KernelMappingValue(kLiger + entry, KernelOptions{.version = 3});
}

TEST_P(LigerTrainingGolden, FusedKernelsMatchTransformers) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  KernelizeReport report = kernelize_training(
      model, KernelConfig{{{"RMSNorm", liger("LigerRMSNorm")},
                           {"rotary_pos_emb", liger("LigerRope")},
                           {"MLP", liger("LigerSwiGLUMLP")},
                           {"ForCausalLMLoss", liger("LigerFusedLinearCrossEntropyLoss")}}});
  const bool mlp_bias = model.config().mlp_bias;  // the llama fixture: mlp@1 has no biases
  for (const auto& [path, layer] : std::vector<std::pair<std::string, std::string>>{
           {"model.layers.0.input_layernorm", "LigerRMSNorm"},
           {"model.layers.1.self_attn.rotary_fn", "LigerRope"},
           {"model.layers.1.mlp", "LigerSwiGLUMLP"},
           {"loss_function", "LigerFusedLinearCrossEntropyLoss"}}) {
    const LayerDecision* d = report.find(path);
    ASSERT_NE(d, nullptr) << path;
    if (layer == "LigerSwiGLUMLP" && mlp_bias) {
      EXPECT_EQ(d->kernel, "") << d->reason;
      EXPECT_NE(d->reason.find("bias"), std::string::npos) << d->reason;
      continue;
    }
    EXPECT_EQ(d->kernel, kLiger + layer) << path << ": " << d->reason;
  }
  ForwardOptions o{.key_start = f.key_start, .labels = f.labels};
  CausalLMOutput out = model.forward(f.input_ids, o);
  EXPECT_FALSE(out.logits.defined()) << "the fused loss must not make logits";
  out.loss.backward();
  EXPECT_LE(rel(out.loss.to_doubles()[0], f.loss()), kTol);
  testing::expect_all_grads(model, f, kTol, "liger fused");

  // num_items_in_batch through the fused loss
  model.zero_grad();
  Loss loss = testing::train_step(model, f, /*num_items=*/true);
  EXPECT_LE(rel(loss.to_doubles()[0], f.loss("loss.num_items")), kTol);
  testing::expect_all_grads(model, f, kTol, "liger fused, num_items_in_batch", f.num_items_scale());
}

TEST_P(LigerTrainingGolden, LigerForCausalLMLossMatchesTransformers) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  KernelizeReport report =
      kernelize_training(model, KernelConfig{{{"ForCausalLMLoss", liger("LigerForCausalLMLoss")}}});
  ASSERT_EQ(report.find("loss_function")->kernel, kLiger + "LigerForCausalLMLoss")
      << report.find("loss_function")->reason;
  ForwardOptions o{.key_start = f.key_start, .labels = f.labels};
  CausalLMOutput out = model.forward(f.input_ids, o);
  EXPECT_TRUE(out.logits.defined());
  out.loss.backward();
  EXPECT_LE(rel(out.loss.to_doubles()[0], f.loss()), kTol);
  testing::expect_all_grads(model, f, kTol, "LigerForCausalLMLoss");
  model.zero_grad();
  Loss loss = testing::train_step(model, f, /*num_items=*/true);
  EXPECT_LE(rel(loss.to_doubles()[0], f.loss("loss.num_items")), kTol);
}

TEST_P(LigerTrainingGolden, FusedLossWithGradientCheckpointing) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  KernelizeReport report = kernelize_training(
      model, KernelConfig{{{"RMSNorm", liger("LigerRMSNorm")},
                           {"ForCausalLMLoss", liger("LigerFusedLinearCrossEntropyLoss")}}});
  ASSERT_EQ(report.find("loss_function")->kernel, kLiger + "LigerFusedLinearCrossEntropyLoss")
      << report.find("loss_function")->reason;
  model.gradient_checkpointing_enable();
  testing::train_step(model, f);
  testing::expect_all_grads(model, f, kTol, "liger + gradient checkpointing");
}

TEST_P(LigerTrainingGolden, FusedLossIsNotBoundForInference) {
  CausalLM model = load_f32(GetParam());
  KernelizeOptions o{
      .device = model.device(),
      .dtype = model.dtype(),
      .config = KernelConfig{{{"ForCausalLMLoss", liger("LigerFusedLinearCrossEntropyLoss")}}},
      .hub = testing::local_hub(testing::build_dir() / "hub", cache_)};
  KernelizeReport report = kernelize(model.module(), Mode::Inference, o);
  const LayerDecision* d = report.find("loss_function");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kernel, "");
  EXPECT_NE(d->reason.find("training"), std::string::npos) << d->reason;
}

// The user path: a kernel_config at load (kernelized for Inference, where the fused loss stays
// built-in), then model.train() re-kernelizes for Training and the fused loss takes over.
TEST_P(LigerTrainingGolden, TrainReKernelizesAKernelConfigModel) {
  setenv("HK_KERNELS_CACHE", cache_.c_str(), 1);
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = AutoModelForCausalLM::from_pretrained(
      testing::model_fixture(GetParam()),
      {.dtype = DType::F32,
       .kernel_config =
           KernelConfig{{{"RMSNorm", liger("LigerRMSNorm")},
                         {"ForCausalLMLoss", liger("LigerFusedLinearCrossEntropyLoss")}}}});
  ASSERT_NE(model.kernelize_report(), nullptr);
  EXPECT_EQ(model.kernelize_report()->find("loss_function")->kernel, "");
  model.train();
  EXPECT_EQ(model.kernelize_report()->mode, Mode::Training);
  EXPECT_EQ(model.kernelize_report()->find("loss_function")->kernel,
            kLiger + "LigerFusedLinearCrossEntropyLoss")
      << model.kernelize_report()->find("loss_function")->reason;
  ForwardOptions o{.key_start = f.key_start, .labels = f.labels};
  CausalLMOutput out = model.forward(f.input_ids, o);
  EXPECT_FALSE(out.logits.defined());
  out.loss.backward();
  testing::expect_all_grads(model, f, kTol, "kernel_config + train()");
  model.eval();  // back to inference: logits again, the built-in loss
  EXPECT_TRUE(model.forward(f.input_ids, o).logits.defined());
  unsetenv("HK_KERNELS_CACHE");
}

// Every Linear (projections, MLP, untied lm_head) through a linear@1 kernel's backward (a reference
// kernel of the training test hub): dx summed over q/k/v, weight and bias gradients via the ABI.
TEST_P(LigerTrainingGolden, LinearKernelBackward) {
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = load_f32(GetParam());
  KernelConfig config{{{"Linear", "kernels-community/test-linear:Linear"}}};
  config.inherit_mapping = false;
  KernelizeOptions o{.device = model.device(),
                     .dtype = model.dtype(),
                     .config = config,
                     .hub = testing::local_hub(testing::build_dir() / "training-test-hub", cache_)};
  model.train();
  KernelizeReport report = kernelize(model.module(), Mode::Training, o);
  for (const char* path : {"model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"})
    ASSERT_EQ(report.find(path)->kernel, "kernels-community/test-linear:Linear")
        << report.find(path)->reason;
  testing::train_step(model, f);
  testing::expect_all_grads(model, f, kTol, "linear@1 kernel");
  testing::train_step(model, f);  // the second backward accumulates through the kernel's flag
  testing::expect_all_grads(model, f, kTol, "linear@1 kernel, accumulated", 2.0);
}

// use_kernels (the hub's default mapping: on cpu kernels-community/rmsnorm, rotary, activation)
// in training mode gives Transformers' gradients too.
TEST_P(LigerTrainingGolden, DefaultMappingTrains) {
  setenv("HK_KERNELS_CACHE", cache_.c_str(), 1);
  GradFixture f = GradFixture::open(GetParam());
  CausalLM model = AutoModelForCausalLM::from_pretrained(
      testing::model_fixture(GetParam()), {.dtype = DType::F32, .use_kernels = true});
  model.train();
  const KernelizeReport& report = *model.kernelize_report();
  for (const char* path : {"model.layers.0.input_layernorm", "model.layers.1.self_attn.rotary_fn",
                           "model.layers.0.mlp.act_fn"})
    EXPECT_NE(report.find(path)->kernel, "") << path << ": " << report.find(path)->reason;
  testing::train_step(model, f);
  testing::expect_all_grads(model, f, kTol, "use_kernels");
  unsetenv("HK_KERNELS_CACHE");
}

INSTANTIATE_TEST_SUITE_P(Models, LigerTrainingGolden,
                         ::testing::ValuesIn(testing::grad_fixture_names()),
                         testing::fixture_case_name<::testing::TestParamInfo<std::string>>);

}  // namespace
}  // namespace hk
