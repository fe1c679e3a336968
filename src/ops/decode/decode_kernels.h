// Internal: the fused CUDA kernels of the decode step (src/generation/decode_step.cc), one token
// per row against a static KV cache, with everything that changes between steps (tokens, rotary
// positions, cache lengths, finished rows) read from device buffers so a captured CUDA graph stays
// valid from step to step.
//
//   gemv           y = x·Wᵀ (+ b) for M ≤ 64 rows of x: bf16/f16 weights through mma.sync with the
//                  weight streamed once (prefetched into L2 and its first chunks loaded before
//                  the kernel waits on its predecessor), or for M ≤ 8 on sm_90 with each block's
//                  weight rows staged whole in shared memory before that wait (gemv_bulk_sm90.cu),
//                  f32 (M ≤ 16) on CUDA cores. Up to three weights sharing x in one launch
//                  (q, k and v), an optional RMSNorm prologue (x = rms_norm(residual + delta), the
//                  residual written back), an optional SwiGLU epilogue (gate and up in one block).
//   qk_rope_cache  q/k RMSNorm (Qwen3), rotary from device positions and the k/v write into the
//                  cache at each row's device length, in one launch.
//   attention      one query per row over its cache [key_start, length + add), split over blocks
//                  when there are few (row, kv head) pairs, splits combined by the last block; or
//                  with eager semantics (probabilities rounded before P·V, no splits).
//   greedy         argmax per row (first index on ties, as torch.argmax) plus the generation
//                  bookkeeping: finished rows get the pad id, eos marks a row finished, positions
//                  and lengths advance.
//
// Every kernel uses programmatic dependent launch when the device has it (sm_90; HK_DECODE_PDL=0
// turns it off): it issues its independent prefetches, then waits for its predecessor before
// touching anything a predecessor writes. Numerics follow the built-in ops (f32 math, the same
// rounding points: hk/ops.h); only the order of f32 sums differs. No kernel allocates or reads
// device memory on the host. Not here: the layer choice (which step is fused, which goes through
// a layer implementation) — that is decode_step.cc's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hk/dtype.h"
#include "hk/stream.h"

