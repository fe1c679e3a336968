// RMSNorm (incl. Qwen3's per-head q_norm/k_norm) and its built-in implementation (ops::rms_norm,
// which matches Transformers' f32 normalisation and rounding order).
#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinRMSNorm final : public RMSNormImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const RMSNorm& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    ops::rms_norm(x, layer.weight(), static_cast<float>(layer.eps()), y, nullptr, stream);
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
