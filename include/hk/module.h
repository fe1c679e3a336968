// hk/module.h — the module tree: named children, dotted paths, parameters, buffers, train/eval,
// device/dtype moves, and loading a state dict through a checkpoint-key mapping.
//
// A model is a tree of Modules built from its config *without allocating*: each parameter is
// declared with its shape and stays undefined until `load_state_dict` fills it (or `to()` moves
// it). Paths are dotted like Transformers' (`model.layers.0.mlp.gate_proj.weight`), so checkpoint
// keys map onto the tree one to one; a KeyMapping renames or drops checkpoint keys first (the hook
// that kernel layouts use to read the original checkpoint into their own parameter names).
//
// The kernelize hook: a module that is a *layer* carries a registered layer-interface name
// (`RMSNorm`, `MLP`, `rotary_pos_emb`, `attention`, `Linear`, `SiLU`, `Embedding`,
// `ForCausalLMLoss`) and a replaceable implementation object (a `LayerImpl` subclass defined per
// interface in hk/layers.h). Its forward always goes through that object, which defaults to the
// built-in ops; `set_impl()` swaps it at run time without touching model code.
//
// Training: each parameter slot also holds its gradient (`grad`, `requires_grad`). Layer backward
// implementations reach it through `grad_target` / `accumulate_grad`, which follow ties, so a tied
// lm_head adds into the embedding's gradient. This header knows nothing about specific layers and
// does no arithmetic beyond filling and adding gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hk/device.h"
#include "hk/dtype.h"
#include "hk/tensor.h"

namespace hk::nn {

// Base of every replaceable layer implementation (the built-in one or a kernel adapter).
class LayerImpl {
 public:
  virtual ~LayerImpl() = default;
  // What this implementation is, for reports: "builtin" or e.g. "org/repo:Entry".
  virtual std::string name() const = 0;
  // True when it has a training forward and a backward (hk/layers.h); a training forward through
  // a layer whose implementation has none is refused before anything runs, naming the layer.
  virtual bool supports_training() const { return false; }
};

// One parameter or buffer slot of a module.
struct Parameter {
  Shape shape;   // declared shape (from the config); checked against the checkpoint
  Tensor value;  // undefined until loaded / materialised
  bool is_buffer = false;
  bool persistent = true;  // false: computed, never read from a checkpoint
  // Non-empty: this parameter shares storage with the parameter at this dotted path (tied
  // embeddings); it is not expected in the checkpoint and is ignored when present. Its gradient
  // goes to that parameter's `grad` (one gradient per storage: the sum of both uses).
  std::string tied_to;
  // Training: undefined until a backward writes it, then the value's shape and dtype (or the
  // shape and dtype of a tensor a trainer put here first, e.g. f32 for master weights). Backward
  // accumulates into it; zero_grad clears it.
  Tensor grad;
  // Training: `grad`'s buffer is kept but its values are stale (CausalLM::zero_grad_lazily); the
  // next gradient into it is written instead of added (grad_target clears the flag), and a
  // backward that gave it none zero-fills it when it finishes.
  bool grad_overwrite = false;
  bool requires_grad = true;  // false for buffers; a trainer may freeze parameters
};

class Module {
 public:
  // `type_name` is the class name shown in reports ("Qwen3RMSNorm"); `layer_interface` is the
  // kernelize registry name, empty for containers that are not replaceable layers.
  explicit Module(std::string type_name, std::string layer_interface = "");
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }
  const std::string& layer_interface() const { return layer_interface_; }

  // ---- the kernelize hook -------------------------------------------------------------------
  // The current implementation (null for containers).
  virtual std::shared_ptr<LayerImpl> impl() const { return nullptr; }
  // Replaces the implementation. Throws InvalidArgument when `impl` does not implement this
  // module's layer interface (or the module has none).
  virtual void set_impl(std::shared_ptr<LayerImpl> impl);
  // Back to the built-in implementation.
  virtual void reset_impl() {}

