// Internal (src/nn, src/kernelize): a buffer a backward op writes one parameter's gradient into.
//
// Ops write weight gradients in a fixed set of dtypes (linear_backward: the weight's; rms_norm:
// the weight's or f32). Usually the parameter's grad has one of them and the op writes (or, when
// a gradient is already there, accumulates) straight into it. When a trainer put a gradient of
// another dtype there (f32 master gradients for a bf16 model), the op writes a temporary that
// commit() adds into the gradient (or writes, when the gradient was handed out for writing). A
// frozen parameter (requires_grad false) gives no buffer.
#pragma once

#include <initializer_list>
#include <string>

#include "hk/module.h"
#include "hk/ops.h"

namespace hk::nn {

class ParamGradWriter {
 public:
  // `dtypes`: what the op can write, preferred first. `zero_if_new`: the op only adds (a
  // scatter), so a new buffer starts at zero and accumulate() is true.
  ParamGradWriter(const Module& module, const std::string& name,
                  std::initializer_list<DType> dtypes, bool zero_if_new, Stream stream)
      : module_(module), name_(name), stream_(stream) {
    Module::GradTarget target = module.grad_target(name, zero_if_new, stream);
    if (!target.grad.defined()) return;
    for (DType d : dtypes)
      if (d == target.grad.dtype()) {
        buffer_ = target.grad;
        accumulate_ = target.accumulate;
        return;
      }
    const DType d = *dtypes.begin();
    buffer_ = zero_if_new ? Tensor::zeros(target.grad.sizes(), d, target.grad.device(), stream)
                          : Tensor::empty(target.grad.sizes(), d, target.grad.device(), stream);
    accumulate_ = zero_if_new;
    temporary_ = true;
    target_ = target;
  }
  bool active() const { return buffer_.defined(); }
  const Tensor& buffer() const { return buffer_; }
  const TensorView* view() const { return active() ? &buffer_.view() : nullptr; }
  bool accumulate() const { return accumulate_; }
  // Adds a temporary buffer into the gradient, or writes it there when the gradient was handed
  // out for writing (nothing to do without a temporary).
  void commit() {
    if (temporary_) {
      if (target_.accumulate)
        module_.accumulate_grad(name_, buffer_, stream_);
      else
        ops::cast(buffer_, target_.grad, stream_);
    }
    temporary_ = false;
  }

 private:
  const Module& module_;
  std::string name_;
  Stream stream_;
  Tensor buffer_;
  bool accumulate_ = false;
  bool temporary_ = false;
  Module::GradTarget target_;  // with a temporary: where commit() puts it, and how
};

}  // namespace hk::nn
