// flash_attn/from_views.h — filling flash.h's Params from hk::TensorView, shared by libhk's
// fused attention (src/ops/attention_fused_cuda.cc) and the hub repos' C ABI glue (src/abi/), so
// both check and map tensors the same way.
//
// Header-only and touching TensorView's fields alone (kernel libraries never link libhk). Every
// refusal is an exception with a sentence: InvalidShape for a call the layer interface does not
// allow (wrong ranks, shapes, dtypes), Unsupported (flash.h) for a valid call these kernels do not
// serve (f32, a non-unit head-dim stride, head_dim 96, ...).
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>

#include "flash_attn/flash.h"
#include "hk/tensor.h"

namespace hk_flash {

struct InvalidShape : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Mask and score options of one call (attention@1 / attention_varlen@1 attributes).
struct CallOptions {
  float scale = 0.0f;
  bool causal = true;
  float softcap = 0.0f;
  int window_left = -1;
  const hk::TensorView* key_start = nullptr;  // [B] i32/i64
  // varlen: [total, H, D] tensors and i32 [B + 1] offsets; max_seqlen_* bound the lengths
  const hk::TensorView* cu_seqlens_q = nullptr;
  const hk::TensorView* cu_seqlens_k = nullptr;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool deterministic = false;
  bool allow_sm90 = true;
};

namespace views {

inline std::string shape_str(const hk::TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}
inline void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidShape(what);
}
inline Dtype dtype_of(const hk::TensorView& t, const char* name) {
  if (t.dtype == hk::DType::BF16) return Dtype::BF16;
  if (t.dtype == hk::DType::F16) return Dtype::F16;
  throw Unsupported(std::string("flash attention computes in bf16 or f16, ") + name + " is " +
                    (t.dtype == hk::DType::F32 ? "f32" : "another dtype"));
}
inline bool on_cuda(const hk::TensorView& t) {
  return t.device.type == hk::DeviceType::CUDA;
}
// [.., rows, H, D] strides; the head dim must be contiguous.
inline Strides strides_of(const hk::TensorView& t, const char* name) {
  if (t.strides[t.ndim - 1] != 1 && t.shape[t.ndim - 1] > 1)
    throw Unsupported(std::string("flash attention needs a contiguous head dim in ") + name);
  Strides s;
  if (t.ndim == 4) {
    s.batch = t.strides[0];
    s.row = t.strides[1];
    s.head = t.strides[2];
  } else {
    s.row = t.strides[0];
    s.head = t.strides[1];
  }
  return s;
}
inline const int32_t* i32_vector(const hk::TensorView& t, int64_t n, const char* name) {
  require(t.ndim == 1 && t.shape[0] == n && t.dtype == hk::DType::I32 &&
              (t.strides[0] == 1 || n <= 1) && on_cuda(t),
          std::string(name) + " must be a contiguous i32 [" + std::to_string(n) +
              "] on the device, got " + shape_str(t));
  return static_cast<const int32_t*>(t.ptr());
}

}  // namespace views