  // ---- tree -------------------------------------------------------------------------------
  // Adds a child; returns it for convenient typed members. Names are unique per parent.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    add_child(name, child);
    return child;
  }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // Every module in the subtree, depth first, self first with `prefix` as its path.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  // The module at a dotted path below this one ("" = this); null when absent.
  Module* find_module(const std::string& path);

  // ---- parameters and buffers ----------------------------------------------------------------
  void register_parameter(const std::string& name, Shape shape);
  void register_buffer(const std::string& name, Shape shape, bool persistent = true);
  // Declares `name` (new, or an already declared parameter of the same shape) as sharing storage
  // with the parameter at `target_path` (a dotted path from the root of the tree).
  void tie_parameter(const std::string& name, Shape shape, std::string target_path);
  bool has_parameter(const std::string& name) const { return params_.count(name) != 0; }
  // The slot; throws InvalidArgument naming the module and the known names when absent.
  Parameter& slot(const std::string& name);
  const Parameter& slot(const std::string& name) const;
  // The tensor; throws InvalidArgument when the parameter was never loaded.
  const Tensor& param(const std::string& name) const;
  const std::map<std::string, Parameter>& local_parameters() const { return params_; }
  // Every parameter and buffer in the subtree with its dotted path (buffers included).
  std::vector<std::pair<std::string, Parameter*>> named_parameters(const std::string& prefix = "",
                                                                   bool include_buffers = true);
  // Number of parameter elements in the subtree (buffers and tied duplicates excluded).
  int64_t num_parameters();

  // ---- gradients (training; used by layer backward implementations) --------------------------
  // Where a backward puts the gradient of this module's parameter `name`: the parameter's own
  // slot, or for a tied parameter the slot of the parameter it is tied to. `grad` is undefined
  // when that parameter does not require a gradient (the caller then skips it). When the slot had
  // no gradient yet, it gets a new tensor of the value's shape and dtype: zeros when
  // `zero_if_new`, else uninitialised with `accumulate` false, and the caller must then *write*
  // every element (a GEMM with beta 0) instead of adding to it. A kept buffer marked
  // `grad_overwrite` is handed out the same way (zero-filled when `zero_if_new`), once.
  struct GradTarget {
    Tensor grad;
    bool accumulate = false;
  };
  GradTarget grad_target(const std::string& name, bool zero_if_new = false,
                         Stream stream = {}) const;
  // Adds `g` (the parameter's shape; any float dtype) to the gradient of `name`. When there is
  // none yet and `g` has the value's dtype, `g` itself becomes the gradient (no copy): the caller
  // must not write to it afterwards. No-op when the parameter does not require a gradient.
  void accumulate_grad(const std::string& name, const Tensor& g, Stream stream = {}) const;
  // Whether the gradient slot of `name` (ties followed) wants a gradient; allocates nothing.
  bool requires_grad(const std::string& name) const { return gradient_slot(name).requires_grad; }

  // ---- mode and placement ----------------------------------------------------------------------
  // Sets training mode on the subtree (and returns *this); eval() == train(false).
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Moves / converts every materialised floating parameter and buffer of the subtree (and their
  // gradients). Tied parameters keep sharing storage. dtype nullopt keeps each tensor's dtype.
  Module& to(Device device, std::optional<DType> dtype = std::nullopt);

 protected:
  // Called on every module of the subtree by train()/eval() (kernelize re-binds here later).
  virtual void on_train(bool /*training*/) {}

 private:
  friend void resolve_ties(Module& root);
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  // The slot that receives the gradient of local parameter `name` (ties followed).
  Parameter& gradient_slot(const std::string& name) const;

  std::string type_name_;
  std::string layer_interface_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::map<std::string, Parameter> params_;
  // Tied local parameter name -> the slot it is tied to (set by resolve_ties).
  std::map<std::string, Parameter*> tie_targets_;
  bool training_ = false;
};

// Points every tied parameter of the tree at its target's tensor.
void resolve_ties(Module& root);

// ---- state dicts -----------------------------------------------------------------------------

// A read-only set of named tensors: a checkpoint (one or several safetensors files) or an
// in-memory map in tests.
class StateDictSource {
 public:
  virtual ~StateDictSource() = default;
  virtual std::vector<std::string> keys() const = 0;
  virtual Shape shape(const std::string& key) const = 0;
  // An owning copy on `device`, converted to `dtype` when given. Throws hk::Error for corrupt
  // data or a dtype hk cannot compute with.
  virtual Tensor load(const std::string& key, Device device, std::optional<DType> dtype,
                      Stream stream) const = 0;
  // Where the tensors come from, for error messages ("checkpoint DIR").
  virtual std::string describe() const = 0;
};

// An in-memory StateDictSource (tests, converted weights).
class TensorMapSource : public StateDictSource {
 public:
  explicit TensorMapSource(std::map<std::string, Tensor> tensors,
                           std::string description = "state dict")
      : tensors_(std::move(tensors)), description_(std::move(description)) {}
  std::vector<std::string> keys() const override;
  Shape shape(const std::string& key) const override;
  Tensor load(const std::string& key, Device device, std::optional<DType> dtype,
              Stream stream) const override;
  std::string describe() const override { return description_; }

 private:
  const Tensor& at(const std::string& key) const;
  std::map<std::string, Tensor> tensors_;
  std::string description_;
};

// Checkpoint key -> model parameter path. Returning nullopt drops the key (it is then neither
// loaded nor reported as unexpected). The identity mapping is the default.
using KeyMapping = std::function<std::optional<std::string>(const std::string& checkpoint_key)>;

struct LoadStateOptions {
  KeyMapping key_mapping;         // empty = identity
  Device device = Device::cpu();  // where parameters are placed
  std::optional<DType>
      dtype;  // floating tensors are converted to it; nullopt = keep the checkpoint dtype
  // Checkpoint keys (after mapping) with one of these suffixes are silently ignored when they
  // have no slot in the tree (e.g. `rotary_emb.inv_freq` written by old Transformers versions).
  std::vector<std::string> ignore_unexpected_suffixes;
  Stream stream;
};

// Loads every persistent parameter/buffer of `root` from `source`. Throws InvalidArgument listing
// the missing tensors (first few + count), the unexpected ones, or the first shape mismatch with
// both shapes; nothing is partially loaded in those cases (checks run before any copy).
void load_state_dict(Module& root, const StateDictSource& source,
                     const LoadStateOptions& options = {});

}  // namespace hk::nn
