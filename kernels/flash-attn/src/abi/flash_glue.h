// abi/flash_glue.h — the C ABI entry points of the flash-attn hub repos: hk_call → flash.h.
//
// Interfaces (include/hk/layer_interfaces.h): attention@1 (entries FlashAttention and
// flash_attn_func), attention_varlen@1 (flash_attn_varlen_func) and attention_kvcache@1
// (flash_attn_with_kvcache). Every function is templated on whether the Hopper forward may be
// used (flash-attn3/-4: yes; flash-attn2: the mma.sync FA2-algorithm kernels only). Refusals keep
// their meaning across the boundary: a call the interface forbids → HK_STATUS_INVALID_ARGUMENT, a
// valid one these kernels do not serve → HK_STATUS_UNSUPPORTED, a CUDA failure →
// HK_STATUS_DEVICE_ERROR. Nothing here allocates or synchronises: scratch (the backward's, the
// split-KV decode's partials) is the call's workspace, sized by the workspace entry point, so
// every entry is capture-safe.
#pragma once

#include "flash_attn/flash.h"
#include "flash_attn/from_views.h"
#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace flash_glue {

using hk::TensorView;

template <class Body>
void translate(Body&& body) {
  try {
    body();
  } catch (const hk_flash::InvalidShape& e) {
    hk::sdk::fail(HK_STATUS_INVALID_ARGUMENT, e.what());
  } catch (const hk_flash::Unsupported& e) {
    hk::sdk::fail(HK_STATUS_UNSUPPORTED, e.what());
  } catch (const hk_flash::DeviceError& e) {
    hk::sdk::fail(HK_STATUS_DEVICE_ERROR, e.what());
  }
}

inline TensorView view(const hk_tensor& t) {
  return hk::sdk::to_tensor_view(t);
}
inline hk_flash::Stream stream_of(const hk_call& call) {
  return static_cast<hk_flash::Stream>(call.stream);
}

template <bool kSm90>
hk_flash::CallOptions options_of(const hk::AttentionAttrs& a) {
  hk_flash::CallOptions o;
  o.scale = a.scale;
  o.causal = a.causal != 0;
  o.softcap = a.softcap;
  o.window_left = a.window_left;
  o.deterministic = (a.flags & hk::kAttentionDeterministic) != 0;
  o.allow_sm90 = kSm90;
  return o;
}

// ---- attention@1
// --------------------------------------------------------------------------------- forward: q, k,
// v, key_start? → out, lse?
// The forward's parameters; `keep` holds the views they point into (key_start, lse).
template <bool kSm90>
hk_flash::Params attention_forward_params(const hk_call& call, TensorView (&keep)[6]) {
  const auto attrs = hk::sdk::read_attrs<hk::AttentionAttrs>(call);
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) keep[i] = view(hk::sdk::input(call, i, names[i]));
  keep[3] = view(hk::sdk::output(call, 0, "out"));
  hk_flash::CallOptions o = options_of<kSm90>(attrs);
  if (const hk_tensor* ks = hk::sdk::optional_input(call, 3)) {
    keep[4] = view(*ks);
    o.key_start = &keep[4];
  }
  const hk_tensor* lse_t = hk::sdk::optional_output(call, 1);
  if (lse_t) keep[5] = view(*lse_t);
  return hk_flash::forward_params(keep[0], keep[1], keep[2], keep[3], lse_t ? &keep[5] : nullptr,
                                  o);
}

template <bool kSm90>
void attention_forward(const hk_call& call) {
  translate([&] {
    TensorView keep[6];
    hk_flash::Params p = attention_forward_params<kSm90>(call, keep);
    p.workspace = call.workspace;
    p.workspace_bytes = call.workspace_size;
    hk_flash::forward(p, stream_of(call));
  });
}

