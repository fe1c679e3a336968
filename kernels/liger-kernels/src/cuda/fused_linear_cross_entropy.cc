// cuda/fused_linear_cross_entropy.cc — hidden·weightᵀ → cross-entropy → d(hidden), d(weight),
// chunk by chunk, so the [N, V] logits never exist (host orchestration; the device work is three
// cuBLASLt GEMMs and the cross-entropy kernel per chunk).
//
// Per chunk of C token rows: (1) logits[C, V] = h·Wᵀ into a workspace buffer in h's dtype;
// (2) the cross-entropy kernel writes each row's loss and overwrites the logits with d(logits)
// (already divided by Mean's divisor, counted on the device before the first chunk);
// (3) d(h)[chunk] = d(logits)·W; (4) d(W) += d(logits)ᵀ·h accumulated in f32 (straight into
// dweight when it is f32, else into an f32 workspace converted once at the end). Extra memory:
// one chunk of logits + the f32 d(W) when dweight is 16-bit + 32 MiB of cuBLASLt workspace.
// No host synchronisation; the cuBLASLt handle is created once per device on first use (so this
// entry does not claim CUDA-graph capture).
#include <cuda_runtime.h>

#include "cuda/ce_launch.h"
#include "cuda/gemm.h"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

struct FlceWorkspace {
  float* inv;
  float* row_loss;
  float* row_z;
  void* logits;
  float* dweight32;
  void* gemm;
};

FlceWorkspace carve(void* ws, int64_t n, int64_t h, int64_t vocab, Dt dt, Dt wgrad_dt,
                    int64_t chunk, size_t* total) {
  char* base = static_cast<char*>(ws);
  size_t off = 0;
  FlceWorkspace w{};
  w.inv = reinterpret_cast<float*>(base + off);
  off += 256;
  w.row_loss = reinterpret_cast<float*>(base + off);
  off += align256(4 * static_cast<size_t>(n));
  w.row_z = reinterpret_cast<float*>(base + off);
  off += align256(4 * static_cast<size_t>(n));
  w.logits = base + off;
  off += align256(static_cast<size_t>(chunk * vocab) * dt_size(dt));
  if (wgrad_dt != Dt::F32) {
    w.dweight32 = reinterpret_cast<float*>(base + off);
    off += align256(4 * static_cast<size_t>(vocab * h));
  }
  w.gemm = base + off;
  off += kGemmWorkspace;
  *total = off;
  return w;
}

}  // namespace

int64_t chunk_rows(int64_t n, int64_t vocab, int64_t hidden, Dt dt, Dt wgrad_dt,
                   int64_t requested) {
  if (requested > 0) return requested < n ? requested : (n > 0 ? n : 1);
  return default_chunk_tokens(n, vocab, hidden, dt_size(dt), wgrad_dt != Dt::F32);
}

size_t fused_linear_cross_entropy_workspace_bytes(int64_t n, int64_t hidden, int64_t vocab,
                                                  Dt hidden_dt, Dt weight_grad_dt,
                                                  int64_t chunk_tokens) {
  size_t total = 0;
  carve(nullptr, n, hidden, vocab, hidden_dt, weight_grad_dt,
        chunk_rows(n, vocab, hidden, hidden_dt, weight_grad_dt, chunk_tokens), &total);
  return total;
}

