// Activation adapters (see activation_binding.h), forward and, for training, backward through the
// entry's backward. The attrs say which function the module computes (ActivationAttrs::kind); a
// kernel that computes another refuses the call. The gated
// product uses the library's "<act>_and_mul" entry (kernels-community/activation ships
// silu_and_mul, gelu_and_mul, gelu_tanh_and_mul) when it exists for this device and layout, else
// the activation followed by ops::mul — both round act(gate) to the dtype before the product, as
// Transformers' MLP does.
#include "kernelize/activation_binding.h"

#include <cctype>

#include "hk/error.h"
#include "hk/layer_interfaces.h"
#include "hk/ops.h"
#include "kernelize/adapters.h"

namespace hk::kernel_binding {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The act_and_mul@1 entry of the activation's function, by kernels-community/activation's names.
const char* gated_entry_name(ops::Activation kind) {
  switch (kind) {
    case ops::Activation::SiLU:
      return "silu_and_mul";
    case ops::Activation::GELU:
      return "gelu_and_mul";
    case ops::Activation::GELUTanh:
      return "gelu_tanh_and_mul";
    case ops::Activation::QuickGELU:
      return nullptr;
  }
  return nullptr;
}

class ActivationAdapter final : public nn::ActivationImpl, public CaptureDeclaring {
 public:
  ActivationAdapter(std::string name, KernelFunction fn, KernelFunction gated)
      : name_(std::move(name)), fn_(std::move(fn)), gated_(std::move(gated)) {}
  std::string name() const override { return name_; }
  // Both entries it may call must be capture-safe (the gated one is used by forward_mul).
  bool declares_capture() const override {
    return fn_.entry().supports_mode(kKernelModeCapture) &&
           (!gated_.valid() || gated_.entry().supports_mode(kKernelModeCapture));
  }

  void forward(const nn::Activation& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    KernelCallOptions options;
    options.stream = stream;
    if (fn_.entry().interface == "silu") {
      fn_.forward({x}, {y}, SiluAttrs{}, options);
      return;
    }
    ActivationAttrs attrs;
    attrs.kind = activation_code(layer.kind());
    fn_.forward({x}, {y}, attrs, options);
  }

  bool supports_training() const override { return fn_.entry().has_backward; }
  void backward(const nn::Activation& layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                Stream stream) const override {
    KernelCallOptions options;
    options.stream = stream;
    if (fn_.entry().interface == "silu") {
      fn_.backward({dy, x}, {dx}, SiluAttrs{}, options);
      return;
    }
    ActivationAttrs attrs;
    attrs.kind = activation_code(layer.kind());
    fn_.backward({dy, x}, {dx}, attrs, options);
  }
  // out = round(act(gate))·up, composed as in forward (and as autograd sees Transformers' MLP):
  // dup = dout·round(act(gate)), dgate = act'(gate)·round(dout·up). dgate/dup may alias gate/up.
  // (The fused act_and_mul backward rounds once, not like autograd, so it is not used here.)
  void backward_mul(const nn::Activation& layer, const Tensor& gate, const Tensor& up,
                    const Tensor& dout, const Tensor& dgate, const Tensor& dup,
                    Stream stream) const override {
    Tensor act = Tensor::empty(gate.sizes(), gate.dtype(), gate.device(), stream);
    Tensor dact = Tensor::empty(gate.sizes(), gate.dtype(), gate.device(), stream);
    forward(layer, gate, act, stream);
    ops::mul(dout, up, dact, stream);  // before dup may overwrite up
    ops::mul(dout, act, dup, stream);
    backward(layer, gate, dact, act, stream);  // act := dgate (gate is still intact)
    copy_view(dgate, act, stream);
  }

  void forward_mul(const nn::Activation& layer, const TensorView& gate, const TensorView& up,
                   const TensorView& out, Stream stream) const override {
    if (gated_.valid()) {
      KernelCallOptions options;
      options.stream = stream;
      ActAndMulAttrs attrs;
      attrs.kind = activation_code(layer.kind());
      try {
        gated_.forward({gate, up}, {out}, attrs, options);
        return;
      } catch (const Unsupported&) {
        // A layout the fused entry does not take (checked before any work): compose instead.
      }
    }
    forward(layer, gate, out, stream);
    ops::mul(out, up, out, stream);
  }

 private:
  std::string name_;
  KernelFunction fn_, gated_;
};

}  // namespace

bool is_activation_layer(const std::string& layer) {
  for (const char* name : {"SiLU", "GeLU", "GeluTanh", "NewGELU", "FastGELU", "QuickGELU"})
    if (layer == name) return true;
  return false;
}

uint32_t activation_code(ops::Activation kind) {
  switch (kind) {
    case ops::Activation::SiLU:
      return kActivationSiLU;
    case ops::Activation::GELU:
      return kActivationGELU;
    case ops::Activation::GELUTanh:
      return kActivationGELUTanh;
    case ops::Activation::QuickGELU:
      return kActivationQuickGELU;
  }
  return kActivationSiLU;
}

std::optional<uint32_t> activation_entry_kind(const std::string& entry_name) {
  const std::string n = lower(entry_name);
  if (n == "silu") return kActivationSiLU;
  if (n == "gelu") return kActivationGELU;
  if (n == "gelutanh" || n == "newgelu" || n == "fastgelu") return kActivationGELUTanh;
  if (n == "quickgelu") return kActivationQuickGELU;
  return std::nullopt;
}

std::shared_ptr<nn::LayerImpl> make_activation_adapter(const nn::Activation& module,
                                                       KernelFunction fn,
                                                       const std::string& display_name) {
  KernelFunction gated;
  if (const char* gated_name = gated_entry_name(module.kind())) {
    const KernelEntryInfo* e = fn.library()->find_entry(gated_name);
    if (e && e->interface == "act_and_mul") gated = fn.library()->function(gated_name);
  }
  return std::make_shared<ActivationAdapter>(display_name, std::move(fn), std::move(gated));
}

}  // namespace hk::kernel_binding
