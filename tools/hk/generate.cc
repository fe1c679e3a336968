// `hk generate --model DIR (--prompt TEXT ... | --prompts-file FILE | --ids 1,2,3 ...)
//   [--max-new-tokens N] [--device cpu|cuda] [--dtype auto|f32|bf16|f16]
//   [--temperature T --top-k K --top-p P --seed S] [--stop TEXT ...] [--eos-token-id ID[,ID]]
//   [--no-cuda-graphs] [--json] [--use-kernels] [--kernel-config FILE.json]
//   [--attn-implementation NAME] [--allow-all-kernels]
//   [--kernels-lock FILE] [--allow-unlocked-kernels] [--require-signed]`
//
// Loads the model with AutoModelForCausalLM::from_pretrained and generates. Several prompts
// (repeated --prompt or --ids, or --prompts-file with one prompt a line, empty lines skipped) are
// one left-padded batch. Greedy unless one of --temperature (> 0), --top-k or --top-p is given.
// --prompt needs DIR/tokenizer.json. The kernelize flags go into LoadOptions: with --use-kernels,
// --kernel-config (implies --use-kernels, with a note) or a non-built-in --attn-implementation the
// model is kernelized — for Inference | Capture on CUDA, so every bound kernel can run inside the
// decode step's CUDA graph (kernels that do not declare capture safety fall back, the report says
// why), for Inference elsewhere or with --no-cuda-graphs — and the JSON output carries the
// per-layer report under "kernelize". On CUDA the decode step is a CUDA graph unless
// --no-cuda-graphs. --eos-token-id replaces the model's stop ids; --stop ends a row once its new
// text contains the string (the token that completed it is kept, as Transformers' stop_strings).
//
// Text output: one prompt streams its text to stdout as tokens arrive (the ids, comma-separated,
// without a tokenizer — with --ids, a tokenizer.json that cannot be loaded is a warning on stderr
// and the ids are printed); several prompts print one line per prompt, in order, when done.
// --json output (stable; extra keys may be added), one object for one prompt, one object a line
// in prompt order for several:
//   {"prompt_ids": [..], "ids": [new tokens only], "text": "<decoded new tokens>",
//    "timings": {"load_ms": .., "prefill_ms": .., "decode_tok_s": .., "decode_steps": ..,
//                "decode_path": "cuda-graph|device|forward", "decode_note": "..", "batch": B},
//    "kernelize": {"device", "mode", "layers": [..]}   (only when a kernelize flag was given)}
// Every user-facing failure (missing or corrupt files, wrong shapes, a prompt longer than the
// context) is an hk::Error: exit status 1 and one sentence on stderr.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
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
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::vector<std::string> ids;
  int64_t max_new_tokens = 20;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<std::string> eos_token_ids;
  bool no_cuda_graphs = false;
  bool json = false;
  bool use_kernels = false;
  std::string kernel_config;
  std::string attn_implementation;
  bool allow_all_kernels = false;
  hk::cli::KernelPolicyFlags policy;
};

std::vector<int64_t> parse_id_list(const std::string& text, const char* flag) {
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
      throw hk::InvalidArgument(std::string(flag) +
                                " must be comma-separated non-negative token ids, got '" + text +
                                "'");
    out.push_back(v);
  }
  if (out.empty())
    throw hk::InvalidArgument(std::string(flag) + " is empty; give at least one token id");
  return out;
}

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw hk::NotFound("--prompts-file " + path + " cannot be read (one prompt per line)");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  if (out.empty()) throw hk::InvalidArgument("--prompts-file " + path + " holds no prompt");
  return out;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Decoded text that is safe to print now: without a trailing incomplete UTF-8 sequence, which the
// byte-level decoder shows as U+FFFD until the next token completes it.
bool ends_incomplete(const std::string& text) {
  static const std::string replacement = "\xEF\xBF\xBD";
  return text.size() >= 3 && text.compare(text.size() - 3, 3, replacement) == 0;
}