// backward: dout, q, k, v, out, lse, key_start? → dq, dk, dv
template <bool kSm90>
hk_flash::BackwardParams attention_backward_params(const hk_call& call, TensorView (&keep)[10]) {
  const auto attrs = hk::sdk::read_attrs<hk::AttentionAttrs>(call);
  const char* names[6] = {"dout", "q", "k", "v", "out", "lse"};
  for (int i = 0; i < 6; ++i) keep[i] = view(hk::sdk::input(call, i, names[i]));
  const char* out_names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) keep[6 + i] = view(hk::sdk::output(call, i, out_names[i]));
  hk_flash::CallOptions o = options_of<kSm90>(attrs);
  if (const hk_tensor* ks = hk::sdk::optional_input(call, 6)) {
    keep[9] = view(*ks);
    o.key_start = &keep[9];
  }
  return hk_flash::backward_params(keep[0], keep[1], keep[2], keep[3], keep[4], keep[5], keep[6],
                                   keep[7], keep[8], o);
}

template <bool kSm90>
void attention_backward(const hk_call& call) {
  translate([&] {
    TensorView keep[10];
    hk_flash::BackwardParams p = attention_backward_params<kSm90>(call, keep);
    p.workspace = call.workspace;
    p.workspace_bytes = call.workspace_size;
    hk_flash::backward(p, stream_of(call));
  });
}

inline size_t attention_workspace(const hk_call& call, uint32_t pass) {
  size_t bytes = 0;
  translate([&] {
    if (pass != HK_PASS_BACKWARD) {
      TensorView keep[6];
      bytes = hk_flash::forward_workspace_size(attention_forward_params<true>(call, keep));
      return;
    }
    TensorView keep[10];
    bytes = hk_flash::backward_workspace_size(attention_backward_params<true>(call, keep));
  });
  return bytes;
}

// ---- attention_varlen@1
// --------------------------------------------------------------------------
template <bool kSm90>
hk_flash::CallOptions varlen_options(const hk_call& call, const TensorView& cu_q,
                                     const TensorView& cu_k) {
  const auto attrs = hk::sdk::read_attrs<hk::AttentionVarlenAttrs>(call);
  hk_flash::CallOptions o = options_of<kSm90>(attrs.base);
  o.cu_seqlens_q = &cu_q;
  o.cu_seqlens_k = &cu_k;
  o.max_seqlen_q = attrs.max_seqlen_q;
  o.max_seqlen_k = attrs.max_seqlen_k;
  return o;
}

// forward: q, k, v, cu_seqlens_q, cu_seqlens_k → out, lse?
template <bool kSm90>
void varlen_forward(const hk_call& call) {
  translate([&] {
    const TensorView q = view(hk::sdk::input(call, 0, "q")), k = view(hk::sdk::input(call, 1, "k")),
                     v = view(hk::sdk::input(call, 2, "v"));
    const TensorView cu_q = view(hk::sdk::input(call, 3, "cu_seqlens_q")),
                     cu_k = view(hk::sdk::input(call, 4, "cu_seqlens_k"));
    const TensorView out = view(hk::sdk::output(call, 0, "out"));
    TensorView lse;
    const hk_tensor* lse_t = hk::sdk::optional_output(call, 1);
    if (lse_t) lse = view(*lse_t);
    hk_flash::forward(hk_flash::forward_params(q, k, v, out, lse_t ? &lse : nullptr,
                                               varlen_options<kSm90>(call, cu_q, cu_k)),
                      stream_of(call));
  });
}

// backward: dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k → dq, dk, dv
template <bool kSm90>
hk_flash::BackwardParams varlen_backward_params(const hk_call& call, TensorView (&keep)[11]) {
  const char* names[8] = {"dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k"};
  for (int i = 0; i < 8; ++i) keep[i] = view(hk::sdk::input(call, i, names[i]));
  const char* out_names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) keep[8 + i] = view(hk::sdk::output(call, i, out_names[i]));
  return hk_flash::backward_params(keep[0], keep[1], keep[2], keep[3], keep[4], keep[5], keep[8],
                                   keep[9], keep[10],
                                   varlen_options<kSm90>(call, keep[6], keep[7]));
}

template <bool kSm90>
void varlen_backward(const hk_call& call) {
  translate([&] {
    TensorView keep[11];
    hk_flash::BackwardParams p = varlen_backward_params<kSm90>(call, keep);
    p.workspace = call.workspace;
    p.workspace_bytes = call.workspace_size;
    hk_flash::backward(p, stream_of(call));
  });
}

