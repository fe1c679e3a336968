// moe_call.h — the argument checks of moe_mlp@1, shared by the cpu and cuda variants.
//
// Turns an hk_call into a flat description (sizes, one dtype, raw pointers) after checking what
// the interface requires (include/hk/layer_interfaces.h, moe_mlp@1): shapes, one floating dtype
// for the activations and weights, top_k in [1, E], the device. Every tensor must be dense
// (contiguous rows for x/y/dy/dx, contiguous weights); other layouts are refused as UNSUPPORTED,
// and hk's adapter always passes contiguous tensors. No arithmetic here.
#pragma once

#include <string>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace megablocks {

using hk::sdk::fail;

struct MoeCall {
  int64_t T = 0, H = 0, E = 0, I = 0, k = 0;
  int32_t dtype = HK_DTYPE_F32;  // of x, weights, y, router_logits, gate_up
  hk::MoeMlpAttrs attrs;
  // forward inputs (and backward's)
  const void *x = nullptr, *router_w = nullptr, *gate_up_w = nullptr, *down_w = nullptr;
  // forward outputs; the optional ones are null when absent
  void* y = nullptr;
  void* router_logits = nullptr;
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
  void* gate_up = nullptr;
  // backward
  const void* dy = nullptr;
  const float* drouter_logits = nullptr;  // optional
  void* dx = nullptr;
  void *drouter_w = nullptr, *dgate_up_w = nullptr, *ddown_w = nullptr;  // optional
  bool accumulate = false;
  int64_t assignments() const { return T * k; }
};

inline bool dense(const hk_tensor& t) {
  int64_t expect = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

// Checks `t` against `shape` (rank and sizes), `dtype` and the device; returns its data.
inline void* tensor_data(const hk_tensor& t, const char* what, std::initializer_list<int64_t> shape,
                         int32_t dtype, int32_t device_type) {
  if (t.device_type != device_type)
    fail(HK_STATUS_INVALID_ARGUMENT,
         std::string(what) + " is on another device type than this kernel");
  bool ok = t.ndim == static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t s : shape) ok = ok && t.shape[d++] == s;
  if (!ok) {
    std::string want;
    for (int64_t s : shape) want += (want.empty() ? "" : ", ") + std::to_string(s);
    fail(HK_STATUS_INVALID_ARGUMENT, std::string("moe_mlp: ") + what + " must be [" + want + "]");
  }
  if (t.dtype != dtype)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string("moe_mlp: ") + what + " has dtype " +
                                         hk::sdk::dtype_code_name(t.dtype) + ", expected " +
                                         hk::sdk::dtype_code_name(dtype));
  if (!dense(t))
    fail(HK_STATUS_UNSUPPORTED, std::string("moe_mlp: ") + what + " is not contiguous");
  return hk::sdk::data_ptr<char>(t);
}

inline const hk_tensor* optional(const hk_call& call, bool input, int index) {
  return input ? hk::sdk::optional_input(call, index) : hk::sdk::optional_output(call, index);
}

// The shared part: x, router_w, gate_up_w, down_w at inputs[first..first+3].
inline MoeCall parse_weights(const hk_call& call, int first, int32_t device_type) {
  MoeCall c;
  c.attrs = hk::sdk::read_attrs<hk::MoeMlpAttrs>(call);
  const hk_tensor& x = hk::sdk::input(call, first, "x");
  const hk_tensor& wr = hk::sdk::input(call, first + 1, "router_w");
  const hk_tensor& wgu = hk::sdk::input(call, first + 2, "gate_up_w");
  const hk_tensor& wd = hk::sdk::input(call, first + 3, "down_w");
  if (x.ndim != 2 || wr.ndim != 2 || wgu.ndim != 3 || wd.ndim != 3)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "moe_mlp: x must be [T, H], router_w [E, H], gate_up_w [E, 2I, H], down_w [E, H, I]");
  c.T = x.shape[0];
  c.H = x.shape[1];
  c.E = wr.shape[0];
  c.I = wd.shape[2];
  c.k = c.attrs.top_k;
  c.dtype = x.dtype;
  if (c.dtype != HK_DTYPE_F32 && c.dtype != HK_DTYPE_BF16 && c.dtype != HK_DTYPE_F16)
    fail(HK_STATUS_UNSUPPORTED, std::string("moe_mlp: dtype ") + hk::sdk::dtype_code_name(c.dtype) +
                                    " is not f32, bf16 or f16");
  if (c.E <= 0 || c.H <= 0 || c.I <= 0)
    fail(HK_STATUS_INVALID_ARGUMENT, "moe_mlp: E, H and I must be positive");
  if (c.k < 1 || c.k > c.E)
    fail(HK_STATUS_INVALID_ARGUMENT, "moe_mlp: top_k " + std::to_string(c.k) +
                                         " is outside [1, E = " + std::to_string(c.E) + "]");
  if (c.attrs.activation > hk::kActivationGELUTanh)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "moe_mlp: unknown activation code " + std::to_string(c.attrs.activation));
  c.x = tensor_data(x, "x", {c.T, c.H}, c.dtype, device_type);
  c.router_w = tensor_data(wr, "router_w", {c.E, c.H}, c.dtype, device_type);
  c.gate_up_w = tensor_data(wgu, "gate_up_w", {c.E, 2 * c.I, c.H}, c.dtype, device_type);
  c.down_w = tensor_data(wd, "down_w", {c.E, c.H, c.I}, c.dtype, device_type);
  return c;
}

