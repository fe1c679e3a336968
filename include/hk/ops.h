// hk/ops.h — the built-in ops: the reference ("eager PyTorch") implementation of every layer.
//
// Every op writes into caller-provided outputs (TensorViews, any strides unless stated), checks
// shapes/dtypes/devices and throws InvalidArgument naming the op and the offending shapes, then
// dispatches to the CPU or CUDA implementation. Floating math is done in f32 (matmul accumulates
// in f32) and rounded once to the output dtype, matching PyTorch's eager semantics where the
// comment says so. CPU ops ignore the stream; CUDA ops enqueue on it and never block the host.
// These ops are correct and simple; fast fused versions live in kernel repos under kernels/.
//
// Layout conventions: "rows" = all leading dims flattened, the op works along the last dim.
// Attention tensors are [batch, seq, heads, head_dim] (the layout of q_proj output reshaped).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk::ops {

// ---- matmul -------------------------------------------------------------------------------------
struct MatmulOptions {
  bool trans_a = false;  // use A^T
  bool trans_b = false;  // use B^T
  float alpha = 1.0f;
  float beta = 0.0f;  // C = alpha*op(A)*op(B) + beta*C
};
// C[M,N] = op(A) op(B), 2-D, or batched 3-D with equal batch (or batch 1 broadcast for B).
// f32, bf16, f16 (all operands one dtype), f32 accumulation. OpenBLAS on CPU, cuBLASLt on CUDA.
// Operands may be transposed views; anything else non-contiguous is copied first.
void matmul(const TensorView& a, const TensorView& b, const TensorView& c,
            const MatmulOptions& options = {}, Stream stream = {});

// y[..., N] = x[..., K] · w[N, K]^T (+ bias[N]). The Linear layer.
void linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
            Stream stream = {});
// Backward of linear: dx = dy·w (if dx given), dw (+)= dy^T·x (if dw given; accumulate when
// `accumulate`), dbias (+)= sum over rows of dy (if dbias given).
void linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                     const TensorView* dx, const TensorView* dw, const TensorView* dbias,
                     bool accumulate, Stream stream = {});

// ---- embedding ----------------------------------------------------------------------------------
// out[..., H] = weight[ids[...], :]. ids i32 or i64; an id out of [0, V) throws on CPU and
// produces zeros on CUDA (checked without a host sync).
void embedding(const TensorView& weight, const TensorView& ids, const TensorView& out,
               Stream stream = {});
// dweight[V, H] += scatter of dout by ids (dweight must be zeroed by the caller the first time).
// dweight may be f32 while dout is 16-bit.
void embedding_backward(const TensorView& dout, const TensorView& ids, const TensorView& dweight,
                        Stream stream = {});

// ---- normalisation ------------------------------------------------------------------------------
// Llama/Qwen RMSNorm, matching Transformers: r = rsqrt(mean(x²) + eps) in f32;
// y = round_to(x.dtype, x·r) · w (product in f32, rounded to y.dtype).
// `rstd` (f32, shape = rows) is written when given, for backward.
void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              const TensorView* rstd = nullptr, Stream stream = {});
// dx (written) and dweight (accumulated into when `accumulate_dweight`, else written; f32 or
// weight dtype). `rstd` from forward, or recomputed when null.
void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       float eps, const TensorView* rstd, const TensorView& dx,
                       const TensorView* dweight, bool accumulate_dweight = false,
                       Stream stream = {});
// The decoder's residual step in one pass: residual = round(residual + delta) (exactly ops::add),
// then y = rms_norm(residual, weight) (exactly ops::rms_norm). residual and delta share one dtype
// and shape; y has their shape and must not alias them.
void add_rms_norm(const TensorView& residual, const TensorView& delta, const TensorView& weight,
                  float eps, const TensorView& y, Stream stream = {});
// y = (x - mean)·rstd·w + b over the last dim (f32 math). bias may be null.
void layer_norm(const TensorView& x, const TensorView& weight, const TensorView* bias, float eps,
                const TensorView& y, Stream stream = {});

