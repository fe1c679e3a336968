// liger/cpu_ops.h — the cpu variant: plain loops over the argument structs of liger/args.h, f32
// math (double for long sums), the same rounding points as the cuda variant. Correct and simple,
// not fast; they never allocate more than one row or one chunk of scratch.
#pragma once

#include "liger/args.h"

namespace liger::cpu {

void rms_norm_fwd(const RmsNormFwd& a);
void rms_norm_bwd(const RmsNormBwd& a);
void layer_norm_fwd(const LayerNormFwd& a);
void layer_norm_bwd(const LayerNormBwd& a);
void rope(const RopeArgs& a);
void unary_act_fwd(const UnaryAct& a);
void unary_act_bwd(const UnaryAct& a);
void gated_act_fwd(const GatedAct& a);
void gated_act_bwd(const GatedAct& a);
void cross_entropy_fwd(const CrossEntropyArgs& a);
void cross_entropy_scale(const CrossEntropyScale& a);
void fused_linear_cross_entropy_fwd(const FusedLinearCrossEntropyArgs& a);
// Multiplies every element of `m` by *factor (FLCE backward when dloss != 1).
void scale_rows(const Rows& m, const float* factor);

}  // namespace liger::cpu

namespace liger::cpu {
// The causal-LM label shift (see liger/cuda_ops.h shift_labels).
void shift_labels(const void* labels, IndexDt dt, int64_t batch, int64_t seq, int64_t batch_stride,
                  int64_t ignore_index, int64_t* out);
}  // namespace liger::cpu

namespace liger::cpu {
void mlp_fwd(const MlpArgs& a);
void mlp_bwd(const MlpArgs& a);
void linear_fwd(const LinearArgs& a);
void linear_bwd(const LinearArgs& a);
}  // namespace liger::cpu
