// TrainingArguments validation and the Liger switches (hk/training_args.h).
#include "hk/training_args.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "hk/error.h"
#include "hk/lr_scheduler.h"

namespace hk {
namespace {

void require(bool ok, const std::string& flag, const std::string& what) {
  if (!ok) throw InvalidArgument("--" + flag + " " + what);
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

constexpr const char* kLigerRepo = "kernels-community/liger-kernels:";
constexpr int kLigerVersion = 3;

}  // namespace

void TrainingArguments::validate() const {
  require(!output_dir.empty(), "output-dir", "is required (where checkpoints are written)");
  require(per_device_train_batch_size >= 1, "per-device-train-batch-size", "must be >= 1");
  require(gradient_accumulation_steps >= 1, "gradient-accumulation-steps", "must be >= 1");
  require(std::isfinite(learning_rate) && learning_rate >= 0, "learning-rate", "must be >= 0");
  require(std::isfinite(weight_decay) && weight_decay >= 0, "weight-decay", "must be >= 0");
  require(adam_beta1 >= 0 && adam_beta1 < 1, "adam-beta1", "must be in [0, 1)");
  require(adam_beta2 >= 0 && adam_beta2 < 1, "adam-beta2", "must be in [0, 1)");
  require(std::isfinite(adam_epsilon) && adam_epsilon >= 0, "adam-epsilon", "must be >= 0");
  require(std::isfinite(max_grad_norm) && max_grad_norm >= 0, "max-grad-norm",
          "must be >= 0 (0 disables clipping)");
  require(max_steps > 0 || (std::isfinite(num_train_epochs) && num_train_epochs > 0),
          "num-train-epochs", "must be > 0 when --max-steps is not given");
  require(max_steps != 0, "max-steps", "must be > 0 (or -1 to train --num-train-epochs epochs)");
  parse_scheduler_type(lr_scheduler_type);
  require(std::isfinite(warmup_steps) && warmup_steps >= 0, "warmup-steps",
          "must be >= 0 (a step count, or a ratio of the total below 1)");
  require(warmup_ratio >= 0 && warmup_ratio <= 1, "warmup-ratio", "must be in [0, 1]");
  require(std::isfinite(logging_steps) && logging_steps > 0, "logging-steps",
          "must be > 0 (a step count, or a ratio of the total below 1)");
  require(logging_steps < 1 || logging_steps == std::floor(logging_steps), "logging-steps",
          "must be a whole number of steps when >= 1");
  require(save_strategy == "steps" || save_strategy == "no", "save-strategy",
          "must be 'steps' or 'no'");
  require(std::isfinite(save_steps) && save_steps > 0, "save-steps",
          "must be > 0 (a step count, or a ratio of the total below 1)");
  require(save_steps < 1 || save_steps == std::floor(save_steps), "save-steps",
          "must be a whole number of steps when >= 1");
  require(!save_total_limit || *save_total_limit >= 1, "save-total-limit", "must be >= 1");
  if (use_liger_kernel) LigerKernelConfig::resolve(liger_kernel_config);
}

int64_t TrainingArguments::steps_from(double value, int64_t total_steps) {
  if (value < 1) return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(total_steps * value)));
  return static_cast<int64_t>(value);
}

const std::vector<std::string>& LigerKernelConfig::known_keys() {
  static const std::vector<std::string> keys = {
      "rope",     "swiglu",    "geglu", "cross_entropy", "fused_linear_cross_entropy",
      "rms_norm", "layer_norm"};
  return keys;
}

