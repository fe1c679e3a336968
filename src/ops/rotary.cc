// rotary_tables, rotary_embedding, rotary_embedding_backward: argument checks and device dispatch.
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
// cos/sin [batch or 1, seq, head_dim] f32 (f64 also for f64 x: the CPU reference dtype).
void check_tables(const Checker& ck, const TensorView& x, const TensorView& cos,
                  const TensorView& sin) {
  ck.rank(x, "x", 4);
  ck.rank(cos, "cos", 3);
  ck.same_shape(cos, "cos", sin, "sin");
  ck.same_dtype(cos, "cos", sin, "sin");
  ck.require(cos.dtype == DType::F32 || (cos.dtype == DType::F64 && x.dtype == DType::F64),
             "cos and sin must be f32 (or f64 for an f64 x)");
  ck.require(x.shape[3] % 2 == 0, "head_dim must be even");
  ck.require((cos.shape[0] == x.shape[0] || cos.shape[0] == 1) && cos.shape[1] == x.shape[1] &&
                 cos.shape[2] == x.shape[3],
             "cos/sin must be [batch or 1, seq, head_dim] for x [batch, seq, heads, head_dim]");
}
}  // namespace

void rotary_tables(const TensorView& positions, int64_t head_dim, double theta,
                   float attention_scaling, const TensorView& cos, const TensorView& sin,
                   Stream stream) {
  const Checker ck("rotary_tables", {{"positions", &positions}, {"cos", &cos}, {"sin", &sin}});
  ck.integer_ids(positions, "positions");
  ck.rank(positions, "positions", 2);
  ck.require(head_dim > 0 && head_dim % 2 == 0,
             "head_dim must be positive and even, got " + std::to_string(head_dim));
  ck.require(theta > 0, "theta must be positive");
  ck.rank(cos, "cos", 3);
  ck.same_shape(cos, "cos", sin, "sin");
  ck.same_dtype(cos, "cos", sin, "sin");
  ck.float_dtype_in(cos, "cos", {DType::F32, DType::F64});
  ck.require(cos.shape[0] == positions.shape[0] && cos.shape[1] == positions.shape[1] &&
                 cos.shape[2] == head_dim,
             "cos/sin must be [batch, seq, head_dim] for positions [batch, seq]");
  HK_OPS_DISPATCH(ck, rotary_tables, positions, head_dim, theta, attention_scaling, cos, sin,
                  stream);
}

void rotary_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                      const TensorView& y, Stream stream) {
  const Checker ck("rotary_embedding", {{"x", &x}, {"cos", &cos}, {"sin", &sin}, {"y", &y}});
  ck.floating(x, "x");
  check_tables(ck, x, cos, sin);
  ck.same_shape(x, "x", y, "y");
  ck.same_dtype(x, "x", y, "y");
  HK_OPS_DISPATCH(ck, rotary_embedding, x, cos, sin, y, stream);
}

void rotary_embedding_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin,
                               const TensorView& dx, Stream stream) {
  const Checker ck("rotary_embedding_backward",
                   {{"dy", &dy}, {"cos", &cos}, {"sin", &sin}, {"dx", &dx}});
  ck.floating(dy, "dy");
  check_tables(ck, dy, cos, sin);
  ck.same_shape(dy, "dy", dx, "dx");
  ck.same_dtype(dy, "dy", dx, "dx");
  HK_OPS_DISPATCH(ck, rotary_embedding_backward, dy, cos, sin, dx, stream);
}

}  // namespace hk::ops
