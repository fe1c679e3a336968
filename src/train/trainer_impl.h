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

namespace hk::dist {
class GradientReducer;
class ZeroOptimizer;
}  // namespace hk::dist

namespace hk::train_detail {

struct TrainerImpl {
  TrainerImpl(CausalLM& model, TrainingArguments args, BlockDataset data, TrainerOptions options);
  ~TrainerImpl();

  CausalLM& model;
  TrainingArguments args;
  BlockDataset data;
  TrainerOptions options;

  std::vector<optim::OptimTensor> tensors;  // trainable parameters, decay groups marked
  std::unique_ptr<optim::AdamW> optimizer;  // one process, or data parallel without ZeRO

  // Data parallel (trainer_distributed.cc): null group = one process.
  std::shared_ptr<dist::ProcessGroup> group;
  int rank = 0, world = 1;
  std::unique_ptr<dist::GradientReducer> reducer;
  std::unique_ptr<dist::ZeroOptimizer> zero;  // ZeRO-1: replaces `optimizer`
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
  int64_t window_reduced = 0;  // data parallel: slots already summed over the ranks
  std::chrono::steady_clock::time_point window_start;
  int64_t bad_loss_step = std::numeric_limits<int64_t>::max();

  TrainOutput train(const std::function<void(const TrainLog&)>& on_log,
                    const std::function<void(const TrainProgress&)>& on_step);

  // trainer_distributed.cc: the group's set-up and the optimizer calls that differ with ZeRO.
  void plan_data_parallel(DType grad_dtype_after, DType value_dtype_after,
                          const optim::AdamWOptions& adamw);
  void attach_data_parallel();
  bool is_main() const { return rank == 0; }
  // This rank's blocks of `epoch`, in visiting order.
  std::vector<int64_t> rank_order(int64_t epoch) const;
  optim::GradNorm clip_gradients();
  void optimizer_step(double lr, const Tensor* clip_coef);
  int64_t optimizer_steps() const;
  // The full optimizer state (a collective with ZeRO: every rank calls it).
  std::vector<std::pair<std::string, Tensor>> optimizer_state();
  void load_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& state,
                            int64_t steps);
  // After weights were loaded into the model (resume): ZeRO's buffers take them back.
  void after_weights_loaded();
  void refresh_model_from_master();
  void barrier();

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
  std::vector<std::pair<std::string, Tensor>> model_weights(
      const std::vector<std::pair<std::string, Tensor>>& optimizer_state) const;
  // Copies config.json, generation_config.json and the tokenizer files of options.model_dir.
  void copy_model_files(CheckpointWriter* writer, const std::string& dir) const;
};

}  // namespace hk::train_detail
