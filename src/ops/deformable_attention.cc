// ms_deform_attn, ms_deform_attn_backward (multi-scale deformable attention, Deformable DETR):
// argument checks and device dispatch. The formula is multi_scale_deformable_attention@1's
// (hk/layer_interfaces.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;
using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;

namespace {

void check_problem(const Checker& ck, const TensorView& value, const SpatialShapes& shapes,
                   const TensorView& loc, const TensorView& weights) {
  ck.floating(value, "value");
  ck.rank(value, "value", 4);
  ck.rank(loc, "sampling_locations", 6);
  ck.rank(weights, "attention_weights", 5);
  ck.same_dtype(value, "value", loc, "sampling_locations");
  ck.same_dtype(value, "value", weights, "attention_weights");
  const int64_t b = value.shape[0], s = value.shape[1], h = value.shape[2];
  const int64_t l = static_cast<int64_t>(shapes.size());
  ck.require(l > 0, "spatial_shapes must name at least one level");
  int64_t total = 0;
  for (const auto& [hh, ww] : shapes) {
    ck.require(hh > 0 && ww > 0, "every level's height and width must be positive");
    total += hh * ww;
  }
  ck.require(total == s, "value has " + std::to_string(s) + " rows but the levels' h·w sum to " +
                             std::to_string(total));
  ck.require(loc.shape[0] == b && loc.shape[2] == h && loc.shape[3] == l && loc.shape[5] == 2,
             "sampling_locations must be [B, Q, H, L, P, 2] for value [B, S, H, D] and " +
                 std::to_string(l) + " levels");
  for (int d = 0; d < 5; ++d)
    ck.require(weights.shape[d] == loc.shape[d],
               "attention_weights must be [B, Q, H, L, P], the leading dims of sampling_locations");
}

void check_out(const Checker& ck, const TensorView& out, const char* name, const TensorView& value,
               const TensorView& loc) {
  ck.rank(out, name, 3);
  ck.same_dtype(out, name, value, "value");
  ck.require(out.shape[0] == value.shape[0] && out.shape[1] == loc.shape[1] &&
                 out.shape[2] == value.shape[2] * value.shape[3],
             std::string(name) + " must be [B, Q, H·D]");
}

}  // namespace

void ms_deform_attn(const TensorView& value, const SpatialShapes& spatial_shapes,
                    const TensorView& sampling_locations, const TensorView& attention_weights,
                    const TensorView& out, Stream stream) {
  const Checker ck("ms_deform_attn", {{"value", &value},
                                      {"sampling_locations", &sampling_locations},
                                      {"attention_weights", &attention_weights},
                                      {"out", &out}});
  check_problem(ck, value, spatial_shapes, sampling_locations, attention_weights);
  check_out(ck, out, "out", value, sampling_locations);
  HK_OPS_DISPATCH(ck, ms_deform_attn, value, spatial_shapes, sampling_locations, attention_weights,
                  out, stream);
}

void ms_deform_attn_backward(const TensorView& dout, const TensorView& value,
                             const SpatialShapes& spatial_shapes,
                             const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView* dvalue,
                             const TensorView* dsampling_locations,
                             const TensorView* dattention_weights, Stream stream) {
  const Checker ck("ms_deform_attn_backward", {{"dout", &dout},
                                               {"value", &value},
                                               {"sampling_locations", &sampling_locations},
                                               {"attention_weights", &attention_weights},
                                               {"dvalue", dvalue},
                                               {"dsampling_locations", dsampling_locations},
                                               {"dattention_weights", dattention_weights}});
  check_problem(ck, value, spatial_shapes, sampling_locations, attention_weights);
  check_out(ck, dout, "dout", value, sampling_locations);
  if (dvalue) {
    ck.same_shape(*dvalue, "dvalue", value, "value");
    ck.same_dtype(*dvalue, "dvalue", value, "value");
  }
  if (dsampling_locations) {
    ck.same_shape(*dsampling_locations, "dsampling_locations", sampling_locations,
                  "sampling_locations");
    ck.same_dtype(*dsampling_locations, "dsampling_locations", value, "value");
  }
  if (dattention_weights) {
    ck.same_shape(*dattention_weights, "dattention_weights", attention_weights,
                  "attention_weights");
    ck.same_dtype(*dattention_weights, "dattention_weights", value, "value");
  }
  HK_OPS_DISPATCH(ck, ms_deform_attn_backward, dout, value, spatial_shapes, sampling_locations,
                  attention_weights, dvalue, dsampling_locations, dattention_weights, stream);
}

}  // namespace hk::ops
