// Internal (src/models/qwen3_moe): Qwen3-MoE checkpoints in the Hub's per-expert layout, read as
// the stacked expert tensors hk's tree (and Transformers 5.x) holds.
//
// The Hub's Qwen3-MoE checkpoints (and what Transformers 5.x save_pretrained writes by default,
// save_original_format=True) store each expert as three Linear weights,
//   <layer>.mlp.experts.<e>.gate_proj.weight [I, H], .up_proj.weight [I, H], .down_proj.weight [H,
//   I]
// while the model (and `save_original_format=False`) holds
//   <layer>.mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) and .down_proj [E, H, I],
// which is Transformers' own conversion (MergeModulelist then Concatenate along dim 1). This source
// presents the first as the second; checkpoints already in the stacked layout pass through.
// Everything is validated when the wrapper is made (every expert 0..E-1 present with all three
// projections, one shape for all experts), so a bad checkpoint fails before anything loads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hk/module.h"

namespace hk {

class StackedExpertsSource final : public nn::StateDictSource {
 public:
  explicit StackedExpertsSource(const nn::StateDictSource& base);
  std::vector<std::string> keys() const override;
  Shape shape(const std::string& key) const override;
  Tensor load(const std::string& key, Device device, std::optional<DType> dtype,
              Stream stream) const override;
  std::string describe() const override { return base_.describe(); }
  // Number of stacked tensors made from per-expert keys (0: the checkpoint was stacked already).
  size_t num_stacked() const { return stacked_.size(); }

 private:
  struct Stacked {
    // For gate_up_proj: per expert {gate key, up key}; for down_proj: per expert {down key}.
    std::vector<std::vector<std::string>> parts;
    Shape shape;
  };
  const nn::StateDictSource& base_;
  std::map<std::string, Stacked> stacked_;  // stacked key -> its per-expert sources
  std::vector<std::string> passthrough_;    // every other key
};

}  // namespace hk
