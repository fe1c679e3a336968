// liger/args.h — the plain argument structs shared by the cpu and cuda implementations of the
// Liger-style fused kernels (RMSNorm, LayerNorm, RoPE, gated/unary activations, cross-entropy,
// fused linear cross-entropy, causal-LM loss).
//
// These structs are the kernels' own internal contract: raw pointers, element strides, a dtype
// code and the op's attributes, so that the cpu and cuda variants compute exactly the same function
// and tests can call them directly. They deliberately know nothing of hk::TensorView or of the C
// ABI: the ABI glue (src/abi/) translates a call struct into these and validates it first. No
// function here checks arguments; the glue does.
//
// Layout model: every "Rows" operand is a matrix whose last dimension is contiguous (stride 1) and
// whose rows are `row_stride` elements apart — enough for slices of rows and for the strided
// column blocks that fused projections produce. Anything more exotic is made contiguous by the
// caller.
#pragma once

#include <cstddef>
#include <cstdint>

namespace liger {

enum class Dt : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };
enum class IndexDt : uint8_t { I32 = 0, I64 = 1 };

inline size_t dt_size(Dt dt) {
  return dt == Dt::F32 ? 4 : 2;
}

struct Rows {
  void* data = nullptr;  // element [0, 0]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements
  Dt dt = Dt::F32;
};

// A 1-D vector (weight, bias, rstd ...), contiguous.
struct Vec {
  void* data = nullptr;
  Dt dt = Dt::F32;
};

// ---- RMSNorm ------------------------------------------------------------------------------------
// llama: r = rsqrt(mean(x²)+eps) (f32); y = round_to(x.dt, x·r) · (offset + w)   (Transformers)
// gemma: y = (x·r) · (offset + w), all f32, one rounding (Gemma casts everything to f32)
// none : same as gemma here (f32 math, one rounding); Liger's "none" keeps the input dtype for
//        the intermediate, which only loses precision, so we do not copy that.
enum class CastMode : uint8_t { Llama = 0, Gemma = 1, None = 2 };

struct RmsNormFwd {
  Rows x, y;
  Vec w;
  float* rstd = nullptr;  // f32 [rows], optional (saved for backward)
  float eps = 1e-6f;
  float offset = 0.0f;
  CastMode mode = CastMode::Llama;
};

// dx written; dw written or accumulated (f32 or weight dtype). rstd from forward or recomputed.
// The cuda variant needs workspace (see rms_norm_bwd_workspace_bytes) for per-block dw partials.
struct RmsNormBwd {
  Rows dy, x, dx;
  Vec w;
  const float* rstd = nullptr;
  Vec dw;  // data may be null (no weight gradient)
  bool accumulate_dw = false;
  float eps = 1e-6f;
  float offset = 0.0f;
  CastMode mode = CastMode::Llama;
  void* workspace = nullptr;
};

// ---- LayerNorm ----------------------------------------------------------------------------------
// y = (x - mean)·rstd·w + b, f32 math, one rounding. mean/rstd saved (f32 [rows]) when given.
struct LayerNormFwd {
  Rows x, y;
  Vec w, b;  // b.data may be null
  float* mean = nullptr;
  float* rstd = nullptr;
  float eps = 1e-5f;
};

struct LayerNormBwd {
  Rows dy, x, dx;
  Vec w;
  const float* mean = nullptr;  // both recomputed when null
  const float* rstd = nullptr;
  Vec dw, db;  // data may be null
  bool accumulate = false;
  float eps = 1e-5f;
  void* workspace = nullptr;
};

// ---- RoPE (Qwen3 / Llama half rotation) ---------------------------------------------------------
// x[b, s, h, :] of head_dim D (contiguous last dim), any strides for b, s, h; rotated in place or
// into y. cos/sin rows of D elements (f32 or x's dtype): the row for (b, s) is
//   positions ? table[positions[b, s]] : table[b·cos_batch_stride + s]   (in rows of D)
// forward : y1 = x1·c1 - x2·s1 ; y2 = x2·c2 + x1·s2        (c1 = cos[:D/2], c2 = cos[D/2:])
// backward: dx1 = dy1·c1 + dy2·s2 ; dx2 = dy2·c2 - dy1·s1  (the transpose)
struct RopeTensor {
  void* x = nullptr;  // input
  void* y = nullptr;  // output (may equal x)
  int64_t heads = 0;
  int64_t x_strides[3] = {};  // b, s, h (elements)
  int64_t y_strides[3] = {};
};

