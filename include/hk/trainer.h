// hk/trainer.h — the causal-LM Trainer: Hugging Face Trainer's loop over hk models.
//
//   hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(dir, {.device = "cuda"});
//   hk::BlockDataset data = hk::BlockDataset::from_file("corpus.txt",
//       hk::Tokenizer::from_pretrained(dir), {.block_size = 512});
//   hk::TrainingArguments args;  args.output_dir = "out";  args.max_steps = 100;
//   hk::Trainer trainer(model, args, data, {.model_dir = dir});
//   hk::TrainOutput result = trainer.train();
//
// One optimizer step, as Trainer._run_epoch does it: `gradient_accumulation_steps` micro-batches
// of `per_device_train_batch_size` blocks (fewer at the end of an epoch), each loss =
// Σ token losses / num_items_in_batch, where num_items_in_batch counts the non-ignored shifted
// labels (labels[..., 1:] != -100) of *all* micro-batches of the step, so the step's loss is the
// mean over its tokens; backward after each micro-batch; then the global grad norm (clipped to
// `max_grad_norm`), AdamW with the scheduler's learning rate for this step, zero_grad. The logged
// loss is the sum of the micro-batch losses since the last log divided by the number of steps
// (Trainer's tr_loss / (global_step − last logged)); learning_rate is the rate the step used;
// grad_norm the norm before clipping.
//
// Nothing waits for the device between logs: losses stay on the device in a window that is read
// once per log (and before every save, so a non-finite loss is caught before it can reach a
// checkpoint: training stops with an error naming the step, and the last good checkpoint stays).
//
// Precision: the model's dtype throughout (bf16 parameters, gradients and moments for a bf16
// model), or `bf16` over an f32 model: the optimizer keeps f32 masters and moments, gradients are
// f32, the model is converted to bf16 for compute and refreshed from the masters after every step;
// checkpoints hold the f32 masters. Kernels: `use_liger_kernel` (and TrainerOptions::use_kernels,
// the hub's default mapping) kernelize the model in Mode::Training; kernelize_report() says what
// each layer trains on. Deliberately not here: evaluation, distributed training, fp16.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hk/error.h"
#include "hk/kernelize.h"
#include "hk/models.h"
#include "hk/stream.h"
#include "hk/train_checkpoint.h"
#include "hk/train_data.h"
#include "hk/training_args.h"

namespace hk {

struct TrainerOptions {
  // The model's directory: config.json, generation_config.json and tokenizer files are copied
  // into every checkpoint from here. Required unless save_strategy is "no" (a checkpoint without
  // config.json cannot be loaded by hk or Transformers).
  std::string model_dir;
  bool use_kernels = false;       // kernelize with the hub's default mapping (Mode::Training)
  std::shared_ptr<hub::Hub> hub;  // null: from the environment
  Stream stream;
  // Write output_dir/model.safetensors (+ configs, tokenizer) at the end, as save_model() does.
  bool save_final_model = true;
  // Write output_dir/loss_curve.svg at the end.
  bool plot_loss = true;
};

// One logged step: the log_history entry (step, epoch, loss, grad_norm, learning_rate) plus the
// throughput since the previous log — what `hk train --json` prints.
struct TrainLog : TrainerLogEntry {
  double tokens_per_s = 0;
};

// Called after every optimizer step (no device sync: `loss` is the last logged loss).
struct TrainProgress {
  int64_t step = 0;
  int64_t max_steps = 0;
  double epoch = 0;
  double last_loss = 0;  // NaN before the first log
  double learning_rate = 0;
  double tokens_per_s = 0;  // since the start of this run (host clock)
  double elapsed_s = 0;
  double eta_s = 0;
};

struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;  // mean step loss of this run
  double train_runtime_s = 0;
  double tokens_per_s = 0;
  int64_t tokens = 0;  // input tokens processed in this run
  std::vector<TrainLog> logs;
  std::string last_checkpoint;  // empty when none was written
  std::string resumed_from;     // the checkpoint resumed from, if any
};

// Training stopped because the loss became NaN/inf (an hk::Error: `hk train` exits 1 with it).
class NonFiniteLossError : public Error {
 public:
  NonFiniteLossError(const std::string& message, int64_t step) : Error(message), step_(step) {}
  int64_t step() const { return step_; }

 private:
  int64_t step_;
};

class Trainer {
 public:
  // Validates `args` (InvalidArgument with the flag name), checks that a block fits the model's
  // context, switches the model to training, applies the precision recipe and kernelizes.
  Trainer(CausalLM& model, TrainingArguments args, BlockDataset data, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to max_steps (or num_train_epochs), resuming from args.resume_from_checkpoint when set
  // ("latest" = the newest complete checkpoint-N of output_dir). A checkpoint of another model,
  // other data or another batch layout is refused with a sentence.
  TrainOutput train();

  // The Training-mode kernelize decisions (null when neither Liger nor use_kernels was asked for).
  const KernelizeReport* kernelize_report() const;
  // Notes on Liger switches that did not apply to this model (e.g. "layer_norm: ...").
  const std::vector<std::string>& liger_notes() const;
  const TrainingArguments& args() const;
  // Total optimizer steps of the run and the micro-batches per epoch.
  int64_t max_steps() const;
  int64_t steps_in_epoch() const;

  std::function<void(const TrainLog&)> on_log;
  std::function<void(const TrainProgress&)> on_step;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hk
