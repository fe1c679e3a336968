// hk/models.h — causal language models (Qwen3, Llama, Qwen3-MoE) and
// AutoModelForCausalLM::from_pretrained.
//
// A CausalLM is a handle to a module tree (root: `<Arch>ForCausalLM` with children `model` and
// `lm_head`) plus its configs. `from_pretrained(dir, options)` reads config.json, builds the tree
// for its `model_type` without allocating, then loads `model.safetensors` or the shards listed in
// `model.safetensors.index.json` on the requested device and dtype. With `use_kernels`, a
// `kernel_config` (implies use_kernels, with a note on stderr) or an `attn_implementation` that is
// not a built-in attention function, the loaded model goes through hk::kernelize (Inference, or
// Inference | Capture with `kernelize_capture`); `train()` / `eval()` then re-kernelize for
// Training / Inference (keeping Capture).
//
// Training mirrors Transformers: `model.train(); auto out = model.forward(ids, {.labels = labels});
// out.loss.backward();` then every trainable parameter's `grad` (named_parameters()) holds the
// gradient, added to what was there. A forward records a tape only in training mode with labels;
// eval forwards keep nothing. There is no autograd graph: the tape is the list of layer calls of
// that forward (ARCHITECTURE.md "Training"), walked in reverse by backward and released by it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hk/generation.h"
#include "hk/kernel_config.h"
#include "hk/kernelize.h"
#include "hk/model_config.h"
#include "hk/module.h"
#include "hk/tensor.h"

namespace hk {

struct LoadOptions {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:1"
  std::optional<DType> dtype;  // nullopt = "auto": config's dtype, else the checkpoint's
  // kernelize (hk/kernelize.h):
  bool use_kernels = false;                   // bind hub kernels with the default mapping
  std::optional<KernelConfig> kernel_config;  // implies use_kernels
  std::string kernel_config_file;             // KernelConfig JSON file (implies use_kernels)
  // "" = "eager"; "sdpa" built in; "flash_attention_2|3|4" or a hub id go through kernelize.
  std::string attn_implementation;
  bool allow_all_kernels = false;
  // kernelize with Mode::Capture too (Inference | Capture; train() keeps it: Training | Capture):
  // only kernels that declare CUDA-graph safety are bound, the rest fall back with the reason, so
  // generate's CUDA graph can run every bound kernel. `hk generate --device cuda` sets it.
  bool kernelize_capture = false;
  // Kernel supply chain (docs/security.md), applied by kernelize here and again by train()/eval():
  // every hub kernel must be pinned by this hk.lock ("" = HK_KERNELS_LOCK, if set) unless
  // allow_unlocked_kernels; require_signed_kernels (or HK_REQUIRE_SIGNED=1) refuses kernels whose
  // metadata.json is not signed by a trusted publisher key of their org (HK_PUBLISHER_KEYS).
  std::string kernels_lock;
  bool allow_unlocked_kernels = false;
  bool require_signed_kernels = false;
  // Renames/drops checkpoint keys before load (kernel layouts); empty = identity.
  nn::KeyMapping key_mapping;
  // Called with the built, still unallocated tree right before the checkpoint loads: the place
  // where kernelize swaps in layouts (set_impl, re-declared parameters) so that the weights load
  // straight into the kernel's layout. Empty = nothing.
  std::function<void(nn::Module& root)> before_load;
};

struct ForwardOptions {
  Tensor position_ids;  // [B, S] i64 on any device; undefined = from the cache length and
                        // key_start (left padding) as generate does
  Tensor key_start;     // [B] i32/i64 on any device: left padding length per row; undefined = 0
  KVCache* cache = nullptr;    // null: no cache (attend over this call's tokens)
  int64_t logits_to_keep = 0;  // 0 = logits for every position, N = the last N positions
  Tensor labels;               // [B, S] i64 (-100 = ignore); defined -> loss is computed
  Stream stream;
  // > 0: loss = sum over non-ignored shifted labels / num_items_in_batch (Transformers'
  // ForCausalLMLoss with num_items_in_batch, for gradient accumulation), else the mean.
  int64_t num_items_in_batch = 0;
  // MoE models (Qwen3-MoE): in a training forward with labels, add router_aux_loss_coef × the
  // router load-balancing loss to the loss, as Transformers does; nullopt = the config's
  // output_router_logits. Eval forwards never add it.
  std::optional<bool> output_router_logits;
};

class TrainingTape;  // what a training forward recorded (src/models)

// The f32 [1] loss of a forward with labels. After a training forward (model.train()) it carries
// the tape of that forward.
class Loss : public Tensor {
 public:
  Loss() = default;
  explicit Loss(Tensor value, std::shared_ptr<TrainingTape> tape = nullptr);
  // Walks the tape in reverse and ACCUMULATES d(loss) into every trainable Parameter::grad
  // (allocating zeros first), then releases the tape. Runs on `stream`; the default {} means the
  // forward's stream (ForwardOptions::stream). Throws InvalidArgument with what to do when there
  // is no tape (a forward in eval mode, or without labels) or backward already ran. Dropping
  // out.logits before backward (`out.logits = {}`) lets the logits-based loss write d(logits) over
  // them: one [tokens, vocab] buffer less at the peak.
  void backward(Stream stream = {}) const;
  // The same, calling `on_ready` (on the host, in the order backward reaches them) with
  // parameters whose gradients this backward has finished: a decoder layer's right after its
  // backward, the final norm's and an untied lm_head's after theirs, and the rest (the
  // embedding, which a tied lm_head adds into, and any parameter the backward did not reach,
  // after it was zero-filled) at the end. Every trainable parameter is reported exactly once;
  // the gradient work is enqueued on the stream, not finished, when it is reported. Data-parallel
  // training starts each bucket's all-reduce from here (hk/distributed.h).
  using GradientsReadyFn = std::function<void(const std::vector<nn::Parameter*>&)>;
  void backward(Stream stream, const GradientsReadyFn& on_ready) const;
  // True while a tape is attached and backward has not run.
  bool has_tape() const;

