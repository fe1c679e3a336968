// Weight-decay groups (hk/optim.h): Trainer.get_decay_parameter_names' rule. Transformers applies
// its patterns at every level of the module tree to the path below that level; every such path is
// a suffix of the full path starting after a '.', so testing the full lower-cased path with '^'
// read as "start or after a dot" is the same rule.
#include <algorithm>
#include <cctype>
#include <string>

#include "hk/optim.h"

namespace hk::optim {
namespace {

bool boundary_before(const std::string& s, size_t pos) {
  return pos == 0 || s[pos - 1] == '.';
}
bool boundary_after(const std::string& s, size_t end) {
  return end == s.size() || s[end] == '.';
}

// `(?:^|\.)word(?:$|\.)` when `need_start`, else `word(?:$|\.)`.
bool matches_segment(const std::string& s, const std::string& word, bool need_start) {
  for (size_t pos = s.find(word); pos != std::string::npos; pos = s.find(word, pos + 1)) {
    if (need_start && !boundary_before(s, pos)) continue;
    if (boundary_after(s, pos + word.size())) return true;
  }
  return false;
}

}  // namespace

bool excluded_from_weight_decay(const std::string& path, const std::string& module_type) {
  // nn.LayerNorm children are excluded by type in Transformers.
  if (module_type == "LayerNorm") return true;
  std::string s = path;
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s.find("bias") != std::string::npos) return true;
  if (s.find("layernorm") != std::string::npos) return true;
  if (s.find("rmsnorm") != std::string::npos) return true;
  if (matches_segment(s, "norm", /*need_start=*/true)) return true;
  if (matches_segment(s, "_norm", /*need_start=*/false)) return true;
  return false;
}

std::vector<OptimTensor> trainable_parameters(nn::Module& root) {
  std::vector<OptimTensor> out;
  for (auto& [path, p] : root.named_parameters("", /*include_buffers=*/false)) {
    if (p->is_buffer || !p->tied_to.empty() || !p->requires_grad) continue;
    out.push_back({path, &p->value, &p->grad, !excluded_from_weight_decay(path)});
  }
  return out;
}

}  // namespace hk::optim
