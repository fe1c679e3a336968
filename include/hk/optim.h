// hk/optim.h — AdamW and global grad-norm clipping, as torch's AdamW and clip_grad_norm_ that
// Hugging Face's Trainer uses.
//
//   hk::optim::AdamW opt(tensors, {.lr = 5e-5, .weight_decay = 0.01});
//   hk::optim::GradNorm norm = opt.clip_grad_norm(/*max_norm=*/1.0);  // device scalars
//   opt.step(scheduler.lr(step), &norm.clip_coef);                    // no host sync
//
// Update (torch.optim.AdamW, decoupled weight decay, bias-corrected), per element in f32:
//   p ← p·(1 − lr·wd)                   (only for tensors in the decay group)
//   m ← m + (1 − β1)·(g − m)            v ← β2·v + (1 − β2)·g²
//   p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)
// g is the gradient times `grad_scale` (the clipping coefficient) when one is given. The scalars
// are computed on the host in double from the step count (which the host knows), so a step needs
// no device-to-host transfer. Parameters, gradients and the two moments may each be f32, bf16 or
// f16: every element is widened to f32, updated, and rounded once on store — a bf16 model trains
// with bf16 parameters, gradients and moments. With `master_weights` the optimizer keeps f32
// copies of the parameters and f32 moments; the model's (16-bit) tensors are rewritten from the
// master after every step (the `--bf16` recipe over an f32 checkpoint).
//
// CPU: plain loops. CUDA: one fused multi-tensor kernel over every tensor (a chunk table uploaded
// only when tensor addresses change), plus two small kernels for the norm (per-chunk partial sums,
// then one block that sums them in a fixed order: deterministic, no atomics). Once the table is on
// the device, AdamW::clip_grad_norm and AdamW::step only launch kernels: no allocation, no copy,
// no synchronisation (they can be captured in a CUDA graph).
//
// Decay groups follow Trainer.get_decay_parameter_names: no weight decay for a parameter whose
// lower-cased dotted path matches `bias`, `layernorm`, `rmsnorm`, `(^|\.)norm($|\.)` or
// `_norm($|\.)`, or that lives in a LayerNorm module. This header does not schedule the learning
// rate (hk/lr_scheduler.h) or own the gradients (the model's nn::Parameter::grad does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hk/module.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk::optim {

// One tensor the optimizer updates: the parameter's value and gradient, read at every step (the
// gradient may be reallocated between steps; an undefined gradient is skipped, as torch skips
// parameters whose .grad is None).
struct OptimTensor {
  std::string name;  // dotted path, the key of its state in checkpoints
  Tensor* value = nullptr;
  Tensor* grad = nullptr;
  bool weight_decay = true;  // member of the decay group
};

// Trainer.get_decay_parameter_names' rule for one parameter path (see above).
bool excluded_from_weight_decay(const std::string& path, const std::string& module_type = "");

// The trainable parameters of a module tree (requires_grad, tied storage once under the name of
// the parameter it is tied to, buffers excluded) with the decay rule applied, in the tree's
// parameter order — for a CausalLM, `trainable_parameters(model.module())`.
std::vector<OptimTensor> trainable_parameters(nn::Module& root);

// Result of clip_grad_norm: f32 scalars ([1]) on the gradients' device. Reading them on the host
// (Tensor::to(Device::cpu())) is the only synchronisation, done when the norm is logged.
struct GradNorm {
  Tensor norm;       // global L2 norm of all gradients, before clipping
  Tensor clip_coef;  // min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0
};

struct AdamWOptions {
  double lr = 1e-3;  // used by step() when no lr is passed
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // for the decay group; the other group has 0
  // Keep f32 master parameters (copied from the values at construction) and f32 moments; the
  // model's tensors, which may be converted to 16 bits afterwards, are rewritten from the masters
  // after every step.
  bool master_weights = false;
};

class AdamW {
 public:
  // Moments are allocated (zeros) on the parameters' devices, in the parameter dtype, or f32 with
  // master_weights (master copies are taken from the current values). Throws InvalidArgument for
  // a tensor that is not floating or not materialised, or out-of-range hyperparameters.
  AdamW(std::vector<OptimTensor> tensors, AdamWOptions options, Stream stream = {});
  ~AdamW();
  AdamW(AdamW&&) noexcept;
  AdamW& operator=(AdamW&&) noexcept;

  // One update with learning rate `lr` (the scheduler's value for this step). `grad_scale`: an f32
  // scalar on the parameters' device multiplying every gradient (clip_grad_norm's clip_coef), or
  // null. Enqueued on `stream`; never blocks the host on CUDA.
  void step(double lr, const Tensor* grad_scale = nullptr, Stream stream = {});
  // The global gradient norm over this optimizer's tensors and the clipping coefficient (see
  // hk::optim::clip_grad_norm), in buffers the optimizer owns: the result is overwritten by the
  // next call.
  GradNorm clip_grad_norm(double max_norm, Stream stream = {});
  // Number of completed steps (torch's state["step"]).
  int64_t steps() const;
  const AdamWOptions& options() const;
  const std::vector<OptimTensor>& tensors() const;

  // The state for checkpoints: "exp_avg.<name>", "exp_avg_sq.<name>" and, with master weights,
  // "master.<name>" (views of the live tensors).
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores state() from `tensors` (same names, shapes; dtypes converted) and the step count.
  // Throws InvalidArgument naming a missing or mis-shaped tensor; nothing changes then.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps,
                  Stream stream = {});
  // With master weights: rewrites the model's tensors from the masters (after load_state).
  void refresh_model_from_master(Stream stream = {});

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// torch.nn.utils.clip_grad_norm_ without modifying the gradients: the coefficient is applied by
// AdamW::step (grad_scale), which reads each gradient once anyway. Undefined gradients are
// skipped. All gradients must be on one device.
GradNorm clip_grad_norm(const std::vector<OptimTensor>& tensors, double max_norm,
                        Stream stream = {});

}  // namespace hk::optim
