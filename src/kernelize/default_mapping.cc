// hk's default kernel table: Transformers' `_build_kernel_mapping` (integrations/hub_kernels.py,
// transformers 5.17) row by row — the same layer names, devices, modes, repos, entries and
// versions — plus cpu rows for hk's own cpu kernels where they are worth binding by default
// (RMSNorm, rotary, activations, deformable attention). Where hk differs, on purpose:
//   - RMSNorm on cuda also has Capture rows: Transformers notes its Liger RMSNorm is not
//     torch.compile friendly; hk's LigerRMSNorm is capture-safe (it declares Capture).
//   - SwiGLUMLP / GeGLUMLP in Training|Capture map to LigerSwiGLUMLP / LigerGEGLUMLP: hk has no
//     tiled (LigerTiled*) variants; its gated MLP entries have a backward of their own.
//   - Linear has Inference and Inference|Capture rows that keep the built-in GEMM: the mode chain
//     would otherwise carry Transformers' Training|Capture LigerLinear row into inference for
//     every projection (Transformers' Llama/Qwen3 register no Linear layer; hk's do).
//   - The MoE row is keyed by hk's layer name (MoeMLP); Transformers' is MegaBlocksMoeMLP.
// Repos absent from the hub (megablocks, aiter-rope, mlx_rmsnorm) and devices hk has no runtime
// for fall back to the built-in implementation with the reason recorded; they are listed so a hub
// that has them is used, and so a simulated device (`hk kernelize --device xpu --report`) shows
// what would be chosen.
#include "kernelize/mapping.h"

namespace hk::kernel_binding {
namespace {

constexpr Mode kI = Mode::Inference;
constexpr Mode kT = Mode::Training;
const Mode kIC = Mode::Inference | Mode::Capture;
const Mode kTC = Mode::Training | Mode::Capture;
constexpr Mode kAny = Mode::Fallback;  // a plain LayerRepository: every mode

MappingRule rule(const char* layer, const char* device, Mode mode, const char* spec, int version) {
  MappingRule r;
  r.layer = layer;
  r.device = device;
  r.mode = mode;
  r.kernel.spec = spec;
  if (*spec) r.kernel.options.version = version;
  r.source = "default table";
  return r;
}

void add(std::vector<MappingRule>& t, const char* layer, const char* device,
         std::initializer_list<Mode> modes, const char* spec, int version) {
  for (Mode m : modes) t.push_back(rule(layer, device, m, spec, version));
}

}  // namespace

const std::vector<MappingRule>& default_mapping() {
  static const std::vector<MappingRule> table = [] {
    std::vector<MappingRule> t;
    const char* liger_rms = "kernels-community/liger-kernels:LigerRMSNorm";
    // MultiScaleDeformableAttention
    add(t, "MultiScaleDeformableAttention", "cuda", {kAny},
        "kernels-community/deformable-detr:MultiScaleDeformableAttention", 1);
    add(t, "MultiScaleDeformableAttention", "cpu", {kAny},
        "kernels-community/deformable-detr:MultiScaleDeformableAttention", 1);
    // Gated MLPs (an MLP answers to SwiGLUMLP or GeGLUMLP by its activation, see mapping_names)
    add(t, "SwiGLUMLP", "cuda", {kIC, kTC}, "kernels-community/liger-kernels:LigerSwiGLUMLP", 3);
    add(t, "GeGLUMLP", "cuda", {kIC, kTC}, "kernels-community/liger-kernels:LigerGEGLUMLP", 3);
    // Linear
    add(t, "Linear", "cuda", {kTC}, "kernels-community/liger-kernels:LigerLinear", 3);
    add(t, "Linear", "cuda", {kI, kIC}, "", 0);
    // RMSNorm
    add(t, "RMSNorm", "cuda", {kT, kI, kTC, kIC}, liger_rms, 3);
    add(t, "RMSNorm", "rocm", {kT, kI}, liger_rms, 3);
    add(t, "RMSNorm", "xpu", {kI}, "kernels-community/rmsnorm:RMSNorm", 1);
    add(t, "RMSNorm", "mps", {kI}, "kernels-community/mlx_rmsnorm:RMSNorm", 1);
    add(t, "RMSNorm", "npu", {kT, kI}, liger_rms, 3);
    add(t, "RMSNorm", "cpu", {kAny}, "kernels-community/rmsnorm:RMSNorm", 1);
    // MoE MLP
    for (const char* d : {"cuda", "rocm"})
      add(t, "MoeMLP", d, {kT, kI}, "kernels-community/megablocks:MegaBlocksMoeMLP", 1);
    add(t, "MoeMLP", "xpu", {kI}, "kernels-community/megablocks:MegaBlocksMoeMLP", 1);
    // No cpu row on purpose: megablocks' cpu variant is the portable single-threaded reference,
    // and the built-in block (OpenBLAS per expert) is faster there.
    // Activations (Transformers' entry names: Silu, Gelu, GeluTanh, FastGELU, QuickGELU, NewGELU)
    const std::pair<const char*, const char*> acts[] = {
        {"FastGELU", "kernels-community/activation:FastGELU"},
        {"QuickGELU", "kernels-community/activation:QuickGELU"},
        {"NewGELU", "kernels-community/activation:NewGELU"},
        {"SiLU", "kernels-community/activation:Silu"},
        {"GeLU", "kernels-community/activation:Gelu"},
        {"GeluTanh", "kernels-community/activation:GeluTanh"}};
    for (const auto& [layer, spec] : acts) {
      add(t, layer, "cuda", {kIC}, spec, 1);
      add(t, layer, "cpu", {kAny}, spec, 1);
    }
    // Rotary embedding (a registered function)
    add(t, "rotary_pos_emb", "xpu", {kI}, "kernels-community/rotary:apply_rotary_transformers", 2);
    add(t, "rotary_pos_emb", "cuda", {kAny}, "kernels-community/rotary:apply_rotary_transformers",
        2);
    add(t, "rotary_pos_emb", "rocm", {kI}, "kernels-community/aiter-rope:apply_rotary_transformers",
        2);
    add(t, "rotary_pos_emb", "cpu", {kAny}, "kernels-community/rotary:apply_rotary_transformers",
        2);
    // Causal-LM loss
    add(t, "ForCausalLMLoss", "cuda", {kTC},
        "kernels-community/liger-kernels:LigerForCausalLMLossLayer", 3);
    return t;
  }();
  return table;
}

}  // namespace hk::kernel_binding
