// The Trainer run the golden tests share (CPU and GPU programs): a fixture model trained on the
// shipped corpus with a RunSpec, the logged curve back, and the comparison with a
// Transformers curve from tests/fixtures/train/.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hk/models.h"
#include "hk/tokenizer.h"
#include "hk/trainer.h"
#include "train_test_util.h"

namespace hk::test {

// bf16 curves against torch in bf16: both round every activation and every update to bf16 (with
// different kernels: summation orders differ), so the curves agree to bf16's resolution of the
// loss and drift apart a little over the steps.
inline constexpr double kBf16LossTolerance = 2.5e-2;
inline constexpr double kBf16GradNormTolerance = 5e-2;

struct Curve {
  std::vector<double> losses, grad_norms, lrs, epochs;
};

struct RunSpec {
  std::string model;
  std::string device = "cpu";
  DType dtype = DType::F32;  // the model is loaded in this dtype (bf16 fixtures upcast for f32)
  int64_t batch = 2, ga = 1, steps = 20;
  bool gradient_checkpointing = false;
  bool bf16 = false;  // TrainingArguments::bf16 (f32 masters over an f32 model)
  bool liger = false;
  std::map<std::string, bool> liger_config;
  std::string scheduler = "constant";
  double lr = 1e-3, weight_decay = 0.01, warmup_steps = 0;
  bool shuffle = false;
  std::string output_dir;  // empty: no checkpoints
  int64_t save_steps = 500;
  std::string resume;
  int64_t stop_after = 0;  // > 0: abort the run after this step (simulated interruption)
};

inline BlockDataset corpus_blocks(const std::string& model, int64_t block_size = 32) {
  return BlockDataset::from_file(train_fixture("corpus.txt"),
                                 Tokenizer::from_pretrained(model_fixture(model)),
                                 {.block_size = block_size});
}

struct Interrupted {};

inline Curve train_curve(const RunSpec& spec,
                         std::optional<KernelizeReport>* report_copy = nullptr) {
  LoadOptions load;
  load.dtype = spec.dtype;  // f32: bf16 fixtures upcast, as Transformers loads them with float32
  load.device = spec.device;
  CausalLM model = AutoModelForCausalLM::from_pretrained(model_fixture(spec.model), load);
  TrainingArguments args;
  args.output_dir = spec.output_dir.empty() ? "unused" : spec.output_dir;
  args.per_device_train_batch_size = spec.batch;
  args.gradient_accumulation_steps = spec.ga;
  args.learning_rate = spec.lr;
  args.weight_decay = spec.weight_decay;
  args.lr_scheduler_type = spec.scheduler;
  args.warmup_steps = spec.warmup_steps;
  args.max_steps = spec.steps;
  args.logging_steps = 1;
  args.save_strategy = spec.output_dir.empty() ? "no" : "steps";
  args.save_steps = static_cast<double>(spec.save_steps);
  args.shuffle = spec.shuffle;
  args.gradient_checkpointing = spec.gradient_checkpointing;
  args.bf16 = spec.bf16;
  args.use_liger_kernel = spec.liger;
  args.liger_kernel_config = spec.liger_config;
  args.resume_from_checkpoint = spec.resume;
  TrainerOptions options;
  options.model_dir = model_fixture(spec.model);
  options.save_final_model = false;
  options.plot_loss = false;
  Trainer trainer(model, args, corpus_blocks(spec.model), options);
  if (report_copy && trainer.kernelize_report()) *report_copy = *trainer.kernelize_report();
  Curve c;
  trainer.on_log = [&](const TrainLog& log) {
    c.losses.push_back(log.loss);
    c.grad_norms.push_back(log.grad_norm.value_or(-1.0));
    c.lrs.push_back(log.learning_rate);
    c.epochs.push_back(log.epoch);
  };
  trainer.on_step = [&](const TrainProgress& p) {
    if (spec.stop_after > 0 && p.step >= spec.stop_after) throw Interrupted{};
  };
  try {
    trainer.train();
  } catch (const Interrupted&) {
  }
  return c;
}

inline void expect_matches_golden(const Curve& c, const nlohmann::json& ref, double loss_tol,
                                  const std::string& what, double grad_norm_rtol = 1e-3) {
  const auto losses = ref["losses"].get<std::vector<double>>();
  const auto norms = ref["grad_norms"].get<std::vector<double>>();
  const auto lrs = ref["learning_rates"].get<std::vector<double>>();
  const auto epochs = ref["epochs"].get<std::vector<double>>();
  ASSERT_EQ(c.losses.size(), losses.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    worst = std::max(worst, std::fabs(c.losses[i] - losses[i]));
    EXPECT_NEAR(c.losses[i], losses[i], loss_tol) << what << " step " << i + 1;
    EXPECT_NEAR(c.grad_norms[i], norms[i], grad_norm_rtol * norms[i] + 1e-4)
        << what << " step " << i + 1;
    EXPECT_DOUBLE_EQ(c.lrs[i], lrs[i]) << what << " step " << i + 1;
    EXPECT_NEAR(c.epochs[i], epochs[i], 1e-12) << what << " step " << i + 1;
  }
  std::cout << what << ": worst |loss - Transformers| over " << losses.size()
            << " steps = " << worst << "\n";
}

}  // namespace hk::test