inline size_t varlen_workspace(const hk_call& call, uint32_t pass) {
  if (pass != HK_PASS_BACKWARD) return 0;
  size_t bytes = 0;
  translate([&] {
    TensorView keep[11];
    bytes = hk_flash::backward_workspace_size(varlen_backward_params<true>(call, keep));
  });
  return bytes;
}

// ---- attention_kvcache@1
// ------------------------------------------------------------------------- forward: q, k_cache,
// v_cache, cache_seqlens, k_new?, v_new?, key_start? → out, lse?
// The forward's parameters over the caches (before any append); `keep` holds the views they
// point into: q, k_cache, v_cache, out, key_start, lse.
template <bool kSm90>
hk_flash::Params kvcache_params(const hk_call& call, TensorView (&keep)[6]) {
  const auto attrs = hk::sdk::read_attrs<hk::AttentionKvcacheAttrs>(call);
  const char* names[3] = {"q", "k_cache", "v_cache"};
  for (int i = 0; i < 3; ++i) keep[i] = view(hk::sdk::input(call, i, names[i]));
  const TensorView seqlens = view(hk::sdk::input(call, 3, "cache_seqlens"));
  keep[3] = view(hk::sdk::output(call, 0, "out"));
  hk_flash::CallOptions o = options_of<kSm90>(attrs.base);
  if (const hk_tensor* ks = hk::sdk::optional_input(call, 6)) {
    keep[4] = view(*ks);
    o.key_start = &keep[4];
  }
  const hk_tensor* lse_t = hk::sdk::optional_output(call, 1);
  if (lse_t) keep[5] = view(*lse_t);
  hk_flash::Params p =
      hk_flash::forward_params(keep[0], keep[1], keep[2], keep[3], lse_t ? &keep[5] : nullptr, o);
  p.seqlens_k = hk_flash::views::i32_vector(seqlens, p.batch, "cache_seqlens");
  return p;
}

template <bool kSm90>
void kvcache_forward(const hk_call& call) {
  translate([&] {
    TensorView keep[6];
    hk_flash::Params p = kvcache_params<kSm90>(call, keep);
    const TensorView &q = keep[0], &kc = keep[1], &vc = keep[2];
    TensorView k_new, v_new;
    const hk_tensor* kn = hk::sdk::optional_input(call, 4);
    const hk_tensor* vn = hk::sdk::optional_input(call, 5);
    hk_flash::views::require((kn == nullptr) == (vn == nullptr), "k_new and v_new come together");
    if (kn != nullptr) {
      k_new = view(*kn);
      v_new = view(*vn);
      using hk_flash::views::require;
      using hk_flash::views::shape_str;
      require(k_new.ndim == 4 && v_new.ndim == 4 && k_new.shape[0] == p.batch &&
                  k_new.shape[1] == q.shape[1] && k_new.shape[2] == p.heads_kv &&
                  k_new.shape[3] == p.head_dim,
              "k_new must be [batch, q's seq, kv heads, head_dim], got " + shape_str(k_new));
      for (int i = 0; i < 4; ++i)
        require(v_new.shape[i] == k_new.shape[i], "v_new must have k_new's shape");
      require(k_new.dtype == q.dtype && v_new.dtype == q.dtype, "k_new/v_new must have q's dtype");
      hk_flash::AppendParams a;
      a.dtype = p.dtype;
      a.head_dim = p.head_dim;
      a.batch = p.batch;
      a.seqlen_new = static_cast<int>(k_new.shape[1]);
      a.heads_kv = p.heads_kv;
      a.k_new = k_new.ptr();
      a.v_new = v_new.ptr();
      a.k_cache = kc.ptr();
      a.v_cache = vc.ptr();
      a.k_new_strides = hk_flash::views::strides_of(k_new, "k_new");
      a.v_new_strides = hk_flash::views::strides_of(v_new, "v_new");
      a.k_cache_strides = p.k_strides;
      a.v_cache_strides = p.v_strides;
      a.seqlens = p.seqlens_k;
      hk_flash::append_kv(a, stream_of(call));
      p.seqlens_k_add = a.seqlen_new;
    }
    p.workspace = call.workspace;
    p.workspace_bytes = call.workspace_size;
    hk_flash::forward(p, stream_of(call));
  });
}

