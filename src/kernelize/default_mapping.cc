// hk's default kernel table: the loading guide's device-aware defaults (cuda, rocm, xpu) plus cpu
// entries for hk's own cpu kernel variants where they are worth binding by default (RMSNorm,
// rotary, activations). The liger-kernels cpu variants of the MLP and the loss are naive
// reference loops, so cpu models keep the built-in (OpenBLAS) path unless a config asks for them.
// Repos absent from the hub simply fall back to the built-in implementation with the reason
// recorded; they are listed so a hub that has them is used. Versions follow the table of MISSION.md
// (liger-kernels is version 3).
#include "kernelize/mapping.h"

namespace hk::kernel_binding {
namespace {

MappingRule rule(const char* layer, const char* device, const char* spec, int version) {
  MappingRule r;
  r.layer = layer;
  r.device = device;
  r.kernel.spec = spec;
  r.kernel.options.version = version;
  r.source = "default table";
  return r;
}

}  // namespace

const std::vector<MappingRule>& default_mapping() {
  static const std::vector<MappingRule> table = [] {
    std::vector<MappingRule> t;
    // RMSNorm
    t.push_back(rule("RMSNorm", "cuda", "kernels-community/liger-kernels:LigerRMSNorm", 3));
    t.push_back(rule("RMSNorm", "rocm", "kernels-community/liger-kernels:LigerRMSNorm", 3));
    t.push_back(rule("RMSNorm", "xpu", "kernels-community/rmsnorm:RMSNorm", 1));
    t.push_back(rule("RMSNorm", "cpu", "kernels-community/rmsnorm:RMSNorm", 1));
    // MoE MLP
    for (const char* d : {"cuda", "rocm", "xpu"})
      t.push_back(rule("MoeMLP", d, "kernels-community/megablocks", 1));
    // Gated MLPs, Linear, loss
    t.push_back(rule("MLP", "cuda", "kernels-community/liger-kernels:LigerSwiGLUMLP", 3));
    t.push_back(rule("Linear", "cuda", "kernels-community/liger-kernels", 3));
    t.push_back(
        rule("ForCausalLMLoss", "cuda", "kernels-community/liger-kernels:LigerForCausalLMLoss", 3));
    // Activations
    for (const char* layer : {"SiLU", "GELU", "GeluTanh", "FastGELU", "QuickGELU", "NewGELU"}) {
      t.push_back(rule(layer, "cuda", "kernels-community/activation", 1));
      t.push_back(rule(layer, "cpu", "kernels-community/activation", 1));
    }
    // Rotary embedding (a registered function)
    t.push_back(
        rule("rotary_pos_emb", "cuda", "kernels-community/rotary:apply_rotary_transformers", 1));
    t.push_back(
        rule("rotary_pos_emb", "xpu", "kernels-community/rotary:apply_rotary_transformers", 1));
    t.push_back(rule("rotary_pos_emb", "rocm", "kernels-community/aiter-rope", 1));
    t.push_back(
        rule("rotary_pos_emb", "cpu", "kernels-community/rotary:apply_rotary_transformers", 1));
    // Deformable attention
    t.push_back(
        rule("MultiScaleDeformableAttention", "cuda", "kernels-community/deformable-detr", 1));
    return t;
  }();
  return table;
}

}  // namespace hk::kernel_binding