// ---- rotary embedding ---------------------------------------------------------------------------
// cos/sin tables [batch or 1, seq, head_dim] (f32) for positions [batch, seq] (i32/i64):
// inv_freq[i] = theta^(-2i/head_dim), freqs duplicated on both halves (Transformers layout),
// multiplied by `attention_scaling` (1 for default rope).
void rotary_tables(const TensorView& positions, int64_t head_dim, double theta,
                   float attention_scaling, const TensorView& cos, const TensorView& sin,
                   Stream stream = {});
// y = x·cos + rotate_half(x)·sin, x/y [batch, seq, heads, head_dim] (any strides; y may alias
// x), cos/sin [batch or 1, seq, head_dim] f32. Math in f32, one rounding.
void rotary_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                      const TensorView& y, Stream stream = {});
// dx = dy·cos + rotate_half^T(dy)·sin (the transpose of the forward map).
void rotary_embedding_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin,
                               const TensorView& dx, Stream stream = {});

// ---- elementwise --------------------------------------------------------------------------------
enum class Activation { SiLU, GELU, GELUTanh, QuickGELU };
// y = act(x). GELU is the erf form; GELUTanh the tanh approximation; QuickGELU x·σ(1.702·x).
void activation(Activation act, const TensorView& x, const TensorView& y, Stream stream = {});
// dx = dy · act'(x)
void activation_backward(Activation act, const TensorView& dy, const TensorView& x,
                         const TensorView& dx, Stream stream = {});
// out = act(gate) * up  (SwiGLU with SiLU, GeGLU with GELU/GELUTanh). act(gate) is rounded to
// the dtype first, like Transformers' `act_fn(gate_proj(x)) * up_proj(x)`.
void act_mul(Activation act, const TensorView& gate, const TensorView& up, const TensorView& out,
             Stream stream = {});
void act_mul_backward(Activation act, const TensorView& dout, const TensorView& gate,
                      const TensorView& up, const TensorView& dgate, const TensorView& dup,
                      Stream stream = {});
// out = a + alpha*b, out = a * b; b may broadcast (stride 0 views from expand()). out may alias a.
void add(const TensorView& a, const TensorView& b, const TensorView& out, float alpha = 1.0f,
         Stream stream = {});
void mul(const TensorView& a, const TensorView& b, const TensorView& out, Stream stream = {});
void scale(const TensorView& x, float factor, const TensorView& out, Stream stream = {});
// Converts dtype (and layout) elementwise: out = x with out's dtype. Any strides.
void cast(const TensorView& x, const TensorView& out, Stream stream = {});
void fill(const TensorView& out, double value, Stream stream = {});

// ---- softmax / attention ------------------------------------------------------------------------
// Softmax over the last dim (f32 math).
void softmax(const TensorView& x, const TensorView& y, Stream stream = {});
// dx = y·(dy - sum(dy·y))
void softmax_backward(const TensorView& dy, const TensorView& y, const TensorView& dx,
                      Stream stream = {});

struct AttentionOptions {
  float scale = 0.0f;  // 0 → 1/sqrt(head_dim)
  bool causal = true;  // query i (of S) sees keys ≤ (T - S + i): queries are the last S of T
  // Optional i32 [batch]: keys before this index are masked (left padding). Null = none.
  const TensorView* key_start = nullptr;
};
// Eager attention with GQA. q [B, S, Hq, D], k/v [B, T, Hkv, D] with Hq % Hkv == 0,
// out [B, S, Hq, D]. Scores and softmax in f32; probabilities rounded to q's dtype before P·V
// (as eager Transformers does). `probs` (f32 [B, Hq, S, T]) is written when given, for backward.
// A fully masked row produces zeros.
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options = {}, const TensorView* probs = nullptr,
               Stream stream = {});
// Gradients from the saved probabilities: dq, dk, dv (dk/dv summed over each kv group).
void attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& probs, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& options = {}, Stream stream = {});