// q/out [B, S, Hq, D] (varlen [Sq, Hq, D]), k/v [B, T, Hkv, D] ([Sk, Hkv, D]); lse f32 [B, Hq, S]
// ([Hq, Sq]) or null.
inline Params forward_params(const hk::TensorView& q, const hk::TensorView& k,
                             const hk::TensorView& v, const hk::TensorView& out,
                             const hk::TensorView* lse, const CallOptions& o) {
  using namespace views;
  const bool varlen = o.cu_seqlens_q != nullptr || o.cu_seqlens_k != nullptr;
  const int rank = varlen ? 3 : 4;
  require(q.ndim == rank && k.ndim == rank && v.ndim == rank && out.ndim == rank,
          std::string("attention tensors must be ") +
              (varlen ? "[rows, heads, head_dim]" : "[batch, seq, heads, head_dim]") + ", got q " +
              shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v) + ", out " +
              shape_str(out));
  for (int i = 0; i < rank; ++i) {
    require(k.shape[i] == v.shape[i], "k " + shape_str(k) + " and v " + shape_str(v) + " differ");
    require(q.shape[i] == out.shape[i],
            "out " + shape_str(out) + " must have q's shape " + shape_str(q));
  }
  const int hd = rank - 1, hh = rank - 2;
  require(q.shape[hd] == k.shape[hd],
          "q and k/v head dims differ: " + shape_str(q) + " vs " + shape_str(k));
  require(k.shape[hh] > 0 && q.shape[hh] % k.shape[hh] == 0,
          "q heads (" + std::to_string(q.shape[hh]) + ") must be a multiple of kv heads (" +
              std::to_string(k.shape[hh]) + ")");
  require(on_cuda(q) && on_cuda(k) && on_cuda(v) && on_cuda(out),
          "flash attention tensors must be on a CUDA device");
  Params p;
  p.dtype = dtype_of(q, "q");
  require(k.dtype == q.dtype && v.dtype == q.dtype && out.dtype == q.dtype,
          "q, k, v and out must share one dtype");
  p.head_dim = static_cast<int>(q.shape[hd]);
  p.heads_q = static_cast<int>(q.shape[hh]);
  p.heads_kv = static_cast<int>(k.shape[hh]);
  p.q = q.ptr();
  p.k = k.ptr();
  p.v = v.ptr();
  p.out = out.ptr();
  p.q_strides = strides_of(q, "q");
  p.k_strides = strides_of(k, "k");
  p.v_strides = strides_of(v, "v");
  p.out_strides = strides_of(out, "out");
  if (varlen) {
    require(o.cu_seqlens_q != nullptr && o.cu_seqlens_k != nullptr,
            "varlen attention needs both cu_seqlens_q and cu_seqlens_k");
    const int64_t n = o.cu_seqlens_q->ndim == 1 ? o.cu_seqlens_q->shape[0] : 0;
    require(n >= 2, "cu_seqlens_q must be [batch + 1] with batch ≥ 1");
    p.cu_seqlens_q = i32_vector(*o.cu_seqlens_q, n, "cu_seqlens_q");
    p.cu_seqlens_k = i32_vector(*o.cu_seqlens_k, n, "cu_seqlens_k");
    p.batch = static_cast<int>(n - 1);
    require(o.max_seqlen_q > 0 && o.max_seqlen_k >= 0 && o.max_seqlen_q <= q.shape[0] &&
                o.max_seqlen_k <= k.shape[0],
            "varlen attention needs max_seqlen_q in [1, " + std::to_string(q.shape[0]) +
                "] and max_seqlen_k in [0, " + std::to_string(k.shape[0]) + "]");
    p.seqlen_q = static_cast<int>(o.max_seqlen_q);
    p.seqlen_k = static_cast<int>(o.max_seqlen_k);
    p.total_q = static_cast<int>(q.shape[0]);
    require(o.key_start == nullptr, "key_start (left padding) is for batch layouts, not varlen");
  } else {
    require(q.shape[0] == k.shape[0], "q and k/v batch sizes differ");
    p.batch = static_cast<int>(q.shape[0]);
    p.seqlen_q = static_cast<int>(q.shape[1]);
    p.seqlen_k = static_cast<int>(k.shape[1]);
  }
  if (lse != nullptr) {
    const bool ok =
        varlen ? lse->ndim == 2 && lse->shape[0] == p.heads_q && lse->shape[1] == q.shape[0]
               : lse->ndim == 3 && lse->shape[0] == p.batch && lse->shape[1] == p.heads_q &&
                     lse->shape[2] == p.seqlen_q;
    require(ok && lse->dtype == hk::DType::F32 && on_cuda(*lse) &&
                (lse->strides[lse->ndim - 1] == 1 || lse->shape[lse->ndim - 1] <= 1),
            std::string("lse must be f32 ") + (varlen ? "[heads, rows]" : "[batch, heads, seq]") +
                " with unit last stride, got " + shape_str(*lse));
    p.lse = static_cast<float*>(lse->ptr());
    p.lse_head = lse->strides[lse->ndim - 2];
    p.lse_batch = varlen ? 0 : lse->strides[0];
  }
  if (o.key_start != nullptr) {
    const hk::TensorView& ks = *o.key_start;
    require(ks.ndim == 1 && ks.shape[0] == p.batch &&
                (ks.dtype == hk::DType::I32 || ks.dtype == hk::DType::I64) &&
                (ks.strides[0] == 1 || p.batch == 1) && on_cuda(ks),
            "key_start must be a contiguous i32/i64 [batch] on the device, got " + shape_str(ks));
    p.key_start = ks.ptr();
    p.key_start_i64 = ks.dtype == hk::DType::I64;
  }
  p.scale = o.scale;
  p.softcap = o.softcap;
  p.window_left = o.window_left;
  p.causal = o.causal;
  p.allow_sm90 = o.allow_sm90;
  require(std::isfinite(p.softcap) && p.softcap >= 0.0f, "softcap must be ≥ 0");
  return p;
}

inline BackwardParams backward_params(const hk::TensorView& dout, const hk::TensorView& q,
                                      const hk::TensorView& k, const hk::TensorView& v,
                                      const hk::TensorView& out, const hk::TensorView& lse,
                                      const hk::TensorView& dq, const hk::TensorView& dk,
                                      const hk::TensorView& dv, const CallOptions& o) {
  using namespace views;
  BackwardParams p;
  static_cast<Params&>(p) = forward_params(q, k, v, out, &lse, o);
  for (int i = 0; i < q.ndim; ++i) {
    require(dout.ndim == q.ndim && dq.ndim == q.ndim && dout.shape[i] == q.shape[i] &&
                dq.shape[i] == q.shape[i],
            "dout " + shape_str(dout) + " and dq " + shape_str(dq) + " must have q's shape " +
                shape_str(q));
    require(dk.ndim == k.ndim && dv.ndim == k.ndim && dk.shape[i] == k.shape[i] &&
                dv.shape[i] == k.shape[i],
            "dk " + shape_str(dk) + " and dv " + shape_str(dv) + " must have k's shape " +
                shape_str(k));
  }
  require(
      dout.dtype == q.dtype && dq.dtype == q.dtype && dk.dtype == q.dtype && dv.dtype == q.dtype,
      "dout, dq, dk and dv must have q's dtype");
  require(on_cuda(dout) && on_cuda(dq) && on_cuda(dk) && on_cuda(dv),
          "attention gradients must be on the CUDA device");
  p.lse_in = p.lse;
  p.lse = nullptr;
  p.dout = dout.ptr();
  p.dq = dq.ptr();
  p.dk = dk.ptr();
  p.dv = dv.ptr();
  p.dout_strides = strides_of(dout, "dout");
  p.dq_strides = strides_of(dq, "dq");
  p.dk_strides = strides_of(dk, "dk");
  p.dv_strides = strides_of(dv, "dv");
  p.deterministic = o.deterministic;
  return p;
}

}  // namespace hk_flash
