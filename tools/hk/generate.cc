// `hk generate --model DIR (--prompt TEXT | --ids 1,2,3) [--max-new-tokens N] [--device cpu|cuda]
//   [--dtype auto|f32|bf16|f16] [--temperature T --top-k K --top-p P --seed S] [--json]
//   [--use-kernels] [--kernel-config FILE.json] [--attn-implementation NAME] [--allow-all-kernels]
//   [--kernels-lock FILE] [--allow-unlocked-kernels] [--require-signed]`
//
// Loads the model with AutoModelForCausalLM::from_pretrained and generates. Greedy unless one of
// --temperature (> 0), --top-k or --top-p is given. --prompt needs DIR/tokenizer.json. The
// kernelize flags go into LoadOptions: with --use-kernels, --kernel-config (implies
// --use-kernels, with a note) or a non-built-in --attn-implementation the model is kernelized
// (Inference) and the JSON output carries the per-layer report under "kernelize".
//
// Text output: the generated text (or the ids when there is no tokenizer).
// --json output (stable; extra keys may be added):
//   {"prompt_ids": [..], "ids": [new tokens only], "text": "<decoded new tokens>",
//    "timings": {"load_ms": .., "prefill_ms": .., "decode_tok_s": .., "decode_steps": ..},
//    "kernelize": {"device", "mode", "layers": [..]}   (only when a kernelize flag was given)}
// Every user-facing failure (missing or corrupt files, wrong shapes, a prompt longer than the
// context) is an hk::Error: exit status 1 and one sentence on stderr.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "hk/error.h"
#include "hk/models.h"
#include "hk/tokenizer.h"
#include "kernel_policy.h"

namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string ids;
  int64_t max_new_tokens = 20;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  uint64_t seed = 0;
  bool json = false;
  bool use_kernels = false;
  std::string kernel_config;
  std::string attn_implementation;
  bool allow_all_kernels = false;
  hk::cli::KernelPolicyFlags policy;
};

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0)
      throw hk::InvalidArgument("--ids must be comma-separated non-negative token ids, got '" +
                                text + "'");
    out.push_back(v);
  }
  if (out.empty()) throw hk::InvalidArgument("--ids is empty; give at least one token id");
  return out;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void run_generate(const GenerateArgs& a) {
  if (a.prompt.empty() == a.ids.empty())
    throw hk::InvalidArgument("give exactly one of --prompt TEXT or --ids 1,2,3");
  if (a.max_new_tokens < 0) throw hk::InvalidArgument("--max-new-tokens must be >= 0");
  // NaN compares false with everything, so "> 0" alone would quietly turn sampling off.
  if (a.temperature && !(std::isfinite(*a.temperature) && *a.temperature >= 0))
    throw hk::InvalidArgument("--temperature must be a finite number >= 0 (0 = greedy)");
  if (a.top_p && !(*a.top_p > 0 && *a.top_p <= 1))
    throw hk::InvalidArgument("--top-p must be a number in (0, 1]");
  if (a.top_k && *a.top_k < 0) throw hk::InvalidArgument("--top-k must be >= 0");

  hk::LoadOptions load;
  load.device = a.device;
  if (a.dtype != "auto") load.dtype = hk::parse_dtype(a.dtype);
  load.use_kernels = a.use_kernels;
  load.kernel_config_file = a.kernel_config;
  load.attn_implementation = a.attn_implementation;
  load.allow_all_kernels = a.allow_all_kernels;
  load.kernels_lock = a.policy.kernels_lock;
  load.allow_unlocked_kernels = a.policy.allow_unlocked;
  load.require_signed_kernels = a.policy.require_signed;

  std::vector<int64_t> prompt_ids;
  std::optional<hk::Tokenizer> tokenizer;
  const std::string tokenizer_path = a.model + "/tokenizer.json";
  if (std::filesystem::exists(tokenizer_path)) tokenizer = hk::Tokenizer::from_file(tokenizer_path);
  if (!a.prompt.empty()) {
    if (!tokenizer)
      throw hk::NotFound(tokenizer_path +
                         " does not exist; --prompt needs the model's "
                         "tokenizer (or pass token ids with --ids)");
    prompt_ids = tokenizer->encode(a.prompt, /*add_special_tokens=*/true);
    if (prompt_ids.empty()) throw hk::InvalidArgument("--prompt encodes to no tokens");
  }
  if (!a.ids.empty()) prompt_ids = parse_ids(a.ids);

  auto t0 = std::chrono::steady_clock::now();
  hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(a.model, load);
  const hk::KernelizeReport* report = model.kernelize_report();
  const double load_ms = ms_since(t0);

  hk::GenerateOptions options;
  options.max_new_tokens = a.max_new_tokens;
  options.do_sample = a.top_k.has_value() || a.top_p.has_value() ||
                      (a.temperature.has_value() && *a.temperature > 0);
  if (a.temperature && *a.temperature > 0) options.temperature = *a.temperature;
  options.top_k = a.top_k.value_or(0);
  options.top_p = a.top_p.value_or(1.0);
  options.seed = a.seed;
  hk::GenerateOutput out = model.generate(prompt_ids, options);
  const std::vector<int64_t>& ids = out.sequences.at(0);

  std::string text;
  bool have_text = false;
  if (tokenizer) {
    text = tokenizer->decode(ids);
    have_text = true;
  }
  if (a.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt_ids;
    j["ids"] = ids;
    j["text"] = text;
    j["timings"] = {{"load_ms", load_ms},
                    {"prefill_ms", out.timings.prefill_ms},
                    {"decode_tok_s", out.timings.decode_tok_s},
                    {"decode_steps", out.timings.decode_steps}};
    if (report) j["kernelize"] = nlohmann::json::parse(report->to_json());
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else if (have_text) {
    std::cout << text << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "\n";
  }
}

void add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate text with a Qwen3/Llama checkpoint");
  cmd->add_option("--model", args->model, "model directory (config.json, safetensors)")->required();
  cmd->add_option("--prompt", args->prompt, "prompt text (needs DIR/tokenizer.json)");
  cmd->add_option("--ids", args->ids, "prompt token ids, comma-separated");
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "new tokens at most (default 20)");
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N (default cpu)");
  cmd->add_option("--dtype", args->dtype, "auto (checkpoint's), f32, bf16 or f16 (default auto)");
  cmd->add_option("--temperature", args->temperature, "sampling temperature (0 = greedy)");
  cmd->add_option("--top-k", args->top_k, "sample among the k most likely tokens");
  cmd->add_option("--top-p", args->top_p, "sample from the smallest set with this mass");
  cmd->add_option("--seed", args->seed, "sampling seed (default 0)");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_flag("--use-kernels", args->use_kernels, "bind hub kernels (hk::kernelize, inference)");
  cmd->add_option("--kernel-config", args->kernel_config,
                  "KernelConfig JSON file (implies --use-kernels)");
  cmd->add_option("--attn-implementation", args->attn_implementation,
                  "eager, sdpa, flash_attention_2|3|4 or a hub id org/repo[@rev][:fn]");
  cmd->add_flag("--allow-all-kernels", args->allow_all_kernels,
                "trust kernels outside trusted orgs");
  hk::cli::add_kernel_policy_flags(cmd, args->policy);
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace

HK_REGISTER_COMMAND(generate, add_generate);
