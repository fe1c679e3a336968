// flash_peer_abi.cc — libhk_bench_flash_peer.so: hk's flash forward and backward (flash.h) behind
// a plain C interface, so bench/peers/attention_interleaved.py can time them through ctypes in
// the same process as PyTorch SDPA, alternating with it call by call.
//
// Why a process of both: the long shapes run at the H200's power cap, where a figure follows the
// clock the power manager settles on; timed in separate processes (hk_bench_flash_kernels, then
// attention_torch.py) the peer's figures moved up to 18 % from call to call. Alternating in one
// process, hk and the peer see the same clocks and the ratio is what is left.
//
// Tensors are contiguous [B, S, H, D] (hk's layout; S rows of keys for k/v), lse [B, Hq, S] f32,
// on the current device; the stream is the caller's (torch's current stream). Nothing here
// allocates: the backward's workspace is the caller's (hkb_flash_backward_workspace bytes).
// Errors: a nonzero return, and hkb_flash_last_error() says why. Not here: varlen, KV caches,
// softcap or window (the benchmark shapes are plain causal or full attention).
#include <cstddef>
#include <exception>
#include <string>

#include "flash_attn/flash.h"

namespace {

thread_local std::string g_last_error;

hk_flash::Params params_of(const void* q, const void* k, const void* v, void* out, float* lse,
                           int b, int s, int t, int hq, int hkv, int d, int f16, int causal) {
  hk_flash::Params p;
  p.dtype = f16 ? hk_flash::Dtype::F16 : hk_flash::Dtype::BF16;
  p.head_dim = d;
  p.batch = b;
  p.seqlen_q = s;
  p.seqlen_k = t;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.q_strides = {static_cast<int64_t>(s) * hq * d, static_cast<int64_t>(hq) * d, d};
  p.out_strides = p.q_strides;
  p.k_strides = {static_cast<int64_t>(t) * hkv * d, static_cast<int64_t>(hkv) * d, d};
  p.v_strides = p.k_strides;
  p.lse = lse;
  p.lse_batch = static_cast<int64_t>(hq) * s;
  p.lse_head = s;
  p.causal = causal != 0;
  return p;
}

// The backward's parameters: gradients in the layouts of their inputs.
hk_flash::BackwardParams backward_params_of(const void* q, const void* k, const void* v,
                                            const void* out, const float* lse, const void* dout,
                                            void* dq, void* dk, void* dv, int b, int s, int t,
                                            int hq, int hkv, int d, int f16, int causal) {
  hk_flash::BackwardParams p;
  static_cast<hk_flash::Params&>(p) =
      params_of(q, k, v, const_cast<void*>(out), nullptr, b, s, t, hq, hkv, d, f16, causal);
  p.lse_in = lse;
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.dout_strides = p.dq_strides = p.q_strides;
  p.dk_strides = p.dv_strides = p.k_strides;
  return p;
}

template <class Body>
int guarded(Body&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return 1;
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const char* hkb_flash_last_error() {
  return g_last_error.c_str();
}

__attribute__((visibility("default"))) int hkb_flash_forward(const void* q, const void* k,
                                                             const void* v, void* out, float* lse,
                                                             int b, int s, int t, int hq, int hkv,
                                                             int d, int f16, int causal,
                                                             void* stream) {
  return guarded([&] {
    hk_flash::forward(params_of(q, k, v, out, lse, b, s, t, hq, hkv, d, f16, causal),
                      static_cast<hk_flash::Stream>(stream));
  });
}

__attribute__((visibility("default"))) size_t hkb_flash_backward_workspace(int b, int s, int t,
                                                                           int hq, int hkv, int d,
                                                                           int f16, int causal) {
  return hk_flash::backward_workspace_size(
      backward_params_of(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                         nullptr, b, s, t, hq, hkv, d, f16, causal));
}

__attribute__((visibility("default"))) int hkb_flash_backward(
    const void* q, const void* k, const void* v, const void* out, const float* lse,
    const void* dout, void* dq, void* dk, void* dv, void* workspace, size_t workspace_bytes, int b,
    int s, int t, int hq, int hkv, int d, int f16, int causal, void* stream) {
  return guarded([&] {
    hk_flash::BackwardParams p =
        backward_params_of(q, k, v, out, lse, dout, dq, dk, dv, b, s, t, hq, hkv, d, f16, causal);
    p.workspace = workspace;
    p.workspace_bytes = workspace_bytes;
    hk_flash::backward(p, static_cast<hk_flash::Stream>(stream));
  });
}

}  // extern "C"