LigerKernelConfig LigerKernelConfig::resolve(const std::map<std::string, bool>& overrides) {
  LigerKernelConfig c;
  for (const auto& [key, on] : overrides) {
    if (key == "rope")
      c.rope = on;
    else if (key == "swiglu")
      c.swiglu = on;
    else if (key == "geglu")
      c.geglu = on;
    else if (key == "cross_entropy")
      c.cross_entropy = on;
    else if (key == "fused_linear_cross_entropy")
      c.fused_linear_cross_entropy = on;
    else if (key == "rms_norm")
      c.rms_norm = on;
    else if (key == "layer_norm")
      c.layer_norm = on;
    else {
      std::string known;
      for (const auto& k : known_keys()) known += (known.empty() ? "" : ", ") + k;
      throw InvalidArgument("--liger-kernel-config: unknown key '" + key +
                            "'; the known keys are " + known);
    }
  }
  // Liger's own rule: an explicit cross_entropy=true without fused_linear_cross_entropy=false is
  // still both (FLCE defaults on), which Liger rejects too.
  if (c.cross_entropy && c.fused_linear_cross_entropy)
    throw InvalidArgument(
        "--liger-kernel-config: cross_entropy and fused_linear_cross_entropy cannot both be true "
        "(both replace the loss); with cross_entropy=true also set "
        "fused_linear_cross_entropy=false");
  return c;
}

std::map<std::string, bool> LigerKernelConfig::parse(std::string_view text) {
  std::map<std::string, bool> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string item = trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) {
      if (end == text.size()) break;
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InvalidArgument("--liger-kernel-config: '" + item +
                            "' is not key=value (e.g. rope=true,swiglu=false)");
    const std::string key = trim(item.substr(0, eq));
    const std::string value = lower(trim(item.substr(eq + 1)));
    bool on;
    if (value == "true" || value == "1" || value == "yes" || value == "on")
      on = true;
    else if (value == "false" || value == "0" || value == "no" || value == "off")
      on = false;
    else
      throw InvalidArgument("--liger-kernel-config: value of '" + key +
                            "' must be true or false, got '" + value + "'");
    out[key] = on;
    if (end == text.size()) break;
  }
  resolve(out);  // unknown keys and the exclusive pair fail here, at parse time
  return out;
}

KernelConfig LigerKernelConfig::kernel_config(const std::vector<std::string>& model_layers,
                                              const std::string& hidden_act,
                                              std::vector<std::string>* skipped) const {
  KernelConfig config;
  config.inherit_mapping = false;
  auto has_layer = [&](const std::string& layer) {
    return model_layers.empty() ||
           std::find(model_layers.begin(), model_layers.end(), layer) != model_layers.end();
  };
  auto add = [&](bool on, const char* key, const std::string& layer, const char* entry) {
    if (!on) return;
    if (!has_layer(layer)) {
      if (skipped) skipped->push_back(std::string(key) + ": the model has no " + layer + " layer");
      return;
    }
    config.kernel_mapping[layer] = KernelMappingValue(std::string(kLigerRepo) + entry,
                                                      KernelOptions{kLigerVersion, {}, false});
  };
  const bool gelu = hidden_act.rfind("gelu", 0) == 0;
  add(rope, "rope", "rotary_pos_emb", "LigerRope");
  add(rms_norm, "rms_norm", "RMSNorm", "LigerRMSNorm");
  add(layer_norm, "layer_norm", "LayerNorm", "LigerLayerNorm");
  if (swiglu && gelu && skipped)
    skipped->push_back("swiglu: the MLP's activation is " + hidden_act);
  if (geglu && !gelu && skipped) skipped->push_back("geglu: the MLP's activation is " + hidden_act);
  add(swiglu && !gelu, "swiglu", "MLP", "LigerSwiGLUMLP");
  add(geglu && gelu, "geglu", "MLP", "LigerGEGLUMLP");
  add(cross_entropy, "cross_entropy", "ForCausalLMLoss", "LigerForCausalLMLoss");
  add(fused_linear_cross_entropy, "fused_linear_cross_entropy", "ForCausalLMLoss",
      "LigerFusedLinearCrossEntropyLoss");
  return config;
}

std::string LigerKernelConfig::str() const {
  const bool values[] = {rope,     swiglu,    geglu, cross_entropy, fused_linear_cross_entropy,
                         rms_norm, layer_norm};
  std::string out;
  for (size_t i = 0; i < known_keys().size(); ++i)
    out += (i ? "," : "") + known_keys()[i] + "=" + (values[i] ? "true" : "false");
  return out;
}

}  // namespace hk
