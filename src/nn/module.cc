// Module tree: children, dotted paths, parameter slots and their gradients, train/eval and
// device/dtype moves. State-dict loading lives in state_dict.cc; layers in their own files.
#include "hk/module.h"

#include <algorithm>
#include <sstream>

#include "hk/error.h"
#include "hk/ops.h"

namespace hk::nn {

Module::Module(std::string type_name, std::string layer_interface)
    : type_name_(std::move(type_name)), layer_interface_(std::move(layer_interface)) {}

Module::~Module() = default;

void Module::set_impl(std::shared_ptr<LayerImpl> impl) {
  if (layer_interface_.empty())
    throw InvalidArgument("module " + type_name_ +
                          " is not a replaceable layer (it has no layer interface)");
  throw InvalidArgument("implementation '" + (impl ? impl->name() : std::string("null")) +
                        "' does not implement the layer interface '" + layer_interface_ +
                        "' of module " + type_name_);
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  HK_CHECK(child != nullptr, "register_module: child '" + name + "' is null");
  HK_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "register_module: bad child name '" + name + "' (non-empty, no dots)");
  for (const auto& [n, c] : children_)
    HK_CHECK(n != name, "register_module: " + type_name_ + " already has a child '" + name + "'");
  HK_CHECK(params_.count(name) == 0,
           "register_module: '" + name + "' is already a parameter of " + type_name_);
  children_.emplace_back(name, std::move(child));
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out;
  out.emplace_back(prefix, this);
  for (const auto& [name, child] : children_) {
    auto sub = child->named_modules(prefix.empty() ? name : prefix + "." + name);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

Module* Module::find_module(const std::string& path) {
  if (path.empty()) return this;
  auto dot = path.find('.');
  std::string head = path.substr(0, dot);
  for (const auto& [name, child] : children_) {
    if (name == head)
      return dot == std::string::npos ? child.get() : child->find_module(path.substr(dot + 1));
  }
  return nullptr;
}

void Module::register_parameter(const std::string& name, Shape shape) {
  HK_CHECK(params_.count(name) == 0, type_name_ + " already has a parameter '" + name + "'");
  Parameter p;
  p.shape = std::move(shape);
  params_.emplace(name, std::move(p));
}

void Module::register_buffer(const std::string& name, Shape shape, bool persistent) {
  HK_CHECK(params_.count(name) == 0, type_name_ + " already has a buffer '" + name + "'");
  Parameter p;
  p.shape = std::move(shape);
  p.is_buffer = true;
  p.persistent = persistent;
  p.requires_grad = false;
  params_.emplace(name, std::move(p));
}

void Module::tie_parameter(const std::string& name, Shape shape, std::string target_path) {
  auto existing = params_.find(name);
  if (existing != params_.end()) {  // turn a declared parameter into a tied one
    HK_CHECK(existing->second.shape == shape, type_name_ + "." + name + ": tied shape " +
                                                  shape_str(shape) + " differs from the declared " +
                                                  shape_str(existing->second.shape));
    existing->second.tied_to = std::move(target_path);
    existing->second.value = Tensor();
    return;
  }
  Parameter p;
  p.shape = std::move(shape);
  p.tied_to = std::move(target_path);
  params_.emplace(name, std::move(p));
}

Parameter& Module::slot(const std::string& name) {
  return const_cast<Parameter&>(static_cast<const Module*>(this)->slot(name));
}

const Parameter& Module::slot(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) {
    std::string known;
    for (const auto& [n, p] : params_) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("module " + type_name_ + " has no parameter '" + name +
                          "' (it has: " + (known.empty() ? "none" : known) + ")");
  }
  return it->second;
}

const Tensor& Module::param(const std::string& name) const {
  const Parameter& p = slot(name);
  if (!p.value.defined())
    throw InvalidArgument("parameter '" + name + "' of " + type_name_ +
                          " is not loaded yet; load the checkpoint (from_pretrained or "
                          "load_state_dict) before running the model");
  return p.value;
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters(const std::string& prefix,
                                                                         bool include_buffers) {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (auto& [name, module] : named_modules(prefix)) {
    for (auto& [pname, p] : module->params_) {
      if (p.is_buffer && !include_buffers) continue;
      out.emplace_back(name.empty() ? pname : name + "." + pname, &p);
    }
  }
  return out;
}

int64_t Module::num_parameters() {
  int64_t total = 0;
  for (auto& [path, p] : named_parameters("", false)) {
    if (!p->tied_to.empty()) continue;
    int64_t n = 1;
    for (int64_t d : p->shape) n *= d;
    total += n;
  }
  return total;
}

Parameter& Module::gradient_slot(const std::string& name) const {
  const Parameter& own = slot(name);
  if (own.tied_to.empty()) return const_cast<Parameter&>(own);
  auto it = tie_targets_.find(name);
  if (it == tie_targets_.end())
    throw InvalidArgument("parameter '" + name + "' of " + type_name_ + " is tied to " +
                          own.tied_to + " but the ties were not resolved (load the model first)");
  return *it->second;
}

Module::GradTarget Module::grad_target(const std::string& name, bool zero_if_new,
                                       Stream stream) const {
  // Gradients are the mutable training state of a parameter, not part of the module's
  // structure, so const layers (backward implementations) may write them.
  Parameter& p = gradient_slot(name);
  GradTarget target;
  if (!p.requires_grad) return target;
  if (!p.value.defined())
    throw InvalidArgument("parameter '" + name + "' of " + type_name_ +
                          " is not loaded, so it cannot get a gradient");
  if (p.grad.defined()) {
    HK_CHECK(p.grad.sizes() == p.value.sizes() && p.grad.device() == p.value.device(),
             "the gradient of parameter '" + name + "' of " + type_name_ + " is " +
                 p.grad.view().str() + ", but the parameter is " + p.value.view().str() +
                 "; zero_grad() before training after changing the model");
    target.grad = p.grad;
    target.accumulate = true;
    if (p.grad_overwrite) {  // stale values: the first gradient of this backward writes
      p.grad_overwrite = false;
      if (zero_if_new)
        ops::fill(p.grad, 0.0, stream);
      else
        target.accumulate = false;
    }
    return target;
  }
  p.grad = zero_if_new ? Tensor::zeros(p.value.sizes(), p.value.dtype(), p.value.device(), stream)
                       : Tensor::empty(p.value.sizes(), p.value.dtype(), p.value.device(), stream);
  target.grad = p.grad;
  target.accumulate = zero_if_new;
  return target;
}

void Module::accumulate_grad(const std::string& name, const Tensor& g, Stream stream) const {
  Parameter& p = gradient_slot(name);
  if (!p.requires_grad) return;
  HK_CHECK(p.value.defined() && g.sizes() == p.value.sizes(),
           "accumulate_grad: gradient " + g.view().str() + " does not match parameter '" + name +
               "' of " + type_name_);
  if (!p.grad.defined() && g.dtype() == p.value.dtype() && g.is_contiguous() &&
      g.device() == p.value.device()) {
    p.grad = g;
    return;
  }
  GradTarget target = grad_target(name, /*zero_if_new=*/false, stream);
  if (!target.accumulate) {
    ops::cast(g, target.grad, stream);
    return;
  }
  Tensor addend = g;
  if (g.dtype() != target.grad.dtype()) {  // e.g. a bf16 gradient into f32 master gradients
    addend = Tensor::empty(g.sizes(), target.grad.dtype(), g.device(), stream);
    ops::cast(g, addend, stream);
  }
  ops::add(target.grad, addend, target.grad, 1.0f, stream);
}

Module& Module::train(bool on) {
  for (auto& [path, module] : named_modules()) {
    module->training_ = on;
    module->on_train(on);
  }
  return *this;
}

Module& Module::to(Device device, std::optional<DType> dtype) {
  for (auto& [path, p] : named_parameters()) {
    if (!p->tied_to.empty() || !p->value.defined()) continue;
    Tensor t = p->value;
    DType target = (dtype && is_floating(t.dtype())) ? *dtype : t.dtype();
    if (target != t.dtype()) {
      // Convert where the data is, then move (casts on the source device are always available).
      Tensor converted = Tensor::empty(t.sizes(), target, t.device());
      ops::cast(t, converted);
      t = converted;
    }
    if (t.device() != device) t = t.to(device);
    p->value = t;
    if (p->grad.defined()) {  // gradients follow their parameter, as in torch's Module.to
      Tensor g = p->grad;
      if (target != g.dtype() && is_floating(g.dtype()) && dtype) {
        Tensor converted = Tensor::empty(g.sizes(), target, g.device());
        ops::cast(g, converted);
        g = converted;
      }
      if (g.device() != device) g = g.to(device);
      p->grad = g;
    }
  }
  resolve_ties(*this);
  return *this;
}

void resolve_ties(Module& root) {
  for (auto& [path, p] : root.named_parameters()) {
    if (p->tied_to.empty()) continue;
    auto dot = p->tied_to.rfind('.');
    Module* owner = root.find_module(dot == std::string::npos ? "" : p->tied_to.substr(0, dot));
    std::string name = dot == std::string::npos ? p->tied_to : p->tied_to.substr(dot + 1);
    if (owner == nullptr || !owner->has_parameter(name))
      throw InvalidArgument("parameter " + path + " is tied to " + p->tied_to +
                            ", which does not exist in the model");
    p->value = owner->slot(name).value;
    p->grad = Tensor();  // the gradient lives in the target's slot
  }
  for (auto& [path, module] : root.named_modules()) {
    module->tie_targets_.clear();
    for (auto& [name, p] : module->params_) {
      if (p.tied_to.empty()) continue;
      auto dot = p.tied_to.rfind('.');
      Module* owner = root.find_module(dot == std::string::npos ? "" : p.tied_to.substr(0, dot));
      module->tie_targets_[name] =
          &owner->slot(dot == std::string::npos ? p.tied_to : p.tied_to.substr(dot + 1));
    }
  }
}

}  // namespace hk::nn