namespace hk::decode {

// True when the kernels launch with programmatic dependent launch (device sm_90+, HK_DECODE_PDL
// not 0).
bool pdl_enabled();

// ---- gemv ------------------------------------------------------------------------------------
struct GemvSegment {
  const void* weight = nullptr;  // [n, k], row stride k, 16-byte aligned
  const void* bias = nullptr;    // [n] or null
  void* out = nullptr;           // out[m * out_stride + j]
  int64_t out_stride = 0;
  int64_t n = 0;
};
// x = rms_norm(residual + delta) (delta optional), with the rounding of ops::add_rms_norm /
// ops::rms_norm; when delta is given the rounded sum is also written to residual_out (a buffer
// other than residual).
struct GemvPrologue {
  const void* residual = nullptr;
  int64_t residual_stride = 0;
  const void* delta = nullptr;
  int64_t delta_stride = 0;
  void* residual_out = nullptr;
  int64_t residual_out_stride = 0;
  const void* norm_weight = nullptr;
  float eps = 1e-6f;
};
enum class GemvEpilogue {
  Store,    // each segment's out = x·Wᵀ + b
  SiluMul,  // segments[0] = gate, [1] = up (same n): segments[0].out = round(silu(gate))·up
};
// Which kernel serves a 16-bit gemv: Auto takes the shared-memory-staged one (sm_90, 1–8 rows,
// staged rows within its shared-memory budget) where it serves, else the mma.sync one; the
// environment's HK_DECODE_GEMV=mma|bulk overrides Auto. Bulk where it cannot serve throws
// Unsupported with the reason (tests and benchmarks ask for each by name).
enum class GemvKernel { Auto, Mma, Bulk };
struct GemvParams {
  GemvKernel kernel = GemvKernel::Auto;
  DType dtype = DType::BF16;  // of x, the weights, biases and outputs
  int64_t m = 0, k = 0;
  const void* x = nullptr;  // [m, k] with row stride x_stride (unused with a prologue)
  int64_t x_stride = 0;
  bool has_prologue = false;
  GemvPrologue prologue;
  GemvSegment segments[3];
  int num_segments = 0;
  GemvEpilogue epilogue = GemvEpilogue::Store;
  // Timing (hk_bench_decode_chain --trace): the staged kernel's thread 0 of block i writes
  // %globaltimer at its kGemvTracePoints phases to trace[i * kGemvTracePoints + p]; null: none.
  uint64_t* trace = nullptr;
};
// start, copies issued, wait returned, x in shared memory, weights landed, products done, stored;
// then, in launches with the RMSNorm prologue (its first row's warp): the row's sum of squares
// formed (its loads returned), the scale ready (warp sum, norm weight landed), the row normalised
// into shared memory
constexpr int kGemvTracePoints = 10;
constexpr int kGemvTraceMainPoints = 7;
constexpr int64_t kGemvMaxRows = 64;     // 16-bit weights (tensor cores, 8 x rows per n-tile)
constexpr int64_t kGemvMaxRowsF32 = 16;  // f32 weights (CUDA cores)
// Batches the decode step hands to the gemv (larger ones go through the layers' own products,
// cuBLASLt for the built-in Linear, one product per set of sibling weights the loader stored
// adjacently): 16, measured on the H200 (2026-12-01: at batch 32 and 64 the gemv reached 15.3k /
// 19.1k tok/s, cuBLASLt 18.1k / 28.3k; a 17–64-row gemv that staged x in shared memory lost too,
// 18.3k against 30.2k at 64); HK_DECODE_GEMV_MAX_ROWS overrides.
constexpr int64_t kGemvPreferredMaxRows = 16;
int64_t gemv_preferred_max_rows();
// Why gemv cannot run `p` (a sentence), or "" when it can.
std::string gemv_unsupported(const GemvParams& p);
// Why the kernel p.kernel names cannot serve `p` on this device, where gemv_unsupported(p) is ""
// ("" when it can; Auto and Mma always can).
std::string gemv_kernel_unsupported(const GemvParams& p);
void gemv(const GemvParams& p, Stream stream);

// ---- q/k norm + rotary + cache write
// -------------------------------------------------------------
struct QkRopeCacheParams {
  DType dtype = DType::BF16;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  void* qkv = nullptr;  // row b: q heads, then k heads, then v heads (head_dim each)
  int64_t qkv_stride = 0;
  bool process_q = true;                // false: q is left alone (rotated elsewhere)
  const void* q_norm_weight = nullptr;  // [D] or null: no q/k norm
  const void* k_norm_weight = nullptr;
  float eps = 1e-6f;
  bool rotate = true;                  // false: k goes to the cache as it is
  const int32_t* positions = nullptr;  // [B] rotary positions
  const float* inv_freq = nullptr;     // [D/2] used when rope_theta == 0
  float rope_theta = 0.0f;  // > 0: inv_freq = theta^(-2j/D) computed as ops::rotary_tables
  float attention_scaling = 1.0f;
  const int32_t* cache_index = nullptr;  // [B] cache row of this token (the length before the step)
  void* k_cache = nullptr;               // [B, T, Hkv, D] with these element strides
  void* v_cache = nullptr;
  int64_t cache_batch_stride = 0, cache_row_stride = 0, capacity = 0;
};
void qk_rope_cache(const QkRopeCacheParams& p, Stream stream);

// cos/sin [B, 1, D] f32 for device positions [B] (Transformers' duplicated-halves layout): for a
// rotary implementation that is not the built-in one.
void rope_tables(const int32_t* positions, int64_t batch, int64_t head_dim, const float* inv_freq,
                 float rope_theta, float attention_scaling, float* cos, float* sin, Stream stream);

// ---- attention
// -----------------------------------------------------------------------------------
struct DecodeAttentionParams {
  DType dtype = DType::BF16;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  const void* q = nullptr;  // row b at q + b·q_batch_stride: heads_q heads of head_dim
  int64_t q_batch_stride = 0;
  const void* k_cache = nullptr;  // [B, T, Hkv, D] with these element strides (head stride D)
  const void* v_cache = nullptr;
  int64_t cache_batch_stride = 0, cache_row_stride = 0;
  const int32_t* lengths = nullptr;  // [B]; keys [key_start[b], lengths[b] + length_add)
  int32_t length_add = 1;
  const int32_t* key_start = nullptr;  // [B] or null
  void* out = nullptr;                 // row b at out + b·out_batch_stride, like q
  int64_t out_batch_stride = 0;
  float scale = 0.0f;  // 0 → 1/sqrt(D)
  // true: eager semantics (probabilities rounded to the dtype before P·V, as ops::attention and
  // Transformers' eager attention); false: flash/sdpa semantics (no rounding, online softmax).
  bool eager = false;
  int splits = 1;  // from attention_splits (ignored with eager); > 1 needs workspace and counters
  float* workspace = nullptr;   // attention_workspace_floats
  int32_t* counters = nullptr;  // [B·Hkv] zeros (left zero after each call)
};
// Key splits for (batch, kv heads) pairs over at most `max_keys` keys: enough blocks for the
// device.
int attention_splits(int64_t batch, int64_t heads_kv, int64_t max_keys);
size_t attention_workspace_floats(int64_t batch, int64_t heads_q, int64_t head_dim, int splits);
std::string attention_unsupported(const DecodeAttentionParams& p);
void attention(const DecodeAttentionParams& p, Stream stream);

// ---- greedy pick + bookkeeping ---------------------------------------------------------------
struct GreedyParams {
  DType dtype = DType::BF16;  // of the logits
  int64_t batch = 0, vocab = 0;
  const void* logits = nullptr;  // row b at logits + b·logits_stride
  int64_t logits_stride = 0;
  int64_t* tokens = nullptr;     // [B] written: next input ids
  int32_t* done = nullptr;       // [B] 0/1, finished rows (read, set on eos)
  const int64_t* eos = nullptr;  // [num_eos] on the device
  int num_eos = 0;
  int64_t pad_id = 0;
  int32_t* positions = nullptr;        // [B] += 1
  int32_t* lengths = nullptr;          // [B] += 1
  int blocks_per_row = 1;              // from greedy_blocks_per_row
  float* partial_values = nullptr;     // [B · blocks_per_row]
  int32_t* partial_indices = nullptr;  // [B · blocks_per_row]
  int32_t* counters = nullptr;         // [B] zeros (left zero)
};
int greedy_blocks_per_row(int64_t batch, int64_t vocab);
void greedy(const GreedyParams& p, Stream stream);
// positions and lengths += 1 (steps whose next token the host picks).
void advance(int32_t* positions, int32_t* lengths, int64_t batch, Stream stream);

// ---- the whole step in one launch (sm_90, batch 1; step_persistent_sm90.cu) ---------------------
// One cooperative launch, one block an SM, does a batch-1 step of a Qwen3/Llama decoder with
// built-in layers: the embedding row, every layer (q/k/v with the input RMSNorm; q/k RMSNorm,
// rotary, the cache write, attention and o_proj; the post-attention RMSNorm, gate/up, SwiGLU and
// down), the final norm, lm_head, and the greedy pick with the generation bookkeeping (or f32
// logits and the advance for sampling). o_proj and down are split over the blocks by their input
// (split-K), so their weights are read transposed ([in, out] rows: the plan keeps copies); three
// grid-wide dependencies a layer. Shapes: hidden 1024, head dim 128, bf16, cache ≤ 256 positions.
struct PersistentLayer {
  const void* qkv = nullptr;     // [(Hq + 2·Hkv)·D, hidden]: q, k and v rows adjacent
  const void* o_t = nullptr;     // [Hq·D, hidden]: o_proj's weight transposed
  const void* gate = nullptr;    // [inter, hidden]
  const void* up = nullptr;      // [inter, hidden]
  const void* down_t = nullptr;  // [inter, hidden]: down_proj's weight transposed
  const void* input_norm = nullptr;
  const void* post_norm = nullptr;
  const void* q_norm = nullptr;  // [D] each, or both null (no q/k norm)
  const void* k_norm = nullptr;
  void* k_cache = nullptr;  // [1, capacity, Hkv, D] contiguous
  void* v_cache = nullptr;
};
struct PersistentStepParams {
  int64_t hidden = 0, heads_q = 0, heads_kv = 0, head_dim = 0, inter = 0, vocab = 0;
  int64_t capacity = 0;  // cache rows
  std::vector<PersistentLayer> layers;
  const void* embed = nullptr;    // [vocab, hidden]
  const void* lm_head = nullptr;  // [vocab, hidden]
  const void* final_norm = nullptr;
  float eps = 1e-6f, qk_eps = 1e-6f;  // the layers' RMSNorm and the q/k norms'
  float scale = 0.0f;                 // attention scale (0: 1/√D)
  const float* inv_freq = nullptr;    // [D/2] used when rope_theta == 0
  float rope_theta = 0.0f, attention_scaling = 1.0f;
  // the generation state (DecodeBuffers, batch 1)
  int64_t* tokens = nullptr;
  int32_t* positions = nullptr;
  int32_t* lengths = nullptr;
  const int32_t* key_start = nullptr;
  int32_t* done = nullptr;
  const int64_t* eos = nullptr;
  int num_eos = 0;
  int64_t pad_id = 0;
  float* logits_f32 =
      nullptr;  // sampling: [vocab] written, positions/lengths advanced; null: greedy
  // true: the split-K sums in fixed point with each element's contribution count in it (the same
  // bits whatever the order blocks add in: graph replays give the ids of eager steps); false: f32
  // vector reductions behind grid-wide counters (faster, the last bits vary run to run)
  bool deterministic = true;
  // true: a second build of the kernel also adds each block's clock cycles a phase into the
  // workspace (its inputs, its products, weight-chunk waits, the whole phase), read by
  // persistent_step_profile (for finding where a step's time goes; the default build has none)
  bool profile = false;
  void* workspace =
      nullptr;  // persistent_step_workspace_bytes(), prepared by persistent_step_prepare
};
// Why the persistent step cannot serve `p` on this device (a sentence), or "" when it can.
std::string persistent_step_unsupported(const PersistentStepParams& p);
size_t persistent_step_workspace_bytes(const PersistentStepParams& p);
// Writes the phase descriptors into p.workspace and zeroes its counters and accumulators
// (synchronous; once, before the first step and outside any capture).
void persistent_step_prepare(const PersistentStepParams& p, Stream stream);
void persistent_step(const PersistentStepParams& p, Stream stream);
// With p.profile, where the steps since persistent_step_prepare spent their time, a line per phase
// kind (q/k/v, attention + o_proj, MLP, lm_head), per block and step, mean over blocks and the
// slowest block: waiting for the phase's inputs (the grid-wide dependency), up to its products,
// the products to the first and to the last warp done (and the weight-chunk waits among them),
// the block's closing barrier; and the launch's prologue and epilogue — in µs at the clock the
// cycles ran at (from %globaltimer). "" without p.profile or steps. Synchronises `stream`.
std::string persistent_step_profile(const PersistentStepParams& p, Stream stream);

}  // namespace hk::decode
