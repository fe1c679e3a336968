// RMSNorm (incl. Qwen3's per-head q_norm/k_norm) and its built-in implementation (ops::rms_norm,
// which matches Transformers' f32 normalisation and rounding order). Training keeps only the f32
// rstd per row; backward (ops::rms_norm_backward) takes x back from the caller.
#include "hk/error.h"
#include "hk/layers.h"
#include "nn/param_grad.h"

namespace hk::nn {
namespace {

class BuiltinRMSNorm final : public RMSNormImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const RMSNorm& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    ops::rms_norm(x, layer.weight(), static_cast<float>(layer.eps()), y, nullptr, stream);
  }
  bool supports_training() const override { return true; }
  void forward_train(const RMSNorm& layer, const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream stream) const override {
    Tensor rstd =
        Tensor::empty({x.numel() / layer.dim()}, statistics_dtype(x.dtype()), x.device(), stream);
    ops::rms_norm(x, layer.weight(), static_cast<float>(layer.eps()), y, &rstd.view(), stream);
    ctx.save("rstd", rstd);
  }
  void backward(const RMSNorm& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    const Tensor& w = layer.weight();
    const Tensor& rstd = ctx.saved("rstd");
    ParamGradWriter dw(layer, "weight", {w.dtype(), DType::F32}, false, stream);
    ops::rms_norm_backward(dy, x, w, static_cast<float>(layer.eps()), &rstd.view(), dx, dw.view(),
                           dw.accumulate(), stream);
    dw.commit();
  }
};

}  // namespace

RMSNorm::RMSNorm(std::string type_name, int64_t dim, double eps)
    : LayerModule(std::move(type_name), "RMSNorm", std::make_shared<BuiltinRMSNorm>()),
      dim_(dim),
      eps_(eps) {
  HK_CHECK(dim > 0, "RMSNorm: dim must be positive");
  register_parameter("weight", {dim});
}

}  // namespace hk::nn
