// hk/deformable_attention.h — Deformable DETR's multi-scale deformable attention core as a layer:
// `MultiScaleDeformableAttention` (layer interface multi_scale_deformable_attention@1, the name
// Transformers registers and its default table maps to kernels-community/deformable-detr).
//
// Like Transformers' module of that name it holds no parameters: the projections producing
// value, sampling offsets and attention weights belong to the surrounding attention block. Its
// forward and backward go through the bound implementation (the built-in hk::ops::ms_deform_attn
// or a hub kernel), so kernelize can swap it like any layer. hk has no DETR model; the layer is
// for models and programs that compose it themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "hk/layers.h"

namespace hk::nn {

// (height, width) of each feature level, in the order of value's rows.
using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;

class MultiScaleDeformableAttention;
class MultiScaleDeformableAttentionImpl : public LayerImpl {
 public:
  // value [B, S, H, D], sampling_locations [B, Q, H, L, P, 2] in [0, 1], attention_weights
  // [B, Q, H, L, P] (one floating dtype), out [B, Q, H·D].
  virtual void forward(const MultiScaleDeformableAttention& layer, const TensorView& value,
                       const SpatialShapes& spatial_shapes, const TensorView& sampling_locations,
                       const TensorView& attention_weights, const TensorView& out,
                       Stream stream) const = 0;
  // Gradients for dout [B, Q, H·D]; each output may be null (not wanted).
  virtual void backward(const MultiScaleDeformableAttention& layer, const TensorView& dout,
                        const TensorView& value, const SpatialShapes& spatial_shapes,
                        const TensorView& sampling_locations, const TensorView& attention_weights,
                        const TensorView* dvalue, const TensorView* dsampling_locations,
                        const TensorView* dattention_weights, Stream stream) const = 0;
};

class MultiScaleDeformableAttention : public LayerModule<MultiScaleDeformableAttentionImpl> {
 public:
  // im2col_step: Transformers' argument (a batching hint of the original CUDA kernel); kept for
  // kernels that use it, it never changes the result.
  explicit MultiScaleDeformableAttention(int32_t im2col_step = 64);
  int32_t im2col_step() const { return im2col_step_; }

  void forward(const TensorView& value, const SpatialShapes& spatial_shapes,
               const TensorView& sampling_locations, const TensorView& attention_weights,
               const TensorView& out, Stream stream = {}) const {
    typed_impl().forward(*this, value, spatial_shapes, sampling_locations, attention_weights, out,
                         stream);
  }
  void backward(const TensorView& dout, const TensorView& value,
                const SpatialShapes& spatial_shapes, const TensorView& sampling_locations,
                const TensorView& attention_weights, const TensorView* dvalue,
                const TensorView* dsampling_locations, const TensorView* dattention_weights,
                Stream stream = {}) const {
    typed_impl().backward(*this, dout, value, spatial_shapes, sampling_locations, attention_weights,
                          dvalue, dsampling_locations, dattention_weights, stream);
  }

 private:
  int32_t im2col_step_;
};

}  // namespace hk::nn
