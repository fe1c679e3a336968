// Internal: the Trainer's state and steps shared by trainer.cc (set-up, loop, resume) and
// trainer_checkpoint.cc (writing checkpoints and the final model). Not installed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hk/lr_scheduler.h"
#include "hk/optim.h"
#include "hk/train_checkpoint.h"
#include "hk/trainer.h"

namespace hk::train_detail {

struct TrainerImpl {
  TrainerImpl(CausalLM& model, TrainingArguments args, BlockDataset data, TrainerOptions options);

  CausalLM& model;
  TrainingArguments args;
  BlockDataset data;
  TrainerOptions options;

  std::vector<optim::OptimTensor> tensors;  // trainable parameters, decay groups marked
  std::unique_ptr<optim::AdamW> optimizer;
  LRScheduler scheduler;
  bool master = false;  // --bf16 over an f32 model
  std::optional<KernelizeReport> report;
  std::vector<std::string> notes;
  std::string model_fingerprint;

  int64_t steps_in_epoch = 0;     // micro-batches per epoch (len(dataloader))
  int64_t updates_per_epoch = 0;  // optimizer steps per epoch
  int64_t max_steps = 0;
  int64_t num_train_epochs = 0;
  int64_t logging_steps = 0, save_steps = 0;

  TrainerState state;
  std::string last_saved;  // the newest checkpoint written or resumed from

  // The loss window: one f32 slot per micro-batch since the last log, read at logs and saves.
  Tensor loss_window;
  std::vector<int64_t> window_slot_step;
  int64_t window_micro = 0, window_steps = 0, window_tokens = 0;
  std::chrono::steady_clock::time_point window_start;
  int64_t bad_loss_step = std::numeric_limits<int64_t>::max();

  TrainOutput train(const std::function<void(const TrainLog&)>& on_log,
                    const std::function<void(const TrainProgress&)>& on_step);

  std::string parameter_fingerprint() const;
  std::string model_summary() const;
  void kernelize_for_training();
  Tensor micro_batch(const std::vector<int64_t>& order, int64_t micro_index) const;
  void reset_window();
  double flush_window(int64_t step, bool* finite);
  [[noreturn]] void fail_non_finite(int64_t step) const;
  std::string resume(int64_t* start_epoch, int64_t* start_micro);

  // trainer_checkpoint.cc
  std::string save_checkpoint(int64_t epoch, int64_t micro_batches_done);
  void save_final_model();
  // The model's weights as Transformers names them (tied once; masters with --bf16).
  std::vector<std::pair<std::string, Tensor>> model_weights() const;
  // Copies config.json, generation_config.json and the tokenizer files of options.model_dir.
  void copy_model_files(CheckpointWriter* writer, const std::string& dir) const;
};

}  // namespace hk::train_detail
