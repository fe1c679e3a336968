// The MultiScaleDeformableAttention adapter: the levels' (height, width) travel in the attribute
// struct (MsDeformAttnAttrs, host values), the tensors as the interface lists them — made
// contiguous first when they are not (strided outputs through a temporary copied back), since
// the interface lets kernels refuse other layouts; a workspace the entry asks for (e.g. an f32
// accumulator for a 16-bit dvalue) comes from the caching allocator per call.
#include "kernelize/deformable_binding.h"

#include "hk/error.h"
#include "hk/layer_interfaces.h"
#include "kernelize/adapters.h"

namespace hk::kernel_binding {
namespace {

MsDeformAttnAttrs attrs_of(const nn::MultiScaleDeformableAttention& layer,
                           const nn::SpatialShapes& shapes) {
  if (shapes.empty() || shapes.size() > kMaxDeformableLevels)
    throw InvalidArgument("MultiScaleDeformableAttention: the kernel interface takes 1 to " +
                          std::to_string(kMaxDeformableLevels) + " levels, got " +
                          std::to_string(shapes.size()));
  MsDeformAttnAttrs a;
  a.num_levels = static_cast<uint32_t>(shapes.size());
  a.im2col_step = layer.im2col_step();
  for (size_t l = 0; l < shapes.size(); ++l) {
    a.spatial_shapes[l][0] = shapes[l].first;
    a.spatial_shapes[l][1] = shapes[l].second;
  }
  return a;
}

class DeformableAttentionAdapter final : public nn::MultiScaleDeformableAttentionImpl,
                                         public CaptureDeclaring {
 public:
  DeformableAttentionAdapter(std::string name, KernelFunction fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  bool declares_capture() const override { return fn_.entry().supports_mode(kKernelModeCapture); }

  void forward(const nn::MultiScaleDeformableAttention& layer, const TensorView& value,
               const nn::SpatialShapes& spatial_shapes, const TensorView& sampling_locations,
               const TensorView& attention_weights, const TensorView& out,
               Stream stream) const override {
    call(false, {value, sampling_locations, attention_weights}, {out},
         attrs_of(layer, spatial_shapes), stream);
  }
  void backward(const nn::MultiScaleDeformableAttention& layer, const TensorView& dout,
                const TensorView& value, const nn::SpatialShapes& spatial_shapes,
                const TensorView& sampling_locations, const TensorView& attention_weights,
                const TensorView* dvalue, const TensorView* dsampling_locations,
                const TensorView* dattention_weights, Stream stream) const override {
    auto given = [](const TensorView* t) { return t ? *t : TensorView{}; };
    call(true, {dout, value, sampling_locations, attention_weights},
         {given(dvalue), given(dsampling_locations), given(dattention_weights)},
         attrs_of(layer, spatial_shapes), stream);
  }

 private:
  void call(bool backward, std::vector<TensorView> inputs, std::vector<TensorView> outputs,
            const MsDeformAttnAttrs& attrs, Stream stream) const {
    std::vector<Tensor> keep;
    for (TensorView& v : inputs)
      if (v.ptr() && !v.is_contiguous()) {
        keep.push_back(Tensor::wrap(v).contiguous(stream));
        v = keep.back().view();
      }
    std::vector<std::pair<TensorView, Tensor>> copy_back;
    for (TensorView& v : outputs)
      if (v.ptr() && !v.is_contiguous()) {
        Tensor temp = Tensor::empty(v.sizes(), v.dtype, v.device, stream);
        copy_back.emplace_back(v, temp);
        v = temp.view();
      }
    call_kernel_pass(fn_, backward, inputs, outputs, &attrs, sizeof(attrs), stream);
    for (auto& [target, temp] : copy_back) copy_view(target, temp.view(), stream);
  }

  std::string name_;
  KernelFunction fn_;
};

}  // namespace

std::shared_ptr<nn::LayerImpl> make_deformable_attention_adapter(
    const nn::MultiScaleDeformableAttention& module, KernelFunction fn,
    const std::string& display_name) {
  (void)module;
  return std::make_shared<DeformableAttentionAdapter>(display_name, std::move(fn));
}

}  // namespace hk::kernel_binding
