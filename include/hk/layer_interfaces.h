// hk/layer_interfaces.h — the layer interfaces: the one contract shared by models, built-in ops
// and hub kernels.
//
// A layer interface is a name and a version (`rms_norm@1`). It fixes, once: the order, shapes and
// dtypes of the tensors a kernel receives in `hk_call.inputs` / `outputs` for forward and for
// backward, and the POD attribute struct passed as `hk_call.attrs`. A kernel entry declares the
// interface it implements; the loader refuses entries whose interface or version hk does not know,
// so signature drift is caught at load, never at call time. Any change to tensors or to the
// meaning of a field makes a new version; appending a field with a default keeps the version
// (callers pass `attrs_size`, kernels read the prefix they know — see hk::sdk::read_attrs).
//
// Conventions for every interface: "rows" = all leading dims flattened, the op works along the
// last dim; tensors may be strided (kernels may return HK_STATUS_UNSUPPORTED for layouts they do
// not handle, and callers then make them contiguous or fall back); math is f32 unless stated;
// optional tensors may be absent (see hk_abi/hk_kernel.h). Backward outputs are written unless
// the attrs' accumulate flag is set, in which case weight gradients are added to.
//
// The attribute structs are plain, header-only and safe to include from kernel code (kernels do
// not link libhk). The registry functions at the bottom are implemented in libhk, for the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hk {

// Shared flag: weight gradients (dweight, dbias, ...) are accumulated into instead of written.
inline constexpr uint32_t kAccumulateWeightGrads = 1u;

// ---- rms_norm@1 (layer RMSNorm) -----------------------------------------------------------------
// forward   inputs:  x [..., H] (f32|bf16|f16), weight [H]
//           outputs: y [..., H] (x's shape), rstd [rows] f32 (optional; saved for backward)
//   r = rsqrt(mean(x²) + eps) in f32.
//   llama casting: y = round_to(y.dtype, round_to(x.dtype, x·r) · (offset + w))  (Transformers)
//   gemma casting: y = round_to(y.dtype, x·r·(offset + w))                        (all in f32)
//   none casting:  y = round_to(y.dtype, x·r·(offset + w))    (f32, one rounding: gemma's values)
//     Liger's casting_mode "none" skips the upcast and keeps x·r and the product in x's dtype;
//     hk's contract is the f32 value those roundings approximate (never less precise than Liger),
//     so "none" and "gemma" give the same result and "none" exists to name Liger's mode.
// backward  inputs:  dy [..., H], x, weight, rstd (optional; recomputed when absent)
//           outputs: dx [..., H], dweight [H] (optional; f32 or weight dtype, reduced in f32)
//   with m = x·r, n = m rounded to x.dtype (llama casting) or m (gemma, none), g = dy·(offset + w):
//   dx = r·(g − m·mean(g·m))  (rounding treated as identity),  dweight = Σ_rows dy·n
// Kernels refuse a casting_mode hk does not define with HK_STATUS_INVALID_ARGUMENT, and a listed
// one they do not implement with HK_STATUS_UNSUPPORTED (the caller then falls back).
inline constexpr uint32_t kRmsNormCastingLlama = 0;
inline constexpr uint32_t kRmsNormCastingGemma = 1;
inline constexpr uint32_t kRmsNormCastingNone = 2;
struct RmsNormAttrs {
  float eps = 1e-6f;
  float offset = 0.0f;                           // added to the weight (Gemma uses 1)
  uint32_t casting_mode = kRmsNormCastingLlama;  // kRmsNormCasting*
  uint32_t flags = 0;                            // kAccumulateWeightGrads
};

// ---- layer_norm@1 (layer LayerNorm) -------------------------------------------------------------
// forward   inputs:  x [..., H], weight [H], bias [H] (optional)
//           outputs: y [..., H], mean [rows] f32 (optional), rstd [rows] f32 (optional)
//   y = (x − mean)·rstd·w + b, rstd = rsqrt(var + eps) (biased variance)
// backward  inputs:  dy, x, weight, mean (optional), rstd (optional)
//           outputs: dx, dweight (optional), dbias (optional)
struct LayerNormAttrs {
  float eps = 1e-5f;
  uint32_t flags = 0;  // kAccumulateWeightGrads
};

