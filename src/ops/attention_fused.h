// Internal: the device implementations behind hk::ops::fused_attention / _backward (hk/ops.h).
//
// attention_fused.cc checks the arguments and dispatches here; the CPU form is a blocked online
// softmax (attention_fused_cpu.cc), the CUDA form calls the flash kernels of kernels/flash-attn
// (attention_fused_cuda.cc). Not here: the eager attention (attention_cpu.cc / attention_cuda.cu).
#pragma once

#include "hk/ops.h"

namespace hk::ops {
namespace cpu {
void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FusedAttentionOptions& options,
                     const TensorView* lse, Stream stream);
void fused_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FusedAttentionOptions& options, Stream stream);
}  // namespace cpu
#ifdef HK_HAVE_CUDA
namespace cuda {
void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FusedAttentionOptions& options,
                     const TensorView* lse, Stream stream);
void fused_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FusedAttentionOptions& options, Stream stream);
// The flash kernel the forward would run ("sm90 wgmma", ...), or why none can (for reports).
std::string fused_attention_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const FusedAttentionOptions& options);
}  // namespace cuda
#endif
}  // namespace hk::ops
