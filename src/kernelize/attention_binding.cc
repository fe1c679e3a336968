// Hub attention kernels as attention functions and training forms (see attention_binding.h).
#include "kernelize/attention_binding.h"

#include <iostream>
#include <mutex>
#include <set>

#include "hk/error.h"
#include "hk/layer_interfaces.h"
#include "kernelize/adapters.h"

namespace hk::kernel_binding {
namespace {

AttentionAttrs attention_attrs(const nn::AttentionCall& call) {
  AttentionAttrs a;
  a.scale = call.scale;
  a.causal = call.causal ? 1u : 0u;
  a.softcap = call.softcap;
  a.window_left = static_cast<int32_t>(call.window_left);
  a.flags = call.deterministic ? kAttentionDeterministic : 0u;
  return a;
}
AttentionVarlenAttrs varlen_attrs(const nn::AttentionCall& call) {
  AttentionVarlenAttrs a;
  a.base = attention_attrs(call);
  a.max_seqlen_q = static_cast<int32_t>(call.max_seqlen_q);
  a.max_seqlen_k = static_cast<int32_t>(call.max_seqlen_k);
  return a;
}

bool packed(const nn::AttentionCall& call) {
  return call.cu_seqlens_q != nullptr;
}
// [1, total, H, D] → [total, H, D]
TensorView unbatched(const TensorView& t) {
  if (t.ndim != 4 || t.shape[0] != 1)
    throw InvalidArgument("attention with cu_seqlens takes [1, total, heads, head_dim], got " +
                          t.str());
  return t.select(0, 0);
}

const KernelFunction& varlen_of(const AttentionKernels& k) {
  if (!k.varlen.valid())
    throw Unsupported(k.attention.qualified_name() +
                      " has no attention_varlen@1 entry (flash_attn_varlen_func), which packed "
                      "sequences (cu_seqlens) need");
  return k.varlen;
}

template <class Attrs>
void call(const KernelFunction& fn, bool backward, const std::vector<TensorView>& inputs,
          const std::vector<TensorView>& outputs, const Attrs& attrs, Stream stream) {
  call_kernel_pass(fn, backward, inputs, outputs, &attrs, sizeof(Attrs), stream);
}

// Forward with an optional lse output.
void forward(const AttentionKernels& k, const TensorView& q, const TensorView& kk,
             const TensorView& v, const TensorView& out, const nn::AttentionCall& c,
             const TensorView* lse, Stream stream) {
  if (packed(c)) {
    std::vector<TensorView> outputs{unbatched(out)};
    if (lse) outputs.push_back(*lse);
    call(varlen_of(k), false,
         {unbatched(q), unbatched(kk), unbatched(v), *c.cu_seqlens_q, *c.cu_seqlens_k}, outputs,
         varlen_attrs(c), stream);
    return;
  }
  std::vector<TensorView> inputs{q, kk, v};
  if (c.key_start) inputs.push_back(*c.key_start);
  std::vector<TensorView> outputs{out};
  if (lse) outputs.push_back(*lse);
  call(k.attention, false, inputs, outputs, attention_attrs(c), stream);
}

// A call the kernel refuses as unsupported (a head dim it has no code for, f32, a layout) runs
// the built-in fused attention instead, with one note on stderr per kernel: a model whose shapes
// the kernel cannot serve keeps working, as kernelize promises.
void note_fallback(const KernelFunction& fn, const Unsupported& e) {
  static std::mutex mutex;
  static std::set<std::string> noted;
  std::lock_guard<std::mutex> lock(mutex);
  if (noted.insert(fn.qualified_name()).second)
    std::cerr << "hk: note: " << e.what() << "; these calls use the built-in sdpa instead\n";
}

}  // namespace

nn::AttentionFunction make_attention_function(AttentionKernels kernels) {
  return [kernels = std::move(kernels)](const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& out,
                                        const nn::AttentionCall& c, Stream stream) {
    try {
      forward(kernels, q, k, v, out, c, nullptr, stream);
    } catch (const Unsupported& e) {
      note_fallback(kernels.attention, e);
      nn::attention_function("sdpa")(q, k, v, out, c, stream);
    }
  };
}

nn::AttentionTraining make_attention_training(AttentionKernels kernels) {
  HK_CHECK(kernels.attention.valid() && kernels.attention.entry().has_backward,
           "make_attention_training: the attention entry has no backward");
  nn::AttentionTraining t;
  t.forward = [kernels](const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const nn::AttentionCall& c,
                        Stream stream) -> Tensor {
    const Shape shape =
        packed(c) ? Shape{q.shape[2], q.shape[1]} : Shape{q.shape[0], q.shape[2], q.shape[1]};
    Tensor lse = Tensor::empty(shape, DType::F32, q.device, stream);
    const TensorView lse_view = lse.view();
    try {
      forward(kernels, q, k, v, out, c, &lse_view, stream);
    } catch (const Unsupported& e) {
      note_fallback(kernels.attention, e);
      return nn::attention_training("sdpa")->forward(q, k, v, out, c, stream);
    }
    return lse;
  };
  auto backward_kernel = [kernels](const TensorView& dout, const TensorView& q, const TensorView& k,
                                   const TensorView& v, const TensorView& out, const Tensor& saved,
                                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const nn::AttentionCall& c, Stream stream) {
    if (packed(c)) {
      call(varlen_of(kernels), true,
           {unbatched(dout), unbatched(q), unbatched(k), unbatched(v), unbatched(out), saved.view(),
            *c.cu_seqlens_q, *c.cu_seqlens_k},
           {unbatched(dq), unbatched(dk), unbatched(dv)}, varlen_attrs(c), stream);
      return;
    }
    std::vector<TensorView> inputs{dout, q, k, v, out, saved.view()};
    if (c.key_start) inputs.push_back(*c.key_start);
    call(kernels.attention, true, inputs, {dq, dk, dv}, attention_attrs(c), stream);
  };
  t.backward = [kernels, backward_kernel](
                   const TensorView& dout, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const Tensor& saved,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const nn::AttentionCall& c, Stream stream) {
    // saved state the kernel did not make (its forward fell back): the built-in backward
    const int lse_rank = packed(c) ? 2 : 3;
    if (saved.ndim() != lse_rank || saved.dtype() != DType::F32) {
      nn::attention_training("sdpa")->backward(dout, q, k, v, out, saved, dq, dk, dv, c, stream);
      return;
    }
    try {
      backward_kernel(dout, q, k, v, out, saved, dq, dk, dv, c, stream);
    } catch (const Unsupported& e) {
      note_fallback(kernels.attention, e);
      nn::attention_training("sdpa")->backward(dout, q, k, v, out, saved, dq, dk, dv, c, stream);
    }
  };
  return t;
}

}  // namespace hk::kernel_binding
