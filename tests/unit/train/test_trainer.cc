// The Trainer against Transformers: 20-step AdamW curves of the tiny Qwen3 and Llama fixtures
// (tests/fixtures/train/golden-*.json, the same steps run by transformers.Trainer) with the
// built-in layers, with gradient checkpointing and with Liger's cpu kernels; resume equality (10 +
// resume 10 steps == 20 steps, bit for bit); a checkpoint of another model refused; a NaN loss
// stopping training with the last good checkpoint kept.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "hk/error.h"
#include "hk/models.h"
#include "hk/ops.h"
#include "hk/safetensors.h"
#include "hk/tokenizer.h"
#include "hk/train_checkpoint.h"
#include "hk/trainer.h"
#include "trainer_test_util.h"

namespace hk {
namespace {

namespace fs = std::filesystem;
using test::corpus_blocks;
using test::Curve;
using test::expect_matches_golden;
using test::RunSpec;
using test::train_curve;

struct GoldenCase {
  const char* fixture;
  const char* model;
  int64_t batch, ga;
};
const GoldenCase kCases[] = {{"golden-qwen3-b2.json", "qwen3-tiny", 2, 1},
                             {"golden-qwen3-b1-ga2.json", "qwen3-tiny", 1, 2},
                             {"golden-llama-b2.json", "llama-tiny-bf16", 2, 1}};

RunSpec spec_for(const GoldenCase& gc) {
  RunSpec spec;
  spec.model = gc.model;
  spec.batch = gc.batch;
  spec.ga = gc.ga;
  return spec;
}

TEST(TrainerGolden, BuiltinCurvesMatchTransformers) {
  for (const auto& gc : kCases) {
    const auto ref = test::read_json(test::train_fixture(gc.fixture));
    RunSpec spec = spec_for(gc);
    expect_matches_golden(train_curve(spec), ref, 1e-4, gc.fixture);
  }
}

TEST(TrainerGolden, GradientCheckpointingGivesTheSameCurve) {
  for (const auto& gc : kCases) {
    const auto ref = test::read_json(test::train_fixture(gc.fixture));
    RunSpec spec = spec_for(gc);
    spec.gradient_checkpointing = true;
    expect_matches_golden(train_curve(spec), ref, 1e-4,
                          std::string(gc.fixture) + " + gradient checkpointing");
  }
}

// Liger's kernels (cpu variants of kernels-community/liger-kernels, from the embedded hub) with
// Liger's defaults (rope, rms_norm, swiglu, fused_linear_cross_entropy), then with cross_entropy
// instead of the fused loss.
TEST(TrainerGolden, LigerCpuKernelsMatchTransformers) {
  const std::vector<std::map<std::string, bool>> configs = {
      {}, {{"cross_entropy", true}, {"fused_linear_cross_entropy", false}}};
  for (const auto& gc : kCases) {
    const auto ref = test::read_json(test::train_fixture(gc.fixture));
    for (const auto& config : configs) {
      RunSpec spec = spec_for(gc);
      spec.liger = true;
      spec.liger_config = config;
      std::optional<KernelizeReport> report;
      const Curve c = train_curve(spec, &report);
      ASSERT_TRUE(report.has_value());
      // Every layer Liger names trained on its kernel, not silently on the built-in path; the
      // one exception is the Llama fixture's MLP with biases (mlp_bias), which LigerSwiGLUMLP
      // does not have: it stays built-in and the report says so.
      const bool mlp_bias = std::string(gc.model) == "llama-tiny-bf16";
      for (const char* layer : {"RMSNorm", "rotary_pos_emb", "MLP", "ForCausalLMLoss"}) {
        size_t seen = 0;
        for (const auto& d : report->layers) {
          if (d.layer != layer) continue;
          ++seen;
          if (mlp_bias && d.layer == "MLP") {
            EXPECT_TRUE(d.kernel.empty()) << d.path;
            EXPECT_NE(d.reason.find("biases"), std::string::npos) << d.path << ": " << d.reason;
            continue;
          }
          EXPECT_EQ(d.kernel.rfind("kernels-community/liger-kernels:", 0), 0u)
              << gc.fixture << " " << d.path << ": " << d.reason;
        }
        EXPECT_GT(seen, 0u) << layer;
      }
      expect_matches_golden(
          c, ref, 1e-4,
          std::string(gc.fixture) + " + liger " + (config.empty() ? "defaults" : "cross_entropy"));
    }
  }
}

// The model's dtype throughout: bf16 parameters, gradients and AdamW moments, against torch
// training the bf16 fixtures in bf16 on the CPU (golden-bf16-cpu.json).
TEST(TrainerGolden, Bf16ModelCurvesMatchTorchBf16OnCpu) {
  const auto ref = test::read_json(test::train_fixture("golden-bf16-cpu.json"))["cases"];
  for (const auto& [name, model] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3-b2-bf16", "qwen3-tiny-bf16"}, {"llama-b2-bf16", "llama-tiny-bf16"}}) {
    RunSpec spec;
    spec.model = model;
    spec.dtype = DType::BF16;
    expect_matches_golden(train_curve(spec), ref[name], test::kBf16LossTolerance, name + " (cpu)",
                          test::kBf16GradNormTolerance);
  }
}

TEST(TrainerResume, TenPlusResumedTenEqualsTwentyBitForBit) {
  // Shuffled blocks, a warmup + linear schedule, weight decay, gradient accumulation: everything
  // a resume has to restore.
  RunSpec base;
  base.model = "qwen3-tiny";
  base.batch = 2;
  base.ga = 2;
  base.scheduler = "linear";
  base.warmup_steps = 3;
  base.shuffle = true;
  base.steps = 30;  // crosses an epoch boundary (21 micro-batches per epoch = 11 steps)
  const Curve straight = train_curve(base);
  ASSERT_EQ(straight.losses.size(), 30u);

  test::TempDir out;
  RunSpec first = base;
  first.output_dir = out.str();
  first.save_steps = 10;
  first.stop_after = 10;
  const Curve head = train_curve(first);
  ASSERT_EQ(head.losses.size(), 10u);
  ASSERT_TRUE(fs::is_directory(out / "checkpoint-10"));
  RunSpec second = base;
  second.output_dir = out.str();
  second.save_steps = 10;
  second.resume = "latest";
  const Curve tail = train_curve(second);
  ASSERT_EQ(tail.losses.size(), 20u);
  for (size_t i = 0; i < 30; ++i) {
    const double resumed = i < 10 ? head.losses[i] : tail.losses[i - 10];
    EXPECT_EQ(resumed, straight.losses[i]) << "step " << i + 1;  // bit for bit
    const double lr = i < 10 ? head.lrs[i] : tail.lrs[i - 10];
    EXPECT_EQ(lr, straight.lrs[i]) << "step " << i + 1;
  }
  // The resumed run appended to the checkpoint's log history.
  const auto state = TrainerState::from_json(
      [&] {
        std::ifstream in(out / "checkpoint-30/trainer_state.json");
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      }(),
      "trainer_state.json");
  EXPECT_EQ(state.global_step, 30);
  EXPECT_EQ(state.log_history.size(), 30u);
}

TEST(TrainerResume, CheckpointOfAnotherModelIsRefused) {
  test::TempDir out;
  RunSpec qwen;
  qwen.model = "qwen3-tiny";
  qwen.steps = 2;
  qwen.output_dir = out.str();
  qwen.save_steps = 2;
  train_curve(qwen);
  ASSERT_TRUE(fs::is_directory(out / "checkpoint-2"));
  RunSpec llama = qwen;
  llama.model = "llama-tiny-bf16";
  llama.resume = out / "checkpoint-2";
  try {
    train_curve(llama);
    FAIL() << "resuming a Qwen3 checkpoint into Llama must fail";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("different model"), std::string::npos) << e.what();
  }
  RunSpec other_batch = qwen;
  other_batch.batch = 3;
  other_batch.resume = "latest";
  EXPECT_THROW(train_curve(other_batch), InvalidArgument);
  RunSpec nothing = qwen;
  nothing.output_dir = out / "empty";
  nothing.resume = "latest";
  EXPECT_THROW(train_curve(nothing), NotFound);
}

TEST(TrainerErrors, NonFiniteLossStopsAndKeepsTheLastGoodCheckpoint) {
  test::TempDir out;
  CausalLM model = AutoModelForCausalLM::from_pretrained(test::model_fixture("qwen3-tiny"));
  TrainingArguments args;
  args.output_dir = out.str();
  args.per_device_train_batch_size = 2;
  args.max_steps = 10;
  args.logging_steps = 5;  // the NaN is found at the save, before the next log
  args.save_steps = 1;
  args.shuffle = false;
  Trainer trainer(model, args, corpus_blocks("qwen3-tiny"),
                  {.model_dir = test::model_fixture("qwen3-tiny")});
  trainer.on_step = [&](const TrainProgress& p) {
    if (p.step == 2)  // poison a weight: step 3's loss is NaN
      for (auto& [name, param] : model.named_parameters())
        if (name == "model.norm.weight") ops::fill(param->value, std::nan(""));
  };
  try {
    trainer.train();
    FAIL() << "a NaN loss must stop training";
  } catch (const NonFiniteLossError& e) {
    EXPECT_EQ(e.step(), 3);
    EXPECT_NE(std::string(e.what()).find("step 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checkpoint-2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(out / "checkpoint-2"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-3"));
  EXPECT_EQ(last_checkpoint(out.str()), out / "checkpoint-2");
}

TEST(TrainerErrors, BlockLongerThanTheContextIsRefused) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(test::model_fixture("qwen3-tiny"));
  TrainingArguments args;
  args.output_dir = "unused";
  args.save_strategy = "no";
  // The fixture's context is 128: a 256-token block cannot be trained on.
  std::vector<std::vector<int64_t>> docs(1, std::vector<int64_t>(600, 5));
  try {
    Trainer t(model, args, BlockDataset::from_documents(docs, {.block_size = 256}));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
}

TEST(TrainerPrecision, Bf16OverAnF32ModelKeepsF32MastersInCheckpoints) {
  test::TempDir out;
  CausalLM model = AutoModelForCausalLM::from_pretrained(test::model_fixture("qwen3-tiny"));
  ASSERT_EQ(model.dtype(), DType::F32);
  TrainingArguments args;
  args.output_dir = out.str();
  args.per_device_train_batch_size = 2;
  args.max_steps = 3;
  args.logging_steps = 1;
  args.save_steps = 3;
  args.learning_rate = 1e-3;
  args.lr_scheduler_type = "constant";
  args.weight_decay = 0.01;
  args.shuffle = false;
  args.bf16 = true;
  Trainer trainer(model, args, corpus_blocks("qwen3-tiny"),
                  {.model_dir = test::model_fixture("qwen3-tiny")});
  EXPECT_EQ(model.dtype(), DType::BF16);  // computes in bf16
  std::vector<double> losses;
  trainer.on_log = [&](const TrainLog& l) { losses.push_back(l.loss); };
  trainer.train();
  ASSERT_EQ(losses.size(), 3u);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  // Close to the f32 curve (bf16 compute): within bf16 tolerance of golden-qwen3-b2 (same data).
  const auto ref = test::read_json(test::train_fixture("golden-qwen3-b2.json"));
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(losses[i], ref["losses"][i].get<double>(), 5e-2);
  SafetensorsFile f = SafetensorsFile::open(out / "checkpoint-3/model.safetensors");
  for (const auto& info : f.tensors()) EXPECT_EQ(info.dtype_name, "F32") << info.name;
  // The bf16 model equals its f32 masters rounded.
  auto masters = f.load("model.norm.weight");
  for (auto& [name, p] : model.named_parameters())
    if (name == "model.norm.weight") {
      const auto m = masters.to_doubles(), b = p->value.to_doubles();
      for (size_t i = 0; i < m.size(); ++i)
        EXPECT_EQ(b[i], round_to(DType::BF16, static_cast<float>(m[i])));
    }
}

}  // namespace
}  // namespace hk