// ---- rotary_pos_emb@1 (function rotary_pos_emb) -------------------------------------------------
// forward   inputs:  q [B, S, Hq, D], k [B, S, Hk, D], cos [B|1, S, D] f32, sin [B|1, S, D] f32
//           outputs: q_out, k_out (shapes of q, k; may alias q, k)
//   x_out = x·cos + rotate_half(x)·sin over the first `rotary_dim` of D (rest copied),
//   rotate_half(x) = [−x2, x1] (Transformers layout: frequencies duplicated on both halves)
// backward  inputs:  dq_out, dk_out, cos, sin
//           outputs: dq, dk (may alias dq_out, dk_out)
struct RotaryAttrs {
  int32_t rotary_dim = 0;  // 0 = the whole head_dim
};

// ---- mlp@1 (layer MLP: gated MLP, SwiGLU / GeGLU) -----------------------------------------------
// forward   inputs:  x [..., H], gate_w [I, H], up_w [I, H], down_w [H, I]
//           outputs: y [..., H], gate [..., I] (optional), up [..., I] (optional)
//   y = (act(x·gate_wᵀ) ⊙ (x·up_wᵀ)) · down_wᵀ, act(gate) rounded to x.dtype before the product
//   gate, up (x's dtype, given together): the pre-activations x·gate_wᵀ and x·up_wᵀ, kept by a
//   training forward so backward need not recompute those two GEMMs.
// backward  inputs:  dy, x, gate_w, up_w, down_w, gate (optional), up (optional)
//           outputs: dx, dgate_w (optional), dup_w (optional), ddown_w (optional)
//   gate, up: what this entry's forward wrote into them; backward may overwrite them (their
//   gradients take their place). Without them the intermediates are recomputed (the kernel's
//   workspace_size says what it needs either way). The optional tensors were appended without
//   a new version: a kernel that predates them ignores them in both passes, and one entry serves
//   a layer's forward and backward, so the two passes always agree.
inline constexpr uint32_t kActivationSiLU = 0;
inline constexpr uint32_t kActivationGELU = 1;      // erf form
inline constexpr uint32_t kActivationGELUTanh = 2;  // tanh approximation
struct MlpAttrs {
  uint32_t activation = kActivationSiLU;
  uint32_t flags = 0;  // kAccumulateWeightGrads
};

// ---- activation@1 (activation layers: SiLU, GELU, GeluTanh, QuickGELU, ...) ---------------------
// forward   inputs: x       outputs: y (x's shape; may alias x)      y = act(x), act from `kind`
// backward  inputs: dy, x   outputs: dx
inline constexpr uint32_t kActivationQuickGELU = 3;  // x·sigmoid(1.702·x)
struct ActivationAttrs {
  uint32_t kind = kActivationSiLU;  // kActivation*
};

// ---- act_and_mul@1 (gated activations: silu_and_mul, gelu_and_mul, Liger SwiGLU / GeGLU) -------
// forward   inputs:  x [..., 2d] (gate ‖ up), or gate [..., d] followed by up [..., d] (optional
//                    second input: gate and up as two tensors)
//           outputs: y [..., d]
//   y = round_to(y.dtype, act(gate)) · up   (act(gate) rounded first, as Transformers' MLP does)
// backward  inputs:  dy [..., d], x (or gate), up (optional, as in forward)
//           outputs: dx (x's shape: dgate ‖ dup, or dgate), dup (when up was given)
struct ActAndMulAttrs {
  uint32_t kind = kActivationSiLU;  // kActivation*
};

// ---- silu@1 (layer SiLU) ------------------------------------------------------------------------
// forward   inputs: x       outputs: y (x's shape; may alias x)      y = x·sigmoid(x)
// backward  inputs: dy, x   outputs: dx
struct SiluAttrs {
  uint32_t reserved = 0;
};

// ---- linear@1 (layer Linear) --------------------------------------------------------------------
// forward   inputs:  x [..., K], weight [N, K], bias [N] (optional)
//           outputs: y [..., N]                       y = x·weightᵀ + bias (f32 accumulation)
// backward  inputs:  dy [..., N], x, weight
//           outputs: dx (optional), dweight (optional), dbias (optional)
struct LinearAttrs {
  uint32_t flags = 0;  // kAccumulateWeightGrads
};

