// hk/train_checkpoint.h — Trainer checkpoints on disk: Hugging Face Trainer's `checkpoint-N/`
// layout, written atomically, found, rotated; and `trainer_state.json` (HF's TrainerState).
//
// A checkpoint directory holds (files marked * are hk's own, documented in docs/training.md):
//   model.safetensors        the weights in Transformers' names (tied weights once, as
//                            save_pretrained writes them), metadata {"format": "pt"}
//   config.json, generation_config.json, tokenizer files   copied from the model directory
//   trainer_state.json       TrainerState (HF's fields only, so Transformers can read it)
//   optimizer.safetensors *  AdamW moments (exp_avg.<param>, exp_avg_sq.<param>, master.<param>)
//   optimizer.json *         step count, hyperparameters, decay groups (HF writes optimizer.pt, a
//                            torch pickle; hk writes safetensors + JSON instead)
//   scheduler.json *         the schedule and its position (HF: scheduler.pt)
//   rng_state.json *         the shuffle generator's seed and epoch (HF: rng_state.pth)
//   data_state.json *        the position in the data: epoch, micro-batches consumed, and a
//                            fingerprint of the blocks
//   training_args.json *     the TrainingArguments (HF: training_args.bin)
//   hk_checkpoint.json *     format version, model type and a fingerprint of the parameter names
//                            and shapes (a checkpoint of another model is refused by it)
// Atomicity: everything is written into a hidden sibling directory `.checkpoint-N.tmp-<pid>`,
// each file fsync'd, then the directory is renamed to `checkpoint-N` and the parent fsync'd. A
// process killed mid-save leaves at most the hidden directory (removed by the next save) and
// never a `checkpoint-N` that is incomplete. Rotation renames a checkpoint to a hidden name before
// deleting it, so an interrupted deletion is not a checkpoint either.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hk/tensor.h"

namespace hk {

// One entry of TrainerState.log_history (a logged step).
struct TrainerLogEntry {
  int64_t step = 0;
  double epoch = 0;
  double loss = 0;
  std::optional<double> grad_norm;
  double learning_rate = 0;
};

// Transformers' TrainerState (trainer_state.json), the fields hk fills.
struct TrainerState {
  double epoch = 0;
  int64_t global_step = 0;
  int64_t max_steps = 0;
  int64_t logging_steps = 500;
  int64_t eval_steps = 500;
  int64_t save_steps = 500;
  int64_t train_batch_size = 0;
  int64_t num_train_epochs = 0;
  int64_t num_input_tokens_seen = 0;
  double total_flos = 0;
  std::vector<TrainerLogEntry> log_history;

  // Pretty JSON with sorted keys, as TrainerState.save_to_json writes it.
  std::string to_json() const;
  // Throws InvalidArgument naming `source` for malformed JSON or fields of the wrong type.
  static TrainerState from_json(const std::string& text, const std::string& source);
};

// The `checkpoint-N` directories of `output_dir` (name matches ^checkpoint-(\d+)$), oldest step
// first; an absent directory gives none.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& output_dir);
// The checkpoint with the highest step that holds every file hk's resume needs; nullopt if none.
std::optional<std::string> last_checkpoint(const std::string& output_dir);
// Files `dir` lacks for an hk resume (empty = complete).
std::vector<std::string> missing_checkpoint_files(const std::string& dir);
// Deletes the oldest checkpoints beyond `limit` (save_total_limit), never `keep`.
void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep = "");
// Removes hidden leftovers of interrupted saves and deletions in `output_dir`.
void remove_stale_checkpoint_dirs(const std::string& output_dir);

// Writes one checkpoint atomically (see above).
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& output_dir, int64_t step);
  ~CheckpointWriter();  // removes the hidden directory unless commit() ran
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The hidden directory being filled.
  const std::string& staging_dir() const { return staging_; }
  void write_text(const std::string& name, const std::string& text);
  void write_tensors(const std::string& name,
                     const std::vector<std::pair<std::string, TensorView>>& tensors,
                     const std::map<std::string, std::string>& metadata = {});
  // Copies `source` (when it exists) under `name`.
  void copy_file(const std::string& source, const std::string& name);
  // Renames the staging directory to output_dir/checkpoint-N (replacing an existing one) and
  // returns that path.
  std::string commit();

 private:
  std::string output_dir_, staging_, final_;
  bool committed_ = false;
};

// Writes `text` to `path` through a temporary file in the same directory, fsync'd and renamed.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace hk