void run_generate(const GenerateArgs& a) {
  const bool text_prompts = !a.prompts.empty() || !a.prompts_file.empty();
  if (text_prompts == !a.ids.empty())
    throw hk::InvalidArgument(
        "give the prompts as text (--prompt TEXT, repeatable, or --prompts-file FILE) or as "
        "token ids (--ids 1,2,3, repeatable), not both and not neither");
  if (!a.prompts.empty() && !a.prompts_file.empty())
    throw hk::InvalidArgument("give --prompt or --prompts-file, not both");
  if (a.max_new_tokens < 0) throw hk::InvalidArgument("--max-new-tokens must be >= 0");
  // NaN compares false with everything, so "> 0" alone would quietly turn sampling off.
  if (a.temperature && !(std::isfinite(*a.temperature) && *a.temperature >= 0))
    throw hk::InvalidArgument("--temperature must be a finite number >= 0 (0 = greedy)");
  if (a.top_p && !(*a.top_p > 0 && *a.top_p <= 1))
    throw hk::InvalidArgument("--top-p must be a number in (0, 1]");
  if (a.top_k && *a.top_k < 0) throw hk::InvalidArgument("--top-k must be >= 0");
  for (const std::string& s : a.stop)
    if (s.empty()) throw hk::InvalidArgument("--stop needs a non-empty string");

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
  load.kernelize_capture = hk::Device::parse(a.device).is_cuda() && !a.no_cuda_graphs;

  if (!std::filesystem::is_directory(a.model))
    throw hk::NotFound("model directory " + a.model + " does not exist (it should hold " +
                       "config.json, model.safetensors and, for --prompt, tokenizer.json)");
  std::optional<hk::Tokenizer> tokenizer;
  const std::string tokenizer_path = a.model + "/tokenizer.json";
  if (std::filesystem::exists(tokenizer_path)) {
    try {
      tokenizer = hk::Tokenizer::from_file(tokenizer_path);
    } catch (const hk::Error& e) {
      // Token ids need no tokenizer: generate them and say why there is no text.
      if (text_prompts || !a.stop.empty()) throw;
      std::cerr << "hk: warning: " << e.what() << "; printing token ids only\n";
    }
  }
  std::vector<std::vector<int64_t>> prompt_ids;
  if (text_prompts) {
    if (!tokenizer)
      throw hk::NotFound(tokenizer_path +
                         " does not exist; --prompt needs the model's "
                         "tokenizer (or pass token ids with --ids)");
    const std::vector<std::string> texts =
        a.prompts_file.empty() ? a.prompts : read_prompts_file(a.prompts_file);
    for (size_t i = 0; i < texts.size(); ++i) {
      prompt_ids.push_back(tokenizer->encode(texts[i], /*add_special_tokens=*/true));
      if (prompt_ids.back().empty())
        throw hk::InvalidArgument("prompt " + std::to_string(i + 1) + " encodes to no tokens");
    }
  } else {
    for (const std::string& ids : a.ids) prompt_ids.push_back(parse_id_list(ids, "--ids"));
  }
  if (!tokenizer && !a.stop.empty())
    throw hk::NotFound(tokenizer_path + " does not exist; --stop compares decoded text");

  hk::GenerateOptions options;
  options.max_new_tokens = a.max_new_tokens;
  options.do_sample = a.top_k.has_value() || a.top_p.has_value() ||
                      (a.temperature.has_value() && *a.temperature > 0);
  if (a.temperature && *a.temperature > 0) options.temperature = *a.temperature;
  options.top_k = a.top_k.value_or(0);
  options.top_p = a.top_p.value_or(1.0);
  options.seed = a.seed;
  options.cuda_graphs = !a.no_cuda_graphs;
  if (!a.eos_token_ids.empty()) {
    std::vector<int64_t> eos;
    for (const std::string& list : a.eos_token_ids)
      for (int64_t id : parse_id_list(list, "--eos-token-id")) eos.push_back(id);
    options.eos_token_ids = eos;
  }

  auto t0 = std::chrono::steady_clock::now();
  hk::CausalLM model = hk::AutoModelForCausalLM::from_pretrained(a.model, load);
  const hk::KernelizeReport* report = model.kernelize_report();
  const double load_ms = ms_since(t0);

  // Streaming (text mode, one prompt) and stop strings see every token as it is produced.
  const size_t rows = prompt_ids.size();
  const bool stream_out = !a.json && rows == 1;
  std::vector<std::vector<int64_t>> so_far(rows);
  std::string printed;  // streamed text so far (row 0)
  bool printed_any_id = false;
  if (stream_out || !a.stop.empty()) {
    options.on_token = [&](size_t row, int64_t token) {
      so_far[row].push_back(token);
      std::string text;
      if (tokenizer && (stream_out || !a.stop.empty())) text = tokenizer->decode(so_far[row]);
      if (stream_out) {
        if (tokenizer) {
          if (!ends_incomplete(text) && text.size() > printed.size() &&
              text.compare(0, printed.size(), printed) == 0) {
            std::cout << text.substr(printed.size()) << std::flush;
            printed = text;
          }
        } else {
          std::cout << (printed_any_id ? "," : "") << token << std::flush;
          printed_any_id = true;
        }
      }
      for (const std::string& s : a.stop)
        if (text.find(s) != std::string::npos) return false;
      return true;
    };
  }
  hk::GenerateOutput out = model.generate(prompt_ids, options);

  auto text_of = [&](const std::vector<int64_t>& ids) {
    return tokenizer ? tokenizer->decode(ids) : std::string();
  };
  if (a.json) {
    for (size_t r = 0; r < rows; ++r) {
      nlohmann::json j;
      j["prompt_ids"] = prompt_ids[r];
      j["ids"] = out.sequences.at(r);
      j["text"] = text_of(out.sequences[r]);
      j["timings"] = {{"load_ms", load_ms},
                      {"prefill_ms", out.timings.prefill_ms},
                      {"decode_tok_s", out.timings.decode_tok_s},
                      {"decode_steps", out.timings.decode_steps},
                      {"decode_path", out.timings.decode_path},
                      {"decode_note", out.timings.decode_note},
                      {"batch", rows}};
      if (report) j["kernelize"] = nlohmann::json::parse(report->to_json());
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  } else if (stream_out) {
    if (tokenizer) {
      const std::string text = text_of(out.sequences.at(0));
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0)
        std::cout << text.substr(printed.size());
      else if (text != printed)
        std::cout << "\n" << text;  // the stream printed a prefix the final text does not have
    }
    std::cout << "\n";
  } else {
    for (size_t r = 0; r < rows; ++r) {
      const auto& ids = out.sequences.at(r);
      if (tokenizer) {
        std::cout << text_of(ids) << "\n";
      } else {
        for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
        std::cout << "\n";
      }
    }
  }
}

