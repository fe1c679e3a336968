// AdamW (hk/optim.h): state allocation, the CPU update loop, the CUDA dispatch to the fused
// multi-tensor kernel, and checkpoint state.
//
// Deliberately one step count for all tensors (torch keeps one per parameter; they differ only
// when a parameter misses gradients on some steps, which causal-LM training never does), and no
// amsgrad / maximize / capturable variants: HF Trainer's default AdamW uses none of them.
#include <algorithm>
#include <cmath>
#include <map>

#include "hk/error.h"
#include "hk/ops.h"
#include "hk/optim.h"
#include "ops/cpu_util.h"
#include "train/optim/adamw_math.h"
#include "train/optim/grad_norm_cpu.h"
#ifdef HK_HAVE_CUDA
#include "train/optim/optim_cuda.h"
#endif

namespace hk::optim {

struct AdamW::Impl {
  std::vector<OptimTensor> tensors;
  AdamWOptions options;
  std::vector<Tensor> exp_avg, exp_avg_sq, master;  // master[i] undefined without master weights
  int64_t steps = 0;
  Device device;
  GradNorm norm;     // clip_grad_norm's results, reused
  Tensor partials;   // CUDA: per-chunk Σg², reused
#ifdef HK_HAVE_CUDA
  std::unique_ptr<cuda::TensorTable> table;
  std::vector<cuda::TensorSlot> slots() const;
#endif

