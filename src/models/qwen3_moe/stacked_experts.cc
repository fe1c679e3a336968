// Per-expert Qwen3-MoE checkpoint keys stacked into the model's expert tensors (see
// stacked_experts.h).
#include "stacked_experts.h"

#include <regex>
#include <set>

#include "hk/error.h"

namespace hk {
namespace {

// prefix "….mlp.experts" -> expert -> projection ("gate_proj" | "up_proj" | "down_proj") -> key
using ExpertKeys = std::map<std::string, std::map<int64_t, std::map<std::string, std::string>>>;

}  // namespace

StackedExpertsSource::StackedExpertsSource(const nn::StateDictSource& base) : base_(base) {
  static const std::regex per_expert(
      R"(^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$)");
  ExpertKeys groups;
  std::set<std::string> all;
  for (const std::string& key : base.keys()) {
    all.insert(key);
    std::smatch m;
    if (std::regex_match(key, m, per_expert) && m[2].length() <= 6) {
      groups[m[1]][std::stoll(m[2])][m[3]] = key;
      continue;
    }
    passthrough_.push_back(key);
  }
  const std::string where = " in " + base.describe();
  for (const auto& [prefix, experts] : groups) {
    for (const char* fused : {".gate_up_proj", ".down_proj"})
      if (all.count(prefix + fused))
        throw InvalidArgument("checkpoint has both per-expert keys (" + prefix +
                              ".<e>.*_proj.weight) and the stacked " + prefix + fused + where +
                              "; keep one layout");
    const int64_t n = static_cast<int64_t>(experts.size());
    if (experts.rbegin()->first != n - 1)
      throw InvalidArgument(prefix + ": the checkpoint has " + std::to_string(n) +
                            " experts but their indices run up to " +
                            std::to_string(experts.rbegin()->first) + where +
                            "; an expert's weights are missing");
    Stacked gate_up, down;
    Shape gate_shape, down_shape;
    for (const auto& [e, projections] : experts) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
        if (!projections.count(proj))
          throw InvalidArgument("tensor '" + prefix + "." + std::to_string(e) + "." + proj +
                                ".weight' is missing" + where + " (expert " + std::to_string(e) +
                                " has the other projections)");
      const Shape g = base.shape(projections.at("gate_proj"));
      const Shape u = base.shape(projections.at("up_proj"));
      const Shape d = base.shape(projections.at("down_proj"));
      if (e == 0) {
        gate_shape = g;
        down_shape = d;
        if (g.size() != 2 || d.size() != 2 || d[0] != g[1] || d[1] != g[0])
          throw InvalidArgument(prefix + ".0: gate_proj " + shape_str(g) + " and down_proj " +
                                shape_str(d) + where + " are not [I, H] and [H, I]");
      }
      if (g != gate_shape || u != gate_shape || d != down_shape)
        throw InvalidArgument(prefix + "." + std::to_string(e) + ": gate/up/down_proj " +
                              shape_str(g) + ", " + shape_str(u) + ", " + shape_str(d) + where +
                              " differ from expert 0's " + shape_str(gate_shape) + ", " +
                              shape_str(gate_shape) + ", " + shape_str(down_shape));
      gate_up.parts.push_back({projections.at("gate_proj"), projections.at("up_proj")});
      down.parts.push_back({projections.at("down_proj")});
    }
    gate_up.shape = {n, 2 * gate_shape[0], gate_shape[1]};
    down.shape = {n, down_shape[0], down_shape[1]};
    stacked_.emplace(prefix + ".gate_up_proj", std::move(gate_up));
    stacked_.emplace(prefix + ".down_proj", std::move(down));
  }
}

std::vector<std::string> StackedExpertsSource::keys() const {
  std::vector<std::string> out = passthrough_;
  for (const auto& [key, s] : stacked_) out.push_back(key);
  return out;
}

Shape StackedExpertsSource::shape(const std::string& key) const {
  auto it = stacked_.find(key);
  return it == stacked_.end() ? base_.shape(key) : it->second.shape;
}

Tensor StackedExpertsSource::load(const std::string& key, Device device, std::optional<DType> dtype,
                                  Stream stream) const {
  auto it = stacked_.find(key);
  if (it == stacked_.end()) return base_.load(key, device, dtype, stream);
  const Stacked& s = it->second;
  Tensor out;
  for (size_t e = 0; e < s.parts.size(); ++e) {
    int64_t row = 0;
    for (const std::string& part : s.parts[e]) {
      Tensor piece = base_.load(part, device, dtype, stream);
      if (!out.defined()) out = Tensor::empty(s.shape, piece.dtype(), device, stream);
      HK_CHECK(piece.dtype() == out.dtype(), "tensor '" + part + "' in " + base_.describe() +
                                                 " has another dtype than expert 0's");
      out.select(0, static_cast<int64_t>(e))
          .slice(0, row, row + piece.size(0))
          .copy_from(piece.view(), stream);
      row += piece.size(0);
    }
  }
  return out;
}

}  // namespace hk
