// cuda/ce_launch.h — internal: the cross-entropy building blocks that the cross-entropy entry
// and the fused linear cross-entropy (a host-side .cc) both launch. No CUDA types here.
#pragma once

#include <cstdint>

#include "liger/args.h"

namespace liger::cuda {

struct CeRowsP {
  const void* logits;
  int64_t logits_stride;
  void* grad;  // may equal logits; null → no gradient pass
  int64_t grad_stride;
  Dt dt;
  int64_t rows, vocab;
  const void* labels;  // already offset to row 0 of this launch
  IndexDt labels_dt;
  int64_t labels_stride;
  float* row_loss;          // [rows]
  float* row_z;             // [rows] or null
  float* lse;               // [rows] or null
  const float* lse_in;      // [rows] or null: when given, the softmax pass is skipped
  const float* grad_scale;  // device scalar or null (1)
  const float* dloss;       // device f32 or null (1): scalar, or [rows] when dloss_per_row
  bool dloss_per_row;
  int64_t ignore_index;
  float label_smoothing, z_loss_scale, softcap;
};

int launch_ce_rows(const CeRowsP& p, void* stream);
// *inv = 1 / (override > 0 ? override : max(1, #labels != ignore)).
int launch_inv_divisor(const void* labels, IndexDt dt, int64_t stride, int64_t n, int64_t ignore,
                       float override_divisor, float* inv, void* stream);
// out[0] = Σ in[i] · (inv ? *inv : 1), summed in a fixed order.
int launch_sum_scaled(const float* in, int64_t n, const float* inv, float* out, void* stream);
// m *= (per_row ? factor[r] : factor[0]).
int launch_scale(const Rows& m, const float* factor, bool per_row, void* stream);
// out (dt) (+)= in (f32), elementwise over a dense [n] range.
int launch_f32_to(const float* in, void* out, Dt dt, int64_t n, bool accumulate, void* stream);

}  // namespace liger::cuda