int fused_linear_cross_entropy_fwd(const FusedLinearCrossEntropyArgs& a, void* stream) {
  const int64_t n = a.hidden.rows, h = a.hidden.cols, vocab = a.weight.rows;
  const Dt dt = a.hidden.dt;
  const Dt wgrad_dt = a.dweight.data ? a.dweight.dt : Dt::F32;
  const int64_t chunk = chunk_rows(n, vocab, h, dt, wgrad_dt, a.chunk_tokens);
  size_t total = 0;
  const FlceWorkspace ws = carve(a.workspace, n, h, vocab, dt, wgrad_dt, chunk, &total);
  const bool none = a.reduction == Reduction::None;
  const bool want_grad = a.dhidden.data || a.dweight.data;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  if (a.reduction == Reduction::Mean) {
    if (int e = launch_inv_divisor(a.labels, a.labels_dt, a.labels_stride, n, a.ignore_index,
                                   a.mean_divisor, ws.inv, stream))
      return e;
  }
  float* dw32 = a.dweight.data
                    ? (wgrad_dt == Dt::F32 ? static_cast<float*>(a.dweight.data) : ws.dweight32)
                    : nullptr;
  const int64_t dw32_ld = wgrad_dt == Dt::F32 && a.dweight.data ? a.dweight.row_stride : h;
  const size_t label_bytes = a.labels_dt == IndexDt::I32 ? 4 : 8;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = n - r0 < chunk ? n - r0 : chunk;
    const char* hid = static_cast<const char*>(a.hidden.data) +
                      static_cast<size_t>(r0 * a.hidden.row_stride) * dt_size(dt);
    // (1) logitsᵀ[V, rows] (column-major) = W[V, H] · hᵀ[H, rows]
    Gemm g1{true,
            false,
            vocab,
            rows,
            h,
            a.weight.data,
            a.weight.dt,
            a.weight.row_stride,
            hid,
            dt,
            a.hidden.row_stride,
            ws.logits,
            dt,
            vocab,
            0.0f};
    if (int e = run_gemm(lt, g1, ws.gemm, stream)) return e;
    // (2) loss and d(logits) in place
    CeRowsP p{};
    p.logits = ws.logits, p.logits_stride = vocab, p.dt = dt;
    p.grad = want_grad ? ws.logits : nullptr, p.grad_stride = vocab;
    p.rows = rows, p.vocab = vocab;
    p.labels = static_cast<const char*>(a.labels) +
               static_cast<size_t>(r0 * a.labels_stride) * label_bytes;
    p.labels_dt = a.labels_dt, p.labels_stride = a.labels_stride;
    p.row_loss = none ? (a.loss ? a.loss + r0 : nullptr) : ws.row_loss + r0;
    p.row_z = none ? (a.z_loss ? a.z_loss + r0 : nullptr) : (a.z_loss ? ws.row_z + r0 : nullptr);
    p.dloss = a.dloss ? a.dloss + (none ? r0 : 0) : nullptr, p.dloss_per_row = none;
    p.grad_scale = a.reduction == Reduction::Mean ? ws.inv : nullptr;
    p.ignore_index = a.ignore_index, p.label_smoothing = a.label_smoothing;
    p.z_loss_scale = a.z_loss_scale, p.softcap = a.softcap;
    if (int e = launch_ce_rows(p, stream)) return e;
    // (3) d(h)ᵀ[H, rows] = Wᵀ[H, V] · d(logits)ᵀ[V, rows]
    if (a.dhidden.data) {
      void* dh = static_cast<char*>(a.dhidden.data) +
                 static_cast<size_t>(r0 * a.dhidden.row_stride) * dt_size(a.dhidden.dt);
      Gemm g2{false,
              false,
              h,
              rows,
              vocab,
              a.weight.data,
              a.weight.dt,
              a.weight.row_stride,
              ws.logits,
              dt,
              vocab,
              dh,
              a.dhidden.dt,
              a.dhidden.row_stride,
              0.0f};
      if (int e = run_gemm(lt, g2, ws.gemm, stream)) return e;
    }
    // (4) d(W)ᵀ[H, V] (+)= hᵀ[H, rows] · d(logits)[rows, V]   (f32)
    if (dw32) {
      const bool first = r0 == 0 && !(a.accumulate_dweight && wgrad_dt == Dt::F32);
      Gemm g3{false,
              true,
              h,
              vocab,
              rows,
              hid,
              dt,
              a.hidden.row_stride,
              ws.logits,
              dt,
              vocab,
              dw32,
              Dt::F32,
              dw32_ld,
              first ? 0.0f : 1.0f};
      if (int e = run_gemm(lt, g3, ws.gemm, stream)) return e;
    }
  }
  if (dw32 && wgrad_dt != Dt::F32) {
    if (a.dweight.row_stride != h) return static_cast<int>(cudaErrorInvalidValue);
    if (int e =
            launch_f32_to(dw32, a.dweight.data, wgrad_dt, vocab * h, a.accumulate_dweight, stream))
      return e;
  }
  if (none || !a.loss) return 0;
  const float* inv = a.reduction == Reduction::Mean ? ws.inv : nullptr;
  if (int e = launch_sum_scaled(ws.row_loss, n, inv, a.loss, stream)) return e;
  if (a.z_loss) return launch_sum_scaled(ws.row_z, n, inv, a.z_loss, stream);
  return 0;
}

}  // namespace liger::cuda
