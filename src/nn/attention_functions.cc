// The attention-function registry with the built-in "eager" and "sdpa" entries (both the eager
// op; a fused SDPA-like path is a CUDA kernel matter, not a registry one).
#include "hk/attention_functions.h"

#include <map>
#include <mutex>

#include "hk/error.h"

namespace hk::nn {
namespace {

void eager_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const AttentionCall& call, Stream stream) {
  ops::AttentionOptions options;
  options.scale = call.scale;
  options.causal = call.causal;
  options.key_start = call.key_start;
  ops::attention(q, k, v, out, options, nullptr, stream);
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, AttentionFunction> functions{{"eager", eager_attention},
                                                     {"sdpa", eager_attention}};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_attention_function(const std::string& name, AttentionFunction fn) {
  HK_CHECK(!name.empty() && fn, "register_attention_function: empty name or function");
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().functions[name] = std::move(fn);
}

const AttentionFunction& attention_function(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().functions.find(name);
  if (it == registry().functions.end()) {
    std::string known;
    for (const auto& [n, f] : registry().functions) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("attention implementation '" + name +
                          "' is not registered; registered: " + known);
  }
  return it->second;  // std::map nodes are stable; entries are replaced, never erased
}

bool has_attention_function(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().functions.count(name) != 0;
}

std::vector<std::string> attention_function_names() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [n, f] : registry().functions) out.push_back(n);
  return out;
}

}  // namespace hk::nn
