// cpu/ce_row.h — internal: the cross-entropy of one row of logits (shared by the cpu
// cross-entropy and fused linear cross-entropy), formula in liger/args.h.
#pragma once

#include <cstdint>

namespace liger::cpu {

struct CeRowOptions {
  float label_smoothing = 0, z_loss_scale = 0, softcap = 0;
};
struct CeRowResult {
  float loss = 0, z_loss = 0, lse = 0;
};

// `logits` holds V values (already in f32). When `grad` is non-null, writes d loss / d logits
// times `grad_scale` into it (may alias `logits`). `target` must be in [0, V).
CeRowResult ce_row(const float* logits, int64_t vocab, int64_t target, const CeRowOptions& o,
                   float* grad, float grad_scale);

}  // namespace liger::cpu
