// Internal: kernel layouts — the parameters a stateful or fused kernel holds in its own form (its
// `<Kernel>Layout`, hk_abi/hk_kernel.h), put in place of the replaced modules' parameters.
//
// On an unallocated tree (from_pretrained runs kernelize before the checkpoint loads) applying a
// layout re-declares the parameters in the kernel's shape, each with the ParameterSource that tells
// load_state_dict how to assemble it from the original checkpoint keys, and removes the originals:
// the weights load once, straight into the kernel's form. On a loaded tree (kernelize after
// from_pretrained, or a mode switch) the same step converts in place: a rename shares the tensor,
// a concatenation or transpose makes the new tensor and releases the originals. Reverting (the
// modules go back to the built-in implementation or to another kernel) is the inverse conversion:
// renames and dim-0 concatenations give the originals back as views, the rest as copies. The
// state lives on the replaced modules (Module::layout_state), so kernelizing again with the same
// layout changes nothing. Gradients of converted parameters are dropped (zero_grad state).
//
// Layout parameter names are dotted paths relative to the scope: the replaced module for a
// stateful kernel ("scale"), the fused modules' parent for a fusion ("mlp.gate_up_proj.weight").
// A new parameter lives on the deepest existing module along its path, under the rest of the path
// ("gate_up_proj.weight" on mlp), so named_parameters() shows the kernel's names. This file does
// not choose kernels or bind implementations (kernelize.cc, fusion.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hk/module.h"
#include "hk_abi/hk_kernel.h"

namespace hk::kernel_binding {

// A parameter a kernel is called with: the module that holds it and its local (maybe dotted) name.
struct ParamRef {
  const nn::Module* owner = nullptr;
  std::string name;
  const Tensor& value() const { return owner->param(name); }
};
using ParamRefs = std::vector<ParamRef>;

struct LayoutConversion {
  std::string target;
  std::vector<std::string> sources;
  uint32_t op = HK_CONVERT_RENAME;
  int dim = 0;
};

// An entry's layout, validated and copied out of the library.
struct LayoutSpec {
  std::string name;                     // "RMSNormMLPLayout"
  std::vector<std::string> parameters;  // call order, relative to the scope
  std::vector<LayoutConversion> conversions;
  const LayoutConversion* conversion_of(const std::string& parameter) const;
  // The layout's content (parameters and conversions): two layouts with the same content hold
  // interchangeable parameters.
  std::string content() const;
};

// The layout of an entry; a malformed one (null names, counts out of range, an unknown op, a
// conversion for a parameter it does not list) is nullopt with the reason in `why`.
std::optional<LayoutSpec> read_layout(const hk_layout& raw, std::string& why);

// Why `layout` cannot replace the parameters of `members` under `scope` ("" when it can): a
// source or plain parameter that does not exist, one outside the members, a tied parameter, a new
// name that collides, or sources whose shapes the conversion cannot join. `scope` and `members`
// must not hold another layout (they may hold this one).
std::string check_layout(const LayoutSpec& layout, nn::Module& root, nn::Module& scope,
                         const std::vector<nn::Module*>& members);

// What identifies one application: the layout's content at a scope over given members.
std::string layout_key(const LayoutSpec& layout, const std::string& scope_path,
                       const std::vector<std::string>& member_paths);
// The key recorded on `module` ("" when no layout replaced its parameters).
std::string applied_layout_key(const nn::Module& module);

struct AppliedLayout {
  ParamRefs parameters;    // in call order
  bool changed = false;    // false: it was already in place
  bool converted = false;  // true: converted loaded parameters in place (else re-declared)
};
// Applies `layout` at `scope` (its path from the root: checkpoint keys) for `members` (check_layout
// first). Already applied with the same key: returns its parameters, changes nothing. Throws
// InvalidArgument when some sources are loaded and others are not.
AppliedLayout apply_layout(const LayoutSpec& layout, nn::Module& scope,
                           const std::string& scope_path, const std::vector<nn::Module*>& members,
                           const std::string& key);
// Gives the modules of the layout recorded on `module` their original parameters back (loaded:
// by the inverse conversion) and clears the record on all of them. No-op without a record.
void revert_layout(nn::Module& module);

}  // namespace hk::kernel_binding