void add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate text with a Qwen3/Llama checkpoint");
  cmd->add_option("--model", args->model, "model directory (config.json, safetensors)")->required();
  cmd->add_option("--prompt", args->prompts,
                  "prompt text (needs DIR/tokenizer.json); repeat for a batch")
      ->allow_extra_args(false);
  cmd->add_option("--prompts-file", args->prompts_file, "file with one prompt per line (a batch)");
  cmd->add_option("--ids", args->ids, "prompt token ids, comma-separated; repeat for a batch")
      ->allow_extra_args(false);
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "new tokens at most (default 20)");
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N (default cpu)");
  cmd->add_option("--dtype", args->dtype, "auto (checkpoint's), f32, bf16 or f16 (default auto)");
  cmd->add_option("--temperature", args->temperature, "sampling temperature (0 = greedy)");
  cmd->add_option("--top-k", args->top_k, "sample among the k most likely tokens");
  cmd->add_option("--top-p", args->top_p, "sample from the smallest set with this mass");
  cmd->add_option("--seed", args->seed, "sampling seed (default 0)");
  cmd->add_option("--stop", args->stop, "stop a row once its new text contains this; repeatable")
      ->allow_extra_args(false);
  cmd->add_option("--eos-token-id", args->eos_token_ids,
                  "stop ids replacing the model's (comma-separated; repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--no-cuda-graphs", args->no_cuda_graphs,
                "CUDA: launch the decode step eagerly instead of replaying a CUDA graph");
  cmd->add_flag("--json", args->json, "print JSON (one object a line for several prompts)");
  cmd->add_flag("--use-kernels", args->use_kernels,
                "bind hub kernels (hk::kernelize: inference, with capture on CUDA)");
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