struct RopeArgs {
  RopeTensor q, k;  // k.heads may be 0 (q only)
  Dt dt = Dt::BF16;
  int64_t batch = 0, seq = 0, head_dim = 0;
  const void* cos = nullptr;
  const void* sin = nullptr;
  Dt cos_dt = Dt::F32;
  int64_t cos_batch_stride = 0;     // in rows of D; 0 broadcasts over batch
  const void* positions = nullptr;  // [batch, seq], optional
  IndexDt positions_dt = IndexDt::I64;
  int64_t positions_batch_stride = 0;  // elements
  bool backward = false;
};

// ---- activations --------------------------------------------------------------------------------
// SiLU x·σ(x); GeluErf 0.5x(1+erf(x/√2)); GeluTanh 0.5x(1+tanh(√(2/π)(x+0.044715x³))) (also
// FastGELU, NewGELU, Liger's GEGLU); QuickGelu x·σ(1.702x).
enum class Act : uint8_t { SiLU = 0, GeluErf = 1, GeluTanh = 2, QuickGelu = 3 };

// y = act(x); backward dx = dy·act'(x). Elementwise over Rows; outputs may alias inputs.
struct UnaryAct {
  Act act = Act::SiLU;
  Rows x, y;    // forward: x → y
  Rows dy, dx;  // backward: (dy, x) → dx
};

// Gated: out = round(act(gate)) · up (act rounded to the dtype first, as Transformers'
// act_fn(gate)·up does). Backward: dgate = dout·up·act'(gate), dup = dout·round(act(gate)).
// dgate/dup may alias gate/up (Liger writes them in place).
struct GatedAct {
  Act act = Act::SiLU;
  Rows gate, up, out;
  Rows dout, dgate, dup;
};

// ---- cross-entropy ------------------------------------------------------------------------------
enum class Reduction : uint8_t { None = 0, Mean = 1, Sum = 2 };

// Per row i with target t = labels[i] (t == ignore_index → loss 0, grad 0):
//   z_j   = softcap > 0 ? softcap·tanh(x_j / softcap) : x_j
//   lse   = log Σ exp z_j
//   loss  = (1-ε)(lse - z_t) + ε(lse - mean_j z_j) + zloss·lse²
//   dz_j  = softmax_j·(1 + 2·zloss·lse) - ε/V - (1-ε)[j==t];  dx_j = dz_j · (1 - tanh²) if softcap
// Mean divides by the number of non-ignored rows (counted on the device; 0 → loss 0, no NaN).
// One launcher serves forward and backward:
//  * forward: loss (and lse / z_loss) written; with dlogits given, the gradient too (Liger's
//    design: the forward leaves d(logits) behind, for an upstream gradient of 1 or of `dloss`);
//  * backward: lse_in given (from the forward) → the row is read once and only dlogits written;
//    loss may be null.
// `dloss` (device f32, a scalar for Mean/Sum, [rows] for None) scales the gradient when given.
struct CrossEntropyArgs {
  Rows logits;
  const void* labels = nullptr;
  IndexDt labels_dt = IndexDt::I64;
  int64_t labels_stride = 1;
  Rows dlogits;                   // data may be null (forward only); may equal logits (in place)
  float* loss = nullptr;          // f32: [rows] for None, scalar otherwise
  float* z_loss = nullptr;        // optional, same shape as loss: the zloss·lse² part
  float* lse = nullptr;           // optional f32 [rows]
  const float* lse_in = nullptr;  // backward: the forward's lse (skips the softmax pass)
  const float* dloss = nullptr;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss_scale = 0.0f;
  float softcap = 0.0f;
  Reduction reduction = Reduction::Mean;
  // Mean divisor override: when > 0, Mean divides by this instead of the count (Transformers'
  // num_items_in_batch).
  float mean_divisor = 0.0f;
  void* workspace = nullptr;
};

// dlogits *= dloss: dloss is a device scalar (Mean/Sum) or [rows] (None).
struct CrossEntropyScale {
  Rows dlogits;
  const float* dloss = nullptr;
  Reduction reduction = Reduction::Mean;
};

