// Internal: the CUDA implementations of the built-in ops, one per function of hk/ops.h with the
// same signature. The dispatchers in src/ops/<op>.cc validate arguments, then call these for CUDA
// tensors; these may assume validated shapes/dtypes/devices. Compiled only when HK_HAVE_CUDA.
#pragma once

#include "hk/ops.h"

namespace hk::ops::cuda {

void matmul(const TensorView& a, const TensorView& b, const TensorView& c,
            const MatmulOptions& options, Stream stream);
void linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
            Stream stream);
void linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                     const TensorView* dx, const TensorView* dw, const TensorView* dbias,
                     bool accumulate, Stream stream);
void embedding(const TensorView& weight, const TensorView& ids, const TensorView& out,
               Stream stream);
void embedding_backward(const TensorView& dout, const TensorView& ids, const TensorView& dweight,
                        Stream stream);
void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              const TensorView* rstd, Stream stream);
void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       float eps, const TensorView* rstd, const TensorView& dx,
                       const TensorView* dweight, bool accumulate_dweight, Stream stream);
void add_rms_norm(const TensorView& residual, const TensorView& delta, const TensorView& weight,
                  float eps, const TensorView& y, Stream stream);
void layer_norm(const TensorView& x, const TensorView& weight, const TensorView* bias, float eps,
                const TensorView& y, Stream stream);
void rotary_tables(const TensorView& positions, int64_t head_dim, double theta,
                   float attention_scaling, const TensorView& cos, const TensorView& sin,
                   Stream stream);
void rotary_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                      const TensorView& y, Stream stream);
void rotary_embedding_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin,
                               const TensorView& dx, Stream stream);
void activation(Activation act, const TensorView& x, const TensorView& y, Stream stream);
void activation_backward(Activation act, const TensorView& dy, const TensorView& x,
                         const TensorView& dx, Stream stream);
void act_mul(Activation act, const TensorView& gate, const TensorView& up, const TensorView& out,
             Stream stream);
void act_mul_backward(Activation act, const TensorView& dout, const TensorView& gate,
                      const TensorView& up, const TensorView& dgate, const TensorView& dup,
                      Stream stream);
void add(const TensorView& a, const TensorView& b, const TensorView& out, float alpha,
         Stream stream);
void mul(const TensorView& a, const TensorView& b, const TensorView& out, Stream stream);
void scale(const TensorView& x, float factor, const TensorView& out, Stream stream);
void cast(const TensorView& x, const TensorView& out, Stream stream);
void fill(const TensorView& out, double value, Stream stream);
void softmax(const TensorView& x, const TensorView& y, Stream stream);
void softmax_backward(const TensorView& dy, const TensorView& y, const TensorView& dx,
                      Stream stream);
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, const TensorView* probs, Stream stream);
void attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& probs, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        Stream stream);
void cross_entropy(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                   const CrossEntropyOptions& options, const TensorView* lse, Stream stream);
void cross_entropy_backward(const TensorView& dloss, const TensorView& logits,
                            const TensorView& labels, const TensorView& dlogits,
                            const CrossEntropyOptions& options, const TensorView* lse,
                            Stream stream);
void argmax(const TensorView& x, const TensorView& out, Stream stream);
void ms_deform_attn(const TensorView& value,
                    const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes,
                    const TensorView& sampling_locations, const TensorView& attention_weights,
                    const TensorView& out, Stream stream);
void ms_deform_attn_backward(const TensorView& dout, const TensorView& value,
                             const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes,
                             const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView* dvalue,
                             const TensorView* dsampling_locations,
                             const TensorView* dattention_weights, Stream stream);

}  // namespace hk::ops::cuda