// The decode's partials (forward_workspace_size); the cache lengths do not change it.
inline size_t kvcache_workspace(const hk_call& call, uint32_t pass) {
  size_t bytes = 0;
  if (pass == HK_PASS_BACKWARD) return 0;
  translate([&] {
    TensorView keep[6];
    bytes = hk_flash::forward_workspace_size(kvcache_params<true>(call, keep));
  });
  return bytes;
}

}  // namespace flash_glue

// The entry table of one flash-attn repo (FLASH_SM90: may the Hopper forward run).
#define FLASH_ATTN_ENTRIES(FLASH_SM90)                                                        \
  namespace {                                                                                 \
  constexpr uint32_t kFlashDtypes = HK_DTYPE_BIT(HK_DTYPE_BF16) | HK_DTYPE_BIT(HK_DTYPE_F16); \
  constexpr uint32_t kFlashModes = HK_MODE_INFERENCE | HK_MODE_TRAINING | HK_MODE_CAPTURE;    \
  const hk_kernel_entry kEntries[] = {                                                        \
      hk::sdk::make_entry(                                                                    \
          {.name = "FlashAttention",                                                          \
           .interface = "attention",                                                          \
           .interface_version = 1,                                                            \
           .modes = kFlashModes,                                                              \
           .device = "cuda",                                                                  \
           .dtypes = kFlashDtypes,                                                            \
           .forward = hk::sdk::entry_point<flash_glue::attention_forward<FLASH_SM90>>,        \
           .backward = hk::sdk::entry_point<flash_glue::attention_backward<FLASH_SM90>>,      \
           .workspace_size = hk::sdk::workspace_point<flash_glue::attention_workspace>}),     \
      hk::sdk::make_entry(                                                                    \
          {.name = "flash_attn_func",                                                         \
           .interface = "attention",                                                          \
           .interface_version = 1,                                                            \
           .modes = kFlashModes,                                                              \
           .device = "cuda",                                                                  \
           .dtypes = kFlashDtypes,                                                            \
           .forward = hk::sdk::entry_point<flash_glue::attention_forward<FLASH_SM90>>,        \
           .backward = hk::sdk::entry_point<flash_glue::attention_backward<FLASH_SM90>>,      \
           .workspace_size = hk::sdk::workspace_point<flash_glue::attention_workspace>}),     \
      hk::sdk::make_entry(                                                                    \
          {.name = "flash_attn_varlen_func",                                                  \
           .interface = "attention_varlen",                                                   \
           .interface_version = 1,                                                            \
           .modes = kFlashModes,                                                              \
           .device = "cuda",                                                                  \
           .dtypes = kFlashDtypes,                                                            \
           .forward = hk::sdk::entry_point<flash_glue::varlen_forward<FLASH_SM90>>,           \
           .backward = hk::sdk::entry_point<flash_glue::varlen_backward<FLASH_SM90>>,         \
           .workspace_size = hk::sdk::workspace_point<flash_glue::varlen_workspace>}),        \
      hk::sdk::make_entry(                                                                    \
          {.name = "flash_attn_with_kvcache",                                                 \
           .interface = "attention_kvcache",                                                  \
           .interface_version = 1,                                                            \
           .modes = HK_MODE_INFERENCE | HK_MODE_CAPTURE,                                      \
           .device = "cuda",                                                                  \
           .dtypes = kFlashDtypes,                                                            \
           .forward = hk::sdk::entry_point<flash_glue::kvcache_forward<FLASH_SM90>>,          \
           .workspace_size = hk::sdk::workspace_point<flash_glue::kvcache_workspace>}),       \
  };                                                                                          \
  }                                                                                           \
  HK_KERNEL_LIBRARY(kEntries)