// ---- fused linear cross-entropy -----------------------------------------------------------------
// logits = hidden[N, H] · weight[V, H]^T, then cross-entropy as above, processed in chunks of
// `chunk_tokens` rows so the full [N, V] logits never exist. Gradients (for an upstream gradient
// of 1, or of `dloss` when given) are produced in the same pass: dhidden [N, H] (hidden's dtype)
// and dweight [V, H] (f32 accumulation; written in dweight's dtype at the end). Either gradient
// and the loss may be null.
struct FusedLinearCrossEntropyArgs {
  Rows hidden;  // [N, H]
  Rows weight;  // [V, H]
  const void* labels = nullptr;
  IndexDt labels_dt = IndexDt::I64;
  int64_t labels_stride = 1;
  Rows dhidden;  // data may be null
  Rows dweight;  // data may be null; f32 or weight's dtype
  bool accumulate_dweight = false;
  float* loss = nullptr;
  float* z_loss = nullptr;
  const float* dloss = nullptr;  // device f32: scalar (Mean/Sum) or [N] (None)
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss_scale = 0.0f;
  float softcap = 0.0f;
  Reduction reduction = Reduction::Mean;
  float mean_divisor = 0.0f;
  int64_t chunk_tokens = 0;  // 0 → default_chunk_tokens(...)
  void* workspace = nullptr;
};

// Rows per chunk. Fewer, larger chunks cost less (each chunk's d(weight) GEMM reads and writes
// the whole f32 accumulator, and a d(hidden) GEMM of few rows leaves SMs idle), so the chunk
// takes what is left of a 1.28 GB budget for the extra memory (the bound is 1.3 GB) after
// the f32 d(weight) accumulator (when dweight is 16-bit) and the GEMM workspace; then the chunks
// are evened out. A multiple of 128 in [128, 8192] (128 even when over budget). At Qwen3-0.6B's
// shapes (8192 tokens, vocab 151936, hidden 1024, bf16): 4 chunks of 2048, 1.278 GB; on the H200
// 2048-token chunks ran 13.6 ms against 14.3 ms for 1664 and 14.4 ms for 1024.
int64_t default_chunk_tokens(int64_t n, int64_t vocab, int64_t hidden, size_t logit_bytes,
                             bool f32_dweight_buffer);

}  // namespace liger

namespace liger {

// ---- gated MLP (SwiGLU / GeGLU with its three projections) --------------------------------------
// forward : g = x·gate_wᵀ, u = x·up_wᵀ, h = round(act(g))·u, y = h·down_wᵀ
// backward: g, u from the forward (saved) or recomputed; h recomputed; dh = dy·down_w;
//           d(down_w) (+)= dyᵀ·h; (dg, du) from the gated activation backward (in place over g,
//           u); dx = dg·gate_w + du·up_w; d(gate_w) (+)= dgᵀ·x, d(up_w) (+)= duᵀ·x.
// All matrices share x's dtype except the weight gradients (their own dtype, f32 accumulation in
// the GEMM). `gate`/`up` (both or neither): forward writes g, u there instead of into scratch (a
// training forward keeps them); backward reads them instead of recomputing the two GEMMs and
// overwrites them with dg, du. The cuda variant takes the rest of its [rows, I] intermediates
// from the workspace (mlp_workspace_bytes); the cpu variant allocates them.
struct MlpArgs {
  Act act = Act::SiLU;
  Rows x, gate_w, up_w, down_w;  // [rows, H], [I, H], [I, H], [H, I]
  Rows y;                        // forward output [rows, H]
  Rows dy, dx;                   // backward
  Rows dgate_w, dup_w, ddown_w;  // backward, each optional (data null)
  Rows gate, up;                 // [rows, I] saved pre-activations, optional (data null)
  bool accumulate = false;
  void* workspace = nullptr;
};

// ---- Linear (linear@1) --------------------------------------------------------------------------
// forward : y[rows, N] = x[rows, K]·wᵀ (+ b), f32 accumulation, one rounding (the bias is added
//           before it)
// backward: dx = dy·w; dw = dyᵀ·x and db = Σ_rows dy, written or accumulated, f32 sums
struct LinearArgs {
  Rows x, w, y;             // forward (x also in backward)
  Vec b;                    // forward bias, data may be null
  Rows dy, dx, dw;          // backward; dx.data / dw.data may be null
  Vec db;                   // backward bias gradient, data may be null
  bool accumulate = false;  // dw / db are added to
  void* workspace = nullptr;
};

}  // namespace liger