inline MoeCall parse_forward(const hk_call& call, int32_t device_type) {
  MoeCall c = parse_weights(call, 0, device_type);
  c.y = tensor_data(hk::sdk::output(call, 0, "y"), "y", {c.T, c.H}, c.dtype, device_type);
  if (const hk_tensor* t = optional(call, false, 1))
    c.router_logits = tensor_data(*t, "router_logits", {c.T, c.E}, c.dtype, device_type);
  if (const hk_tensor* t = optional(call, false, 2))
    c.topk_ids =
        static_cast<int32_t*>(tensor_data(*t, "topk_ids", {c.T, c.k}, HK_DTYPE_I32, device_type));
  if (const hk_tensor* t = optional(call, false, 3))
    c.topk_weights =
        static_cast<float*>(tensor_data(*t, "topk_weights", {c.T, c.k}, HK_DTYPE_F32, device_type));
  if (const hk_tensor* t = optional(call, false, 4))
    c.gate_up = tensor_data(*t, "gate_up", {c.T * c.k, 2 * c.I}, c.dtype, device_type);
  return c;
}

inline MoeCall parse_backward(const hk_call& call, int32_t device_type) {
  MoeCall c = parse_weights(call, 1, device_type);
  c.dy = tensor_data(hk::sdk::input(call, 0, "dy"), "dy", {c.T, c.H}, c.dtype, device_type);
  c.router_logits = tensor_data(hk::sdk::input(call, 5, "router_logits"), "router_logits",
                                {c.T, c.E}, c.dtype, device_type);
  c.topk_ids = static_cast<int32_t*>(tensor_data(hk::sdk::input(call, 6, "topk_ids"), "topk_ids",
                                                 {c.T, c.k}, HK_DTYPE_I32, device_type));
  c.topk_weights =
      static_cast<float*>(tensor_data(hk::sdk::input(call, 7, "topk_weights"), "topk_weights",
                                      {c.T, c.k}, HK_DTYPE_F32, device_type));
  c.gate_up = tensor_data(hk::sdk::input(call, 8, "gate_up"), "gate_up", {c.T * c.k, 2 * c.I},
                          c.dtype, device_type);
  if (const hk_tensor* t = optional(call, true, 9))
    c.drouter_logits = static_cast<const float*>(
        tensor_data(*t, "drouter_logits", {c.T, c.E}, HK_DTYPE_F32, device_type));
  c.dx = tensor_data(hk::sdk::output(call, 0, "dx"), "dx", {c.T, c.H}, c.dtype, device_type);
  if (const hk_tensor* t = optional(call, false, 1))
    c.drouter_w = tensor_data(*t, "drouter_w", {c.E, c.H}, c.dtype, device_type);
  if (const hk_tensor* t = optional(call, false, 2))
    c.dgate_up_w = tensor_data(*t, "dgate_up_w", {c.E, 2 * c.I, c.H}, c.dtype, device_type);
  if (const hk_tensor* t = optional(call, false, 3))
    c.ddown_w = tensor_data(*t, "ddown_w", {c.E, c.H, c.I}, c.dtype, device_type);
  c.accumulate = (c.attrs.flags & hk::kAccumulateWeightGrads) != 0;
  return c;
}

}  // namespace megablocks
