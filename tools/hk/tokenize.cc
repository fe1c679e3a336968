// `hk tokenize --model DIR (--text TEXT | --ids 1,2,3) [--json]`: runs the model directory's
// tokenizer.json both ways. Text gives its ids and their decoding (which shows normalization);
// ids give their decoding. With --json it prints {"ids": [..], "decoded": ".."}.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "hk/error.h"
#include "hk/tokenizer.h"

namespace hk::cli {
namespace {

std::vector<int64_t> parse_ids(const std::string& list) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 0)
      throw InvalidArgument("--ids must be a comma-separated list of non-negative integers, got '" +
                            item + "'");
    ids.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

struct Options {
  std::string model, text, ids;
  bool json = false, add_special_tokens = false, skip_special_tokens = false;
};

void run(const Options& o, CLI::App* text_option_owner) {
  // A tokenizer.json given directly is accepted too.
  bool is_json_file = o.model.size() >= 5 && o.model.compare(o.model.size() - 5, 5, ".json") == 0;
  Tokenizer tokenizer =
      is_json_file ? Tokenizer::from_file(o.model) : Tokenizer::from_pretrained(o.model);
  bool from_text = text_option_owner->count("--text") > 0;
  std::vector<int64_t> ids =
      from_text ? tokenizer.encode(o.text, o.add_special_tokens) : parse_ids(o.ids);
  std::string decoded = tokenizer.decode(ids, o.skip_special_tokens);
  if (o.json) {
    nlohmann::json out = {{"ids", ids}, {"decoded", decoded}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  if (from_text) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "\n";
  } else {
    std::cout << decoded << "\n";
  }
}

void add_tokenize(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("tokenize", "Encode text or decode ids with a model's tokenizer");
  cmd->add_option("--model", options->model,
                  "Model directory containing tokenizer.json (or the tokenizer.json itself)")
      ->required();
  auto* text = cmd->add_option("--text", options->text, "Text to encode");
  auto* ids = cmd->add_option("--ids", options->ids, "Comma-separated ids to decode");
  text->excludes(ids);
  cmd->add_flag("--json", options->json, "Print {\"ids\": [..], \"decoded\": \"..\"}");
  cmd->add_flag("--add-special-tokens", options->add_special_tokens,
                "Apply the post-processor template (e.g. Llama 3's BOS) when encoding");
  cmd->add_flag("--skip-special-tokens", options->skip_special_tokens,
                "Leave special tokens out of the decoded text");
  cmd->callback([options, cmd, text, ids] {
    if (text->count() == 0 && ids->count() == 0)
      throw InvalidArgument("hk tokenize needs --text TEXT or --ids 1,2,3");
    run(*options, cmd);
  });
}

}  // namespace
}  // namespace hk::cli

HK_REGISTER_COMMAND(tokenize, hk::cli::add_tokenize);
