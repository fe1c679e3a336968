// Internal: the fast CUDA forward attention used for inference (no saved probabilities).
//
// `hk::ops::cuda::attention` calls this first when the caller does not ask for probabilities; it
// returns false for anything it does not handle (mixed dtypes, a non-contiguous last dim, head_dim
// > 256, misaligned operands, empty problems), and the eager kernels run instead. Same semantics as
// the eager path (include/hk/ops.h): f32 scores and softmax, probabilities rounded to q's dtype
// before P·V, a fully masked row gives zeros. Not here: backward, the `probs` output.
// Environment: HK_ATTENTION_FAST=0 disables it (eager kernels everywhere);
// HK_ATTENTION_CLUSTER_DECODE=0 disables its cluster-split decode kernel.
#pragma once

#include "hk/ops.h"

namespace hk::ops::cuda {

// Computes `out` and returns true, or returns false without touching anything.
bool attention_fast_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& options, Stream stream);

}  // namespace hk::ops::cuda
