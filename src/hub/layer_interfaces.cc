// The registry of layer interfaces hk knows (see hk/layer_interfaces.h for each contract).
//
// One row per interface version; the loader consults it to refuse kernels that implement an
// interface or a version this hk cannot call. Adding an interface version = one row here plus its
// documentation and attribute struct in the header. Nothing here validates tensors.
#include "hk/layer_interfaces.h"

#include <algorithm>

namespace hk {

const std::vector<InterfaceInfo>& known_interfaces() {
  static const std::vector<InterfaceInfo> interfaces = [] {
    std::vector<InterfaceInfo> v = {
        {"rms_norm", 1, "RMSNorm", "x, weight", "y, rstd?", "dy, x, weight, rstd?", "dx, dweight?",
         sizeof(RmsNormAttrs)},
        {"layer_norm", 1, "LayerNorm", "x, weight, bias?", "y, mean?, rstd?",
         "dy, x, weight, mean?, rstd?", "dx, dweight?, dbias?", sizeof(LayerNormAttrs)},
        {"rotary_pos_emb", 1, "rotary_pos_emb", "q, k, cos, sin", "q_out, k_out",
         "dq_out, dk_out, cos, sin", "dq, dk", sizeof(RotaryAttrs)},
        {"mlp", 1, "MLP", "x, gate_w, up_w, down_w", "y, gate?, up?",
         "dy, x, gate_w, up_w, down_w, gate?, up?", "dx, dgate_w?, dup_w?, ddown_w?",
         sizeof(MlpAttrs)},
        {"silu", 1, "SiLU", "x", "y", "dy, x", "dx", sizeof(SiluAttrs)},
        {"activation", 1, "activation", "x", "y", "dy, x", "dx", sizeof(ActivationAttrs)},
        {"act_and_mul", 1, "act_and_mul", "x, up?", "y", "dy, x, up?", "dx, dup?",
         sizeof(ActAndMulAttrs)},
        {"linear", 1, "Linear", "x, weight, bias?", "y", "dy, x, weight", "dx?, dweight?, dbias?",
         sizeof(LinearAttrs)},
        {"attention", 1, "attention", "q, k, v, key_start?", "out, lse?",
         "dout, q, k, v, out, lse, key_start?", "dq, dk, dv", sizeof(AttentionAttrs)},
        {"cross_entropy", 1, "cross_entropy", "logits, labels", "loss, lse?, z_loss?, dlogits?",
         "dloss, logits, labels, lse?", "dlogits", sizeof(CrossEntropyAttrs)},
        {"fused_linear_cross_entropy", 1, "fused_linear_cross_entropy", "x, weight, labels, bias?",
         "loss, dx?, dweight?, dbias?", "dloss, x, weight, labels, bias?", "dx, dweight?, dbias?",
         sizeof(FusedLinearCrossEntropyAttrs)},
        {"rms_norm_mlp", 1, "RMSNorm+MLP", "x, <layout parameters>", "y", "", "",
         sizeof(RmsNormMlpAttrs)},
        {"causal_lm_loss", 1, "ForCausalLMLoss", "logits, labels", "loss", "dloss, logits, labels",
         "dlogits", sizeof(CausalLmLossAttrs)},
        {"multi_scale_deformable_attention", 1, "MultiScaleDeformableAttention",
         "value, sampling_locations, attention_weights", "out",
         "dout, value, sampling_locations, attention_weights",
         "dvalue?, dsampling_locations?, dattention_weights?", sizeof(MsDeformAttnAttrs)},
        {"attention_varlen", 1, "attention_varlen", "q, k, v, cu_seqlens_q, cu_seqlens_k",
         "out, lse?", "dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k", "dq, dk, dv",
         sizeof(AttentionVarlenAttrs)},
        {"attention_kvcache", 1, "attention_kvcache",
         "q, k_cache, v_cache, cache_seqlens, k_new?, v_new?, key_start?", "out, lse?", "", "",
         sizeof(AttentionKvcacheAttrs)},
        {"moe_mlp", 1, "MoeMLP", "x, router_w, gate_up_w, down_w",
         "y, router_logits?, topk_ids?, topk_weights?, gate_up?",
         "dy, x, router_w, gate_up_w, down_w, router_logits, topk_ids, topk_weights, gate_up, "
         "drouter_logits?",
         "dx, drouter_w?, dgate_up_w?, ddown_w?", sizeof(MoeMlpAttrs)},
    };
    std::sort(v.begin(), v.end(), [](const InterfaceInfo& a, const InterfaceInfo& b) {
      int c = std::string(a.name).compare(b.name);
      return c != 0 ? c < 0 : a.version < b.version;
    });
    return v;
  }();
  return interfaces;
}

const InterfaceInfo* find_interface(const std::string& name, uint32_t version) {
  for (const InterfaceInfo& info : known_interfaces()) {
    if (name == info.name && version == info.version) return &info;
  }
  return nullptr;
}

std::vector<uint32_t> known_interface_versions(const std::string& name) {
  std::vector<uint32_t> versions;
  for (const InterfaceInfo& info : known_interfaces()) {
    if (name == info.name) versions.push_back(info.version);
  }
  return versions;
}

}  // namespace hk
