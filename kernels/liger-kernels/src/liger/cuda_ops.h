// liger/cuda_ops.h — the cuda (sm_90a) variant: host launchers for the argument structs of
// liger/args.h. Every launcher enqueues on `stream` (a cudaStream_t passed as void* so this header
// needs no CUDA include), never synchronises the host and never allocates: scratch memory comes
// from the caller's workspace, sized by the *_workspace_bytes functions (which need the current
// device, for its multiprocessor count). Returns 0 or the cudaError_t / cublasStatus_t code (as a
// negative number for cuBLAS) of the first failure.
#pragma once

#include <cstddef>

#include "liger/args.h"

namespace liger::cuda {

int rms_norm_fwd(const RmsNormFwd& a, void* stream);
size_t rms_norm_bwd_workspace_bytes(int64_t rows, int64_t cols);
int rms_norm_bwd(const RmsNormBwd& a, void* stream);
int layer_norm_fwd(const LayerNormFwd& a, void* stream);
size_t layer_norm_bwd_workspace_bytes(int64_t rows, int64_t cols);
int layer_norm_bwd(const LayerNormBwd& a, void* stream);

int rope(const RopeArgs& a, void* stream);

int unary_act_fwd(const UnaryAct& a, void* stream);
int unary_act_bwd(const UnaryAct& a, void* stream);
int gated_act_fwd(const GatedAct& a, void* stream);
int gated_act_bwd(const GatedAct& a, void* stream);

size_t cross_entropy_workspace_bytes(int64_t rows);
int cross_entropy_fwd(const CrossEntropyArgs& a, void* stream);
int cross_entropy_scale(const CrossEntropyScale& a, void* stream);
// m *= *factor (a device f32 scalar).
int scale_rows(const Rows& m, const float* factor, void* stream);

// weight_grad_dt: dweight's dtype, or F32 when dweight is f32 or absent (16-bit dweight needs an
// f32 accumulator in the workspace).
size_t fused_linear_cross_entropy_workspace_bytes(int64_t n, int64_t hidden, int64_t vocab,
                                                  Dt hidden_dt, Dt weight_grad_dt,
                                                  int64_t chunk_tokens);
int fused_linear_cross_entropy_fwd(const FusedLinearCrossEntropyArgs& a, void* stream);

// saved_gate_up: the call passes MlpArgs::gate/up (the training forward keeps them).
size_t mlp_workspace_bytes(int64_t rows, int64_t intermediate, Dt dt, bool backward,
                           bool saved_gate_up = false);
int mlp_fwd(const MlpArgs& a, void* stream);
int mlp_bwd(const MlpArgs& a, void* stream);
size_t linear_workspace_bytes();
int linear_fwd(const LinearArgs& a, void* stream);
int linear_bwd(const LinearArgs& a, void* stream);
// y[r, :] = b for every row (the bias a linear adds before its single rounding).
int broadcast_rows(const Vec& b, const Rows& y, void* stream);
// db (+)= Σ_rows dy, f32 sums.
int column_sums(const Rows& dy, const Vec& db, bool accumulate, void* stream);

// out[i] = i + 1 < seq ? labels[b, i + 1] : ignore_index  (i64 [batch·seq]): the causal-LM
// shift, so the loss of position t predicts token t + 1.
int shift_labels(const void* labels, IndexDt dt, int64_t batch, int64_t seq, int64_t batch_stride,
                 int64_t ignore_index, int64_t* out, void* stream);

}  // namespace liger::cuda