// ---- attention@1 (attention functions: attn_implementation) -------------------------------------
// forward   inputs:  q [B, S, Hq, D], k [B, T, Hkv, D], v [B, T, Hkv, D] (Hq % Hkv == 0),
//                    key_start [B] i32 (optional: keys before it are masked — left padding)
//           outputs: out [B, S, Hq, D], lse [B, Hq, S] f32 (optional; saved for backward)
//   scores = scale·q·kᵀ, then softcap·tanh(scores/softcap) when softcap > 0, softmax in f32.
//   causal: query i (of S) sees keys ≤ T − S + i (aligned bottom-right, as flash-attn ≥ 2.1).
//   window_left ≥ 0: query i also sees no key < T − S + i − window_left (sliding window).
//   A fully masked row gives zeros and lse = +∞ (so its backward contributes nothing).
//   lse = log Σ exp(scores) over the visible keys, natural log, f32.
// backward  inputs:  dout, q, k, v, out, lse, key_start (optional)
//           outputs: dq, dk, dv (dk/dv summed over each kv group; written, never accumulated)
//   kAttentionDeterministic asks for a backward whose result does not depend on scheduling
//   (no floating-point atomics); kernels that cannot give one return HK_STATUS_UNSUPPORTED.
inline constexpr uint32_t kAttentionDeterministic = 1u;
struct AttentionAttrs {
  float scale = 0.0f;  // 0 → 1/sqrt(D)
  uint32_t causal = 1;
  float softcap = 0.0f;      // 0 = none; else scores = softcap·tanh(scores/softcap)
  int32_t window_left = -1;  // sliding window: keys more than this far left are masked; -1 = ∞
  uint32_t flags = 0;        // kAttentionDeterministic
};

// ---- cross_entropy@1 (Liger cross_entropy) ------------------------------------------------------
// forward   inputs:  logits [N, V] (any float dtype, f32 math), labels [N] i32|i64
//           outputs: loss (f32 [N] for reduction none, else f32 [] or [1]),
//                    lse [N] f32 (optional), z_loss (optional, same shape as loss),
//                    dlogits [N, V] (optional; logits' dtype; may be logits itself, in place)
//   loss = (1−ε)·(lse − z_label) + ε·(lse − mean(z)) + lse_square_scale·lse², z = softcap'd
//   logits; ignored labels contribute 0; mean divides by the number of non-ignored labels
//   (0 → loss 0).
//   dlogits, when given, is the gradient for dloss = 1 (every element 1 for reduction none),
//   written in the same pass (Liger's design: training needs no backward call then):
//     dlogits_j = (softmax(z)_j·(1 + 2·lse_square_scale·lse) − ε/V − (1−ε)·[j = label])
//                 · (1 − (z_j/softcap)²  when softcap > 0) / D,
//   D = mean's divisor (the non-ignored count, 1 when it is 0) for mean, 1 for sum and none;
//   ignored rows get 0. In place, each row's logits are read before its gradient overwrites them.
// backward  inputs:  dloss (shape of loss), logits, labels, lse (optional)
//           outputs: dlogits [N, V]   (the forward's dlogits times dloss, per row for none)
inline constexpr uint32_t kReductionNone = 0;
inline constexpr uint32_t kReductionMean = 1;
inline constexpr uint32_t kReductionSum = 2;
struct CrossEntropyAttrs {
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float lse_square_scale = 0.0f;  // z-loss weight
  float softcap = 0.0f;           // 0 = none
  uint32_t reduction = kReductionMean;
};

// ---- fused_linear_cross_entropy@1 (Liger fused_linear_cross_entropy) ----------------------------
// forward   inputs:  x [N, H], weight [V, H], labels [N] i32|i64, bias [V] (optional)
//           outputs: loss (as cross_entropy@1), dx [N, H] (optional; x's dtype),
//                    dweight [V, H] (optional; f32 or weight's dtype), dbias [V] (optional)
//   loss = cross_entropy(x·weightᵀ + bias, labels) without materialising the [N, V] logits.
//   dx / dweight / dbias, when given, are the gradients for dloss = 1 (as cross_entropy@1's
//   dlogits, mean's divisor included), computed in the same pass over the vocabulary (Liger's
//   design: no second pass, training needs no backward call then). dweight is accumulated in
//   f32 (or wider) over all tokens and rounded once to its dtype; it is written, or added to under
//   kAccumulateWeightGrads. Logits and their gradient may be held in x's dtype between the
//   products (the GEMMs write them so). kernels-community/liger-kernels refuses bias and dbias
//   with HK_STATUS_UNSUPPORTED.
// backward  inputs:  dloss, x, weight, labels, bias (optional)
//           outputs: dx [N, H], dweight [V, H] (optional), dbias [V] (optional)
//   the same gradients times dloss (recomputing the chunks: a second pass over the vocabulary).
struct FusedLinearCrossEntropyAttrs {
  CrossEntropyAttrs ce;
  uint32_t flags = 0;  // kAccumulateWeightGrads
};

