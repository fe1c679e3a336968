// CUDA fused attention: hk::ops::fused_attention on the flash kernels of kernels/flash-attn
// (compiled into libhk as the static hk_flash_attn_core; the same code as the hub repos
// kernels-community/flash-attn2/3/4). TensorViews go through flash_attn/from_views.h, exactly as
// the hub repos' glue does. The workspaces (the backward's f32 row dots and dq accumulator, the
// split-KV decode's partials) come from the caching allocator on the call's stream. A case the
// kernels do not serve (f32, head_dim 96, misaligned rows) throws hk::Unsupported with the kernels'
// reason; callers (the "sdpa" attention function) fall back to the eager op.
#ifdef HK_HAVE_CUDA

#include "flash_attn/flash.h"
#include "flash_attn/from_views.h"
#include "hk/error.h"
#include "ops/attention_fused.h"

namespace hk::ops::cuda {
namespace {

hk_flash::CallOptions call_options(const FusedAttentionOptions& o) {
  hk_flash::CallOptions c;
  c.scale = o.scale;
  c.causal = o.causal;
  c.softcap = o.softcap;
  c.window_left = static_cast<int>(o.window_left);
  c.key_start = o.key_start;
  c.cu_seqlens_q = o.cu_seqlens_q;
  c.cu_seqlens_k = o.cu_seqlens_k;
  c.max_seqlen_q = o.max_seqlen_q;
  c.max_seqlen_k = o.max_seqlen_k;
  c.deterministic = o.deterministic;
  return c;
}

template <class Body>
auto translate(const char* op, Body&& body) {
  try {
    return body();
  } catch (const hk_flash::InvalidShape& e) {
    throw InvalidArgument(std::string(op) + ": " + e.what());
  } catch (const hk_flash::Unsupported& e) {
    throw Unsupported(std::string(op) + ": " + e.what());
  } catch (const hk_flash::DeviceError& e) {
    throw RuntimeFailure(std::string(op) + ": " + e.what());
  }
}

hk_flash::Stream raw(Stream s) {
  return static_cast<hk_flash::Stream>(s.handle);
}

// `bytes` of scratch on q's device from the caching allocator, ordered on `stream`, named in p;
// the returned tensor keeps it for the call.
Tensor attach_workspace(hk_flash::Params& p, size_t bytes, const TensorView& q, Stream stream) {
  Tensor workspace;
  if (bytes > 0) {
    workspace = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, q.device, stream);
    p.workspace = workspace.view().ptr();
    p.workspace_bytes = bytes;
  }
  return workspace;
}

}  // namespace

void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FusedAttentionOptions& options,
                     const TensorView* lse, Stream stream) {
  translate("fused_attention", [&] {
    hk_flash::Params p = hk_flash::forward_params(q, k, v, out, lse, call_options(options));
    // the split-KV decode's partials
    const Tensor workspace = attach_workspace(p, hk_flash::forward_workspace_size(p), q, stream);
    hk_flash::forward(p, raw(stream));
  });
}

void fused_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FusedAttentionOptions& options, Stream stream) {
  translate("fused_attention_backward", [&] {
    hk_flash::BackwardParams p =
        hk_flash::backward_params(dout, q, k, v, out, lse, dq, dk, dv, call_options(options));
    const Tensor workspace = attach_workspace(p, hk_flash::backward_workspace_size(p), q, stream);
    hk_flash::backward(p, raw(stream));
  });
}

std::string fused_attention_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const FusedAttentionOptions& options) {
  try {
    const hk_flash::Params p = hk_flash::forward_params(q, k, v, q, nullptr, call_options(options));
    const std::string why = hk_flash::unsupported_reason(p);
    // fused_attention gives every call the workspace it asks for
    return why.empty() ? hk_flash::forward_kernel_name(p, /*with_workspace=*/true)
                       : "unsupported: " + why;
  } catch (const std::exception& e) {
    return std::string("unsupported: ") + e.what();
  }
}

}  // namespace hk::ops::cuda

#endif  // HK_HAVE_CUDA
