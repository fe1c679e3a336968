// CPU f32 training golden tests of Qwen3-MoE (tests/fixtures/grads/qwen3-moe-tiny.safetensors,
// tools/fixtures/make_moe_fixtures.py): on the left-padded batch, hk's loss — with the router
// load-balancing loss added as Transformers adds it (output_router_logits) and without — and the
// gradient of every parameter (routers and every expert included) are within 1e-5 (relative,
// norm-wise per tensor) of Transformers'; with the built-in MoE block, gradient checkpointing, and
// kernels-community/megablocks' cpu variant bound in Mode::Training.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "golden/grad_fixture.h"
#include "hk/kernelize.h"

namespace hk {
namespace {

namespace fs = std::filesystem;
using testing::GradFixture;

constexpr double kTol = 1e-5;
const char* kModel = "qwen3-moe-tiny";

double rel(double got, double want) {
  return std::abs(got - want) / std::abs(want);
}

CausalLM load_f32() {
  CausalLM model =
      AutoModelForCausalLM::from_pretrained(testing::model_fixture(kModel), {.dtype = DType::F32});
  model.train();
  return model;
}

CausalLMOutput step(const CausalLM& model, const GradFixture& f, bool aux) {
  ForwardOptions o{.key_start = f.key_start, .labels = f.labels};
  o.output_router_logits = aux;
  CausalLMOutput out = model.forward(f.input_ids, o);
  out.loss.backward();
  return out;
}

// The gradients the fixture lists under `prefix` (grad_noaux. holds a subset).
void expect_grads(const CausalLM& model, const GradFixture& f, const std::string& prefix,
                  const std::string& what) {
  size_t compared = 0;
  for (auto& [name, p] : model.named_parameters()) {
    if (!f.has(prefix + name)) continue;
    ASSERT_TRUE(p->grad.defined()) << what << ": " << name;
    EXPECT_LE(testing::relative_error(testing::host_values(p->grad), f.values(prefix + name)), kTol)
        << what << ": gradient of " << name;
    ++compared;
  }
  EXPECT_GE(compared, 6u) << what;
}

TEST(MoeTrainingGolden, LossWithRouterAuxLossAndEveryGradientMatchTransformers) {
  GradFixture f = GradFixture::open(kModel);
  CausalLM model = load_f32();
  CausalLMOutput out = step(model, f, /*aux=*/true);
  ASSERT_TRUE(out.aux_loss.defined());
  EXPECT_LE(rel(out.aux_loss.to_doubles()[0], f.loss("aux_loss")), kTol) << "aux_loss";
  EXPECT_LE(rel(out.loss.to_doubles()[0], f.loss()), kTol) << "loss";
  testing::expect_all_grads(model, f, kTol, "built-in, output_router_logits");
}

TEST(MoeTrainingGolden, WithoutTheAuxLoss) {
  GradFixture f = GradFixture::open(kModel);
  CausalLM model = load_f32();
  ASSERT_FALSE(model.config().moe.output_router_logits);  // the config's default: no aux loss
  ForwardOptions o{.key_start = f.key_start, .labels = f.labels};
  CausalLMOutput out = model.forward(f.input_ids, o);
  out.loss.backward();
  EXPECT_FALSE(out.aux_loss.defined());
  EXPECT_LE(rel(out.loss.to_doubles()[0], f.loss("loss.noaux")), kTol);
  expect_grads(model, f, "grad_noaux.", "no aux loss");
}

TEST(MoeTrainingGolden, GradientCheckpointingGivesTheSameGradients) {
  GradFixture f = GradFixture::open(kModel);
  CausalLM model = load_f32();
  model.gradient_checkpointing_enable();
  CausalLMOutput out = step(model, f, true);
  EXPECT_LE(rel(out.loss.to_doubles()[0], f.loss()), kTol);
  testing::expect_all_grads(model, f, kTol, "gradient checkpointing");
}

TEST(MoeTrainingGolden, MegablocksCpuVariantTrains) {
  unsetenv("USE_HUB_KERNELS");
  const fs::path cache =
      fs::temp_directory_path() / ("hk-moe-train-cache-" + std::to_string(getpid()));
  GradFixture f = GradFixture::open(kModel);
  CausalLM model = load_f32();
  KernelizeOptions o;
  o.device = model.device();
  o.dtype = model.dtype();
  o.config = KernelConfig{
      {{"MoeMLP", KernelMappingValue("kernels-community/megablocks:MegaBlocksMoeMLP")}}};
  o.config.inherit_mapping = false;
  o.hub = testing::local_hub(testing::build_dir() / "hub", cache);
  KernelizeReport report = kernelize(model.module(), Mode::Training, o);
  for (const char* path : {"model.layers.0.mlp", "model.layers.2.mlp"})
    ASSERT_EQ(report.find(path)->kernel, "kernels-community/megablocks:MegaBlocksMoeMLP")
        << report.find(path)->reason;
  CausalLMOutput out = step(model, f, true);
  EXPECT_LE(rel(out.loss.to_doubles()[0], f.loss()), kTol);
  EXPECT_LE(rel(out.aux_loss.to_doubles()[0], f.loss("aux_loss")), kTol);
  testing::expect_all_grads(model, f, kTol, "megablocks cpu");
  model.zero_grad();
  model.gradient_checkpointing_enable();
  step(model, f, true);
  testing::expect_all_grads(model, f, kTol, "megablocks cpu, gradient checkpointing");
  fs::remove_all(cache);
}

}  // namespace
}  // namespace hk