// ---- causal_lm_loss@1 (layer ForCausalLMLoss) ---------------------------------------------------
// forward   inputs:  logits [B, T, V], labels [B, T] i32|i64 (unshifted, as Transformers takes
//                    them: position t predicts labels[t+1]; the last position is ignored)
//           outputs: loss f32 [] or [1]
//   mean over non-ignored shifted labels, or sum / num_items_in_batch when that is > 0.
// backward  inputs:  dloss, logits, labels
//           outputs: dlogits [B, T, V]
struct CausalLmLossAttrs {
  int64_t ignore_index = -100;
  int64_t num_items_in_batch = 0;  // 0 = mean over non-ignored labels
};

// ---- rms_norm_mlp@1 (fusion RMSNorm → gated MLP, e.g. post_attention_layernorm + mlp) ----------
// A stateful fusion kernel: its <Kernel>Layout declares the parameters (after the activation, in
// layout order — typically norm weight [H], gate_up [2I, H] (gate rows first), down [I→H: H, I])
// and how they are made from the replaced modules' checkpoint tensors.
// forward   inputs:  x [..., H] (the RMSNorm's un-normalised input), then the layout parameters
//           outputs: y [..., H] = MLP(RMSNorm(x))   (same roundings as the two layers unfused)
struct RmsNormMlpAttrs {
  float eps = 1e-6f;
  uint32_t activation = kActivationSiLU;
};

// ---- multi_scale_deformable_attention@1 (layer MultiScaleDeformableAttention, Deformable DETR) --
// forward   inputs:  value [B, S, H, D] with S = Σ_l h_l·w_l (the levels' maps, level-major),
//                    sampling_locations [B, Q, H, L, P, 2] ((x, y) in [0, 1] of each level's map),
//                    attention_weights [B, Q, H, L, P]  (all three one floating dtype)
//           outputs: out [B, Q, H·D] (value's dtype)
//   out[b, q, h·D + d] = Σ_l Σ_p w[b,q,h,l,p] · bilinear(value_l[b, :, h, d], loc[b,q,h,l,p])
//   bilinear as torch.nn.functional.grid_sample(mode="bilinear", padding_mode="zeros",
//   align_corners=False) on grid 2·loc − 1: pixel x = loc_x·w_l − 0.5, y = loc_y·h_l − 0.5, the
//   four neighbours weighted by distance, neighbours outside the map read as 0. f32 math.
// backward  inputs:  dout [B, Q, H·D], value, sampling_locations, attention_weights
//           outputs: dvalue [B, S, H, D] (optional), dsampling_locations (optional),
//                    dattention_weights (optional)   (each in its input's dtype; written)
// The levels' (h, w) are attributes (host values: no device read, capture-safe); level l starts
// at row Σ_{k<l} h_k·w_k of value.
inline constexpr uint32_t kMaxDeformableLevels = 16;
struct MsDeformAttnAttrs {
  uint32_t num_levels = 0;
  int32_t im2col_step = 64;  // Transformers' argument; the result does not depend on it
  int64_t spatial_shapes[kMaxDeformableLevels][2] = {};  // (height, width) per level
};

// ---- attention_varlen@1 (function flash_attn_varlen_func: packed sequences) -------------------
// forward   inputs:  q [Sq, Hq, D], k [Sk, Hkv, D], v [Sk, Hkv, D] (sequences packed back to back),
//                    cu_seqlens_q [B + 1] i32, cu_seqlens_k [B + 1] i32 (on the device: sequence b
//                    is rows [cu[b], cu[b+1]); cu[0] = 0)
//           outputs: out [Sq, Hq, D], lse [Hq, Sq] f32 (optional; saved for backward)
//   Each sequence b is attention@1 over its own rows (S_b queries, T_b keys, causal aligned
//   bottom-right within the sequence); no query sees another sequence's keys. max_seqlen_q/_k
//   bound S_b and T_b (they size the launch, so the host never reads cu_seqlens: capture-safe).
// backward  inputs:  dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k
//           outputs: dq, dk, dv
struct AttentionVarlenAttrs {
  AttentionAttrs base;
  int32_t max_seqlen_q = 0;
  int32_t max_seqlen_k = 0;
};