  // The tensor the update writes: the master when there is one, else the model's value.
  const Tensor& target(size_t i) const {
    return master[i].defined() ? master[i] : *tensors[i].value;
  }
  void step_cpu(double lr, const Tensor* grad_scale);
};

namespace {

void check_hyperparameters(const AdamWOptions& o) {
  HK_CHECK(o.lr >= 0, "AdamW: learning rate must be >= 0, got " + std::to_string(o.lr));
  HK_CHECK(o.eps >= 0, "AdamW: epsilon must be >= 0, got " + std::to_string(o.eps));
  HK_CHECK(o.beta1 >= 0 && o.beta1 < 1,
           "AdamW: adam_beta1 must be in [0, 1), got " + std::to_string(o.beta1));
  HK_CHECK(o.beta2 >= 0 && o.beta2 < 1,
           "AdamW: adam_beta2 must be in [0, 1), got " + std::to_string(o.beta2));
  HK_CHECK(o.weight_decay >= 0,
           "AdamW: weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
}

}  // namespace

AdamW::AdamW(std::vector<OptimTensor> tensors, AdamWOptions options, Stream stream)
    : impl_(std::make_unique<Impl>()) {
  check_hyperparameters(options);
  Impl& s = *impl_;
  s.options = options;
  s.tensors = std::move(tensors);
  bool first = true;
  for (const OptimTensor& t : s.tensors) {
    HK_CHECK(t.value != nullptr && t.grad != nullptr,
             "AdamW: parameter '" + t.name + "' has no value/grad slots");
    HK_CHECK(t.value->defined(), "AdamW: parameter '" + t.name +
                                     "' is not materialised; load the model's weights first");
    HK_CHECK(is_floating(t.value->dtype()) && t.value->dtype() != DType::F64,
             "AdamW: parameter '" + t.name + "' has dtype " + dtype_name(t.value->dtype()) +
                 "; AdamW updates f32, bf16 or f16 tensors");
    HK_CHECK(t.value->is_contiguous(), "AdamW: parameter '" + t.name + "' is not contiguous");
    if (first) s.device = t.value->device();
    HK_CHECK(t.value->device() == s.device, "AdamW: parameter '" + t.name + "' is on " +
                                                t.value->device().str() + ", others on " +
                                                s.device.str() + "; keep the model on one device");
    first = false;
    const bool master = options.master_weights;
    const DType state_dtype = master ? DType::F32 : t.value->dtype();
    s.exp_avg.push_back(Tensor::zeros(t.value->sizes(), state_dtype, s.device, stream));
    s.exp_avg_sq.push_back(Tensor::zeros(t.value->sizes(), state_dtype, s.device, stream));
    if (master) {
      Tensor m = Tensor::empty(t.value->sizes(), DType::F32, s.device, stream);
      ops::cast(*t.value, m, stream);
      s.master.push_back(m);
    } else {
      s.master.emplace_back();
    }
  }
  if (!s.device.is_cpu() && !s.device.is_cuda())
    throw Unsupported("AdamW: no implementation for device " + s.device.str());
#ifndef HK_HAVE_CUDA
  if (s.device.is_cuda()) throw Unsupported("AdamW: hk was built without CUDA");
#endif
}

AdamW::~AdamW() = default;
AdamW::AdamW(AdamW&&) noexcept = default;
AdamW& AdamW::operator=(AdamW&&) noexcept = default;

int64_t AdamW::steps() const {
  return impl_->steps;
}
const AdamWOptions& AdamW::options() const {
  return impl_->options;
}
const std::vector<OptimTensor>& AdamW::tensors() const {
  return impl_->tensors;
}

void AdamW::Impl::step_cpu(double lr, const Tensor* grad_scale) {
  const detail::AdamWScalars sc = detail::adamw_scalars(lr, options.beta1, options.beta2,
                                                        options.eps, options.weight_decay, steps);
  const float scale = grad_scale ? grad_scale->data_as<float>()[0] : 1.0f;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& g = *tensors[i].grad;
    if (!g.defined()) continue;
    const Tensor& p = target(i);
    HK_CHECK(same_shape(g, p) && g.is_contiguous(),
             "AdamW: gradient of '" + tensors[i].name + "' is " + g.view().str() +
                 ", expected a contiguous tensor shaped like the parameter " + p.view().str());
    const Tensor& value = *tensors[i].value;
    char* pp = static_cast<char*>(p.view().ptr());
    char* mp = static_cast<char*>(exp_avg[i].view().ptr());
    char* vp = static_cast<char*>(exp_avg_sq[i].view().ptr());
    const char* gp = static_cast<const char*>(g.view().ptr());
    char* copy = master[i].defined() ? static_cast<char*>(value.view().ptr()) : nullptr;
    const size_t ps = dtype_size(p.dtype()), ss = dtype_size(exp_avg[i].dtype()),
                 gs = dtype_size(g.dtype()), cs = dtype_size(value.dtype());
    const bool decay = tensors[i].weight_decay;
    const int64_t n = p.numel();
    for (int64_t e = 0; e < n; ++e) {
      float pv = ops::cpu::load_one<float>(pp + e * ps, p.dtype());
      float mv = ops::cpu::load_one<float>(mp + e * ss, exp_avg[i].dtype());
      float vv = ops::cpu::load_one<float>(vp + e * ss, exp_avg_sq[i].dtype());
      const float gv = ops::cpu::load_one<float>(gp + e * gs, g.dtype()) * scale;
      detail::adamw_update(pv, mv, vv, gv, decay, sc);
      ops::cpu::store_one<float>(pp + e * ps, p.dtype(), pv);
      ops::cpu::store_one<float>(mp + e * ss, exp_avg[i].dtype(), mv);
      ops::cpu::store_one<float>(vp + e * ss, exp_avg_sq[i].dtype(), vv);
      if (copy) ops::cpu::store_one<float>(copy + e * cs, value.dtype(), pv);
    }
  }
}

#ifdef HK_HAVE_CUDA
std::vector<cuda::TensorSlot> AdamW::Impl::slots() const {
  std::vector<cuda::TensorSlot> out;
  out.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& g = *tensors[i].grad;
    const Tensor& p = target(i);
    cuda::TensorSlot s;
    s.param = p.view().ptr();
    s.numel = p.numel();
    s.param_dtype = p.dtype();
    s.exp_avg = exp_avg[i].view().ptr();
    s.exp_avg_sq = exp_avg_sq[i].view().ptr();
    s.state_dtype = exp_avg[i].dtype();
    s.decay = tensors[i].weight_decay ? 1 : 0;
    if (g.defined()) {
      HK_CHECK(same_shape(g, p) && g.is_contiguous() && g.device() == device,
               "AdamW: gradient of '" + tensors[i].name + "' is " + g.view().str() +
                   ", expected a contiguous tensor shaped like the parameter " + p.view().str());
      s.grad = g.view().ptr();
      s.grad_dtype = g.dtype();
    }
    if (master[i].defined()) {
      s.model_copy = tensors[i].value->view().ptr();
      s.model_dtype = tensors[i].value->dtype();
    }
    out.push_back(s);
  }
  return out;
}
#endif

