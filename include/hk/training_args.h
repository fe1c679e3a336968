// hk/training_args.h — TrainingArguments: Transformers' field names and defaults (5.x), the subset
// a causal-LM Trainer uses, plus Liger's kernel switches turned into a KernelConfig.
//
// `hk train` spells every field as a flag with dashes (--per-device-train-batch-size ...).
// Differences from Transformers, on purpose:
//   - `warmup_ratio` (Transformers 4) is kept beside 5.x's fractional `warmup_steps`.
//   - `logging_nan_inf_filter` does not exist: a NaN/inf loss stops training with the step
//     number (the last good checkpoint stays) instead of being averaged away.
//   - `optim` is always AdamW (torch's, see hk/optim.h); `save_strategy` is "steps" or "no".
//   - `shuffle` (false = `--no-shuffle`) is hk's: blocks in file order.
// Liger: `liger_kernel_config` keys are rope, swiglu, geglu, cross_entropy,
// fused_linear_cross_entropy, rms_norm, layer_norm; unset keys take Liger's defaults for the model
// (apply_liger_kernel_to_qwen3 / _llama: rope, rms_norm, swiglu and fused_linear_cross_entropy on,
// cross_entropy off; geglu and layer_norm are not part of those functions and default off).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hk/kernel_config.h"

namespace hk {

struct TrainingArguments {
  std::string output_dir;
  int64_t per_device_train_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;  // 0 disables clipping (the norm is still logged)
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 overrides num_train_epochs
  std::string lr_scheduler_type = "linear";
  double warmup_steps = 0;     // ≥ 1: steps; in (0, 1): ratio of the total (Transformers 5)
  double warmup_ratio = 0;     // Transformers 4's field, used when warmup_steps is 0
  double logging_steps = 500;  // ≥ 1: every N steps; in (0, 1): ratio of the total
  bool logging_first_step = false;
  std::string save_strategy = "steps";  // "steps" or "no"
  double save_steps = 500;              // ≥ 1 or a ratio in (0, 1)
  std::optional<int64_t> save_total_limit;
  uint64_t seed = 42;
  bool bf16 = false;  // an f32 model: f32 master weights and moments, bf16 compute
  bool gradient_checkpointing = false;
  bool use_liger_kernel = false;
  std::map<std::string, bool> liger_kernel_config;  // empty = Liger's defaults
  std::string resume_from_checkpoint;               // "", a checkpoint dir, or "latest"
  bool shuffle = true;                              // hk: false = blocks in file order
  bool disable_tqdm = false;                        // no progress bar even on a TTY

  // Throws InvalidArgument with the field's flag name for a value out of range.
  void validate() const;
  // Steps from a value that may be a ratio (logging_steps, save_steps): ceil(total · v) for
  // v < 1, else v.
  static int64_t steps_from(double value, int64_t total_steps);
};

// The Liger switches after defaults (see the header comment).
struct LigerKernelConfig {
  bool rope = true;
  bool swiglu = true;
  bool geglu = false;
  bool cross_entropy = false;
  bool fused_linear_cross_entropy = true;
  bool rms_norm = true;
  bool layer_norm = false;

  static const std::vector<std::string>& known_keys();
  // Liger's defaults with `overrides` applied. Throws InvalidArgument for an unknown key (naming
  // the known ones) and when cross_entropy and fused_linear_cross_entropy are both true.
  static LigerKernelConfig resolve(const std::map<std::string, bool>& overrides);
  // "rope=true,swiglu=false,..." (true/false/1/0/yes/no, case-insensitive). Throws
  // InvalidArgument naming the malformed item.
  static std::map<std::string, bool> parse(std::string_view text);

  // The KernelConfig (inherit_mapping false: only these layers change) of
  // kernels-community/liger-kernels (version 3) entries for the enabled switches that apply to a
  // model with `hidden_act` (swiglu for silu MLPs, geglu for gelu ones). Each switch maps to a
  // layer interface: rope → rotary_pos_emb:LigerRope, rms_norm → RMSNorm:LigerRMSNorm,
  // swiglu/geglu → MLP:LigerSwiGLUMLP/LigerGEGLUMLP, layer_norm → LayerNorm:LigerLayerNorm,
  // cross_entropy → ForCausalLMLoss:LigerForCausalLMLoss, fused_linear_cross_entropy →
  // ForCausalLMLoss:LigerFusedLinearCrossEntropyLoss.
  // Switches whose layer the model does not have (`model_layers`: the layer-interface names
  // present, empty = assume all) are left out and listed in `skipped` with the reason.
  KernelConfig kernel_config(const std::vector<std::string>& model_layers = {},
                             const std::string& hidden_act = "silu",
                             std::vector<std::string>* skipped = nullptr) const;
  // "rope=true,swiglu=true,..." in known_keys order.
  std::string str() const;
};

}  // namespace hk