// Fused attention (the "sdpa" attention function): never materialises the S×T scores. On CUDA the
// flash kernels of kernels/flash-attn (compiled into libhk; bf16/f16, head_dim 64/128/256, any
// other case on CUDA throws Unsupported); on CPU a blocked online softmax (f32/f64 math, any dtype).
// Semantics are those of the layer interfaces attention@1 / attention_varlen@1
// (hk/layer_interfaces.h): causal aligned bottom-right, softcap, left sliding window, left padding
// through key_start, GQA; lse = log Σ exp(scores), +∞ for a fully masked row (its output is 0).
struct FusedAttentionOptions {
  float scale = 0.0f;  // 0 → 1/sqrt(head_dim)
  bool causal = true;
  float softcap = 0.0f;      // 0 = none
  int64_t window_left = -1;  // -1 = no window
  const TensorView* key_start = nullptr;  // i32/i64 [B] (batch layout only); null = none
  // Varlen: q [Sq, Hq, D], k/v [Sk, Hkv, D] with sequence b in rows [cu[b], cu[b+1]) (i32
  // [B+1]); max_seqlen_* bound the lengths (they size CUDA launches: no host read of cu_seqlens).
  const TensorView* cu_seqlens_q = nullptr;
  const TensorView* cu_seqlens_k = nullptr;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool deterministic = false;  // backward without floating-point atomics
};
// q [B, S, Hq, D], k/v [B, T, Hkv, D], out like q (or the varlen layouts above). `lse`, when
// given, receives f32 [B, Hq, S] ([Hq, Sq] varlen). Any strides with a unit last dim.
void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FusedAttentionOptions& options = {},
                     const TensorView* lse = nullptr, Stream stream = {});
// Gradients from the forward's out and lse: dq, dk, dv written (dk/dv summed over each kv group).
// Workspace (CUDA: f32 dq accumulator and row dots) comes from the caching allocator on `stream`.
void fused_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FusedAttentionOptions& options = {}, Stream stream = {});

// ---- loss ---------------------------------------------------------------------------------------
enum class Reduction { None, Mean, Sum };
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;  // Mean divides by the number of non-ignored targets
                                          // (0 targets → loss 0, no NaN)
};
// logits [N, V] (any float dtype, f32 math), labels [N] i32/i64. loss: f32 [N] for None,
// f32 scalar (shape [] or [1]) otherwise. `lse` (f32 [N]) written when given, for backward.
void cross_entropy(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                   const CrossEntropyOptions& options = {}, const TensorView* lse = nullptr,
                   Stream stream = {});
// dlogits = dloss-weighted (softmax - onehot); dloss shaped like loss. lse recomputed when null.
void cross_entropy_backward(const TensorView& dloss, const TensorView& logits,
                            const TensorView& labels, const TensorView& dlogits,
                            const CrossEntropyOptions& options = {},
                            const TensorView* lse = nullptr, Stream stream = {});

// ---- multi-scale deformable attention (Deformable DETR)
// ------------------------------------------- The built-in of layer interface
// multi_scale_deformable_attention@1 (hk/layer_interfaces.h has the formula): value [B, S, H, D],
// sampling_locations [B, Q, H, L, P, 2], attention_weights [B, Q, H, L, P] (one floating dtype; f64
// on the cpu), out [B, Q, H·D]; `spatial_shapes` the (height, width) of each of the L levels, Σ h·w
// = S. Any strides. f32 math (f64 for f64).
void ms_deform_attn(const TensorView& value,
                    const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes,
                    const TensorView& sampling_locations, const TensorView& attention_weights,
                    const TensorView& out, Stream stream = {});
// Gradients for dout [B, Q, H·D]; each output optional (null = not wanted), written.
void ms_deform_attn_backward(const TensorView& dout, const TensorView& value,
                             const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes,
                             const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView* dvalue,
                             const TensorView* dsampling_locations,
                             const TensorView* dattention_weights, Stream stream = {});

// ---- reductions used by generation ------------------------------------------------------------
// Index of the max over the last dim (first on ties), out i64 [rows].
void argmax(const TensorView& x, const TensorView& out, Stream stream = {});

}  // namespace hk::ops