 private:
  friend class TrainingTape;  // reads the tape for memory accounting
  std::shared_ptr<TrainingTape> tape_;
};

struct CausalLMOutput {
  // [B, S or logits_to_keep, V] in the model dtype, on the model device; undefined when a fused
  // linear + cross-entropy loss (Liger's) made none in a training forward.
  Tensor logits;
  Loss loss;  // f32 [1] when labels were given
  // MoE models: the load-balancing loss (f32 [1], before router_aux_loss_coef) when a training
  // forward added it to `loss`; undefined otherwise.
  Tensor aux_loss;
};

class DecoderLM;  // the implementation shared by Qwen3 and Llama (src/models)

class CausalLM {
 public:
  CausalLM() = default;
  explicit CausalLM(std::shared_ptr<DecoderLM> impl);

  const ModelConfig& config() const;
  const GenerationConfig& generation_config() const;
  const LoadOptions& load_options() const;
  nn::Module& module() const;  // the root of the module tree
  Device device() const;
  DType dtype() const;

  // input_ids [B, S] i64/i32 (any device).
  CausalLMOutput forward(const Tensor& input_ids, const ForwardOptions& options = {}) const;
  CausalLMOutput forward(const Tensor& input_ids, const Tensor& labels) const;

  // One prompt or a batch of prompts of any lengths (left-padded internally).
  GenerateOutput generate(const std::vector<int64_t>& prompt,
                          const GenerateOptions& options = {}) const;
  GenerateOutput generate(const std::vector<std::vector<int64_t>>& prompts,
                          const GenerateOptions& options = {}) const;
  // input_ids [B, S] (i32/i64, any device): every row is a full prompt (no padding).
  GenerateOutput generate(const Tensor& input_ids, const GenerateOptions& options = {}) const;

  // Sets the mode; a kernelized model is re-kernelized for Training / Inference.
  CausalLM& train(bool on = true);
  CausalLM& eval() { return train(false); }
  bool is_training() const;
  CausalLM& to(Device device, std::optional<DType> dtype = std::nullopt);
  // The last kernelize decisions (null when the model was not kernelized).
  const KernelizeReport* kernelize_report() const;

  // ---- training ----------------------------------------------------------------------------
  // The parameters (no buffers) with their dotted Transformers names, in Transformers' order,
  // each storage once: a tied lm_head.weight is listed once, under model.embed_tokens.weight,
  // whose gradient is the sum of both uses. Frozen parameters (requires_grad = false) are listed
  // too, as torch lists them; backward leaves their grad undefined.
  std::vector<std::pair<std::string, nn::Parameter*>> named_parameters() const;
  // set_to_none: drop every gradient (the next backward allocates them); else fill with zeros.
  void zero_grad(bool set_to_none = true);
  // zero_grad(false) without the pass over every gradient: the buffers are kept and marked
  // (Parameter::grad_overwrite), and the next backward *writes* each gradient instead of adding
  // to it, zero-filling any it gives none when it finishes. After that backward the gradients
  // equal those of zero_grad(false) + backward; until then their values are undefined (do not
  // read them). The buffers, and the addresses the fused optimizer's table holds, stay.
  void zero_grad_lazily();
  // Keep only each decoder layer's input in a training forward and re-run the layer inside
  // backward (Transformers' gradient_checkpointing_enable).
  CausalLM& gradient_checkpointing_enable(bool on = true);
  bool is_gradient_checkpointing() const;

  DecoderLM& impl() const { return *impl_; }

 private:
  std::shared_ptr<DecoderLM> impl_;
};

class AutoModelForCausalLM {
 public:
  // dir holds config.json, model.safetensors (or model.safetensors.index.json + shards) and
  // optionally generation_config.json. Throws NotFound / InvalidArgument with the file named;
  // unknown model_type names itself and the supported ones.
  static CausalLM from_pretrained(const std::string& dir, const LoadOptions& options = {});
  // The tree for a config, unallocated (parameters are declared, not materialised).
  static CausalLM from_config(const ModelConfig& config, const LoadOptions& options = {});
  // Registered model types ("llama", "qwen3", "qwen3_moe").
  static std::vector<std::string> supported_model_types();
};

}  // namespace hk
