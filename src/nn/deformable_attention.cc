// MultiScaleDeformableAttention (hk/deformable_attention.h) and its built-in implementation,
// hk::ops::ms_deform_attn / ms_deform_attn_backward.
#include "hk/deformable_attention.h"

#include "hk/error.h"

namespace hk::nn {
namespace {

class BuiltinMultiScaleDeformableAttention final : public MultiScaleDeformableAttentionImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const MultiScaleDeformableAttention&, const TensorView& value,
               const SpatialShapes& spatial_shapes, const TensorView& sampling_locations,
               const TensorView& attention_weights, const TensorView& out,
               Stream stream) const override {
    ops::ms_deform_attn(value, spatial_shapes, sampling_locations, attention_weights, out, stream);
  }
  void backward(const MultiScaleDeformableAttention&, const TensorView& dout,
                const TensorView& value, const SpatialShapes& spatial_shapes,
                const TensorView& sampling_locations, const TensorView& attention_weights,
                const TensorView* dvalue, const TensorView* dsampling_locations,
                const TensorView* dattention_weights, Stream stream) const override {
    ops::ms_deform_attn_backward(dout, value, spatial_shapes, sampling_locations, attention_weights,
                                 dvalue, dsampling_locations, dattention_weights, stream);
  }
};

}  // namespace

MultiScaleDeformableAttention::MultiScaleDeformableAttention(int32_t im2col_step)
    : LayerModule("MultiScaleDeformableAttention", "MultiScaleDeformableAttention",
                  std::make_shared<BuiltinMultiScaleDeformableAttention>()),
      im2col_step_(im2col_step) {
  HK_CHECK(im2col_step > 0, "MultiScaleDeformableAttention: im2col_step must be positive");
}

}  // namespace hk::nn