void AdamW::step(double lr, const Tensor* grad_scale, Stream stream) {
  Impl& s = *impl_;
  HK_CHECK(lr >= 0 && std::isfinite(lr), "AdamW::step: learning rate must be finite and >= 0");
  if (grad_scale)
    HK_CHECK(grad_scale->dtype() == DType::F32 && grad_scale->numel() == 1 &&
                 grad_scale->device() == s.device,
             "AdamW::step: grad_scale must be an f32 scalar on " + s.device.str() + ", got " +
                 grad_scale->view().str());
  ++s.steps;
  if (s.device.is_cpu()) {
    s.step_cpu(lr, grad_scale);
    return;
  }
#ifdef HK_HAVE_CUDA
  if (!s.table) s.table = std::make_unique<cuda::TensorTable>(s.device);
  s.table->update(s.slots(), stream);
  cuda::adamw_step(*s.table,
                   detail::adamw_scalars(lr, s.options.beta1, s.options.beta2, s.options.eps,
                                         s.options.weight_decay, s.steps),
                   grad_scale ? grad_scale->data_as<float>() : nullptr, stream);
#endif
}

GradNorm AdamW::clip_grad_norm(double max_norm, Stream stream) {
  Impl& s = *impl_;
  HK_CHECK(std::isfinite(max_norm), "clip_grad_norm: max_norm must be finite");
  if (!s.norm.norm.defined()) {
    s.norm.norm = Tensor::zeros({1}, DType::F32, s.device, stream);
    s.norm.clip_coef = Tensor::zeros({1}, DType::F32, s.device, stream);
  }
  if (s.device.is_cpu()) {
    detail::grad_norm_cpu(s.tensors, max_norm, s.norm.norm.data_as<float>(),
                          s.norm.clip_coef.data_as<float>());
    return s.norm;
  }
#ifdef HK_HAVE_CUDA
  if (!s.table) s.table = std::make_unique<cuda::TensorTable>(s.device);
  s.table->update(s.slots(), stream);
  const int64_t chunks = std::max<int64_t>(1, s.table->num_chunks());
  if (!s.partials.defined() || s.partials.numel() < chunks)
    s.partials = Tensor::empty({chunks}, DType::F32, s.device, stream);
  cuda::grad_norm(*s.table, s.partials.data_as<float>(), max_norm, s.norm.norm.data_as<float>(),
                  s.norm.clip_coef.data_as<float>(), stream);
#endif
  return s.norm;
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  const Impl& s = *impl_;
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    out.emplace_back("exp_avg." + s.tensors[i].name, s.exp_avg[i]);
    out.emplace_back("exp_avg_sq." + s.tensors[i].name, s.exp_avg_sq[i]);
    if (s.master[i].defined()) out.emplace_back("master." + s.tensors[i].name, s.master[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps,
                       Stream stream) {
  Impl& s = *impl_;
  HK_CHECK(steps >= 0, "AdamW::load_state: step count must be >= 0");
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  const auto mine = state();
  for (const auto& [name, dst] : mine) {  // check everything before copying anything
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw InvalidArgument("optimizer state has no tensor '" + name +
                            "'; it was saved for a different model or optimizer setting");
    if (it->second->sizes() != dst.sizes())
      throw InvalidArgument("optimizer state tensor '" + name + "' is " +
                            shape_str(it->second->sizes()) + ", the model needs " +
                            shape_str(dst.sizes()));
  }
  for (const auto& [name, dst] : mine) {
    const Tensor& src = *by_name[name];
    Tensor on_device = src.device() == dst.device() ? src : src.to(dst.device(), stream);
    ops::cast(on_device, dst, stream);
  }
  s.steps = steps;
}

void AdamW::refresh_model_from_master(Stream stream) {
  Impl& s = *impl_;
  for (size_t i = 0; i < s.tensors.size(); ++i)
    if (s.master[i].defined()) ops::cast(s.master[i], *s.tensors[i].value, stream);
}

}  // namespace hk::optim