// ---- attention_kvcache@1 (function flash_attn_with_kvcache: decode over a KV cache) -----------
// forward   inputs:  q [B, S, Hq, D], k_cache [B, Tc, Hkv, D], v_cache [B, Tc, Hkv, D],
//                    cache_seqlens [B] i32 (valid cached positions of each row before this call),
//                    k_new [B, S, Hkv, D] (optional), v_new [B, S, Hkv, D] (optional, with k_new),
//                    key_start [B] i32 (optional: left padding, keys before it are masked)
//           outputs: out [B, S, Hq, D], lse [B, Hq, S] f32 (optional)
//   When k_new/v_new are given they are first written in place into the caches at positions
//   [cache_seqlens[b], cache_seqlens[b] + S) (the caller keeps cache_seqlens + S ≤ Tc); the
//   query rows then attend over keys [key_start[b], cache_seqlens[b] + S_new) of the cache with
//   attention@1's mask (S_new = S with new keys, 0 without), the queries being the last S
//   positions. cache_seqlens is not advanced (the caller owns it). Kernels split the keys over
//   several blocks when B·Hkv is too small to fill the device. No backward (inference).
struct AttentionKvcacheAttrs {
  AttentionAttrs base;
};

// ---- moe_mlp@1 (layer MoeMLP: sparse mixture of experts behind a softmax top-k router) ----------
// The whole Qwen3-MoE block (hk/moe.h): routing, the experts' gated MLPs and their weighted sum.
// forward   inputs:  x [T, H] (rows), router_w [E, H], gate_up_w [E, 2I, H] (gate rows 0..I-1, up
//                    rows I..2I-1), down_w [E, H, I]          (one dtype: f32|bf16|f16; dense rows)
//           outputs: y [T, H],
//                    router_logits [T, E] (optional; x's dtype),
//                    topk_ids [T, k] i32 (optional), topk_weights [T, k] f32 (optional),
//                    gate_up [T·k, 2I] (optional; x's dtype)
//   (the optional outputs are the state a training forward keeps; an inference call passes none)
//   logits = round(x·router_wᵀ); p = softmax(logits) in f32; the top-k of p, descending, ties to
//   the lower expert index (topk_ids); w = those p, divided by their f32 sum when norm_topk_prob
//   (topk_weights, before rounding). For each assignment (t, j) of token t to expert e = ids[t, j]:
//   h = round(x[t]·gate_up_w[e]ᵀ) (gate ‖ up), a = round(round(act(gate))·up),
//   o = round(a·down_w[e]ᵀ), and y[t] = round(Σ_j round(round(w[t, j])·o)) with the sum in f32.
//   gate_up holds h in the canonical expert order: the assignments of expert 0 first, by
//   increasing t·k + j, then those of expert 1, and so on (an expert may have none).
// backward  inputs:  dy [T, H], x, router_w, gate_up_w, down_w, router_logits, topk_ids,
//                    topk_weights, gate_up (the forward's optional outputs, all required here),
//                    drouter_logits [T, E] f32 (optional: a gradient on the logits from outside
//                    the block, e.g. the load-balancing loss's, added to the routing's)
//           outputs: dx [T, H], drouter_w (optional), dgate_up_w (optional), ddown_w (optional)
//   The gradients of the forward with its roundings treated as identity and every reduction in
//   f32: through the routing weights into p (the top-k choice is a constant), the softmax and the
//   router; through every expert that got assignments. Weight gradients have the weights' dtype;
//   they are written (experts without assignments get zeros), or added to under
//   kAccumulateWeightGrads.
struct MoeMlpAttrs {
  int32_t top_k = 2;
  uint32_t norm_topk_prob = 0;
  uint32_t activation = kActivationSiLU;  // kActivation* (the experts' act_fn)
  uint32_t flags = 0;                     // kAccumulateWeightGrads
};

// ---- registry (host side, implemented in libhk) -------------------------------------------------
struct InterfaceInfo {
  const char* name;     // "rms_norm"
  uint32_t version;     // 1
  const char* layer;    // the layer / function name it serves: "RMSNorm", "rotary_pos_emb", ...
  const char* inputs;   // forward tensors, in order ("x, weight")
  const char* outputs;  // "y, rstd?" (? = optional)
  const char* backward_inputs;  // "" when the interface has no backward
  const char* backward_outputs;
  size_t attrs_size;  // sizeof the attribute struct in this hk
};

// All interfaces hk knows, sorted by name then version.
const std::vector<InterfaceInfo>& known_interfaces();
// The interface `name@version`, or nullptr when hk does not know it.
const InterfaceInfo* find_interface(const std::string& name, uint32_t version);
// Versions hk knows of `name` (empty when the name is unknown), ascending.
std::vector<uint32_t> known_interface_versions(const std::string& name);

}  // namespace hk
