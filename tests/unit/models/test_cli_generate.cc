// `hk generate` as a user runs it: the built binary (HK_BINARY_DIR/bin/hk) on the fixtures; --json
// shape on success, exit status 1 and a sentence on each bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int status;
  std::string out;  // stdout and stderr together
};

std::string hk_binary() {
  const char* dir = std::getenv("HK_BINARY_DIR");
  return std::string(dir ? dir : ".") + "/bin/hk";
}

std::string fixture(const std::string& name) {
  return std::string(HK_TEST_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

CliRun run(const std::string& args, bool with_stderr = true) {
  std::string cmd = hk_binary() + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(CliGenerate, JsonShapeOnSuccess) {
  CliRun r = run(
      "generate --model " + fixture("qwen3-tiny") + " --ids 39,384,306 --max-new-tokens 4 --json",
      false);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({39, 384, 306}));
  ASSERT_TRUE(j["ids"].is_array());
  EXPECT_EQ(j["ids"].size(), 4u);
  EXPECT_TRUE(j["text"].is_string());
  for (const char* key : {"load_ms", "prefill_ms", "decode_tok_s"})
    EXPECT_TRUE(j["timings"][key].is_number()) << key;
}

TEST(CliGenerate, GreedyIdsMatchTheGoldenFixture) {
  std::ifstream in(fixture("llama-tiny-bf16") + "/expected.json");
  auto expected = nlohmann::json::parse(in);
  std::string ids;
  for (auto& id : expected["prompts"][0]["ids"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
  CliRun r = run("generate --model " + fixture("llama-tiny-bf16") + " --dtype f32 --ids " + ids +
                     " --max-new-tokens 8 --json",
                 false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], expected["greedy"][0]);
}

TEST(CliGenerate, PromptIsTokenizedWithTheModelsTokenizer) {
  std::ifstream in(fixture("qwen3-tiny") + "/expected.json");
  auto expected = nlohmann::json::parse(in);
  CliRun r =
      run("generate --model " + fixture("qwen3-tiny") + " --prompt \"" +
              expected["prompts"][0]["text"].get<std::string>() + "\" --max-new-tokens 8 --json",
          false);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], expected["prompts"][0]["ids"]);  // Qwen adds no special tokens
  EXPECT_EQ(j["ids"], expected["greedy"][0]);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
}

TEST(CliGenerate, PromptWithoutTokenizerExitsOne) {
  fs::path dir = fs::temp_directory_path() / ("hk_cli_notok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(fixture("qwen3-tiny"), dir, fs::copy_options::recursive);
  fs::remove(dir / "tokenizer.json");
  CliRun r = run("generate --model " + dir.string() + " --prompt hi");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("tokenizer.json does not exist"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(CliGenerate, SamplingFlagsAreSeeded) {
  std::string args =
      "generate --model " + fixture("qwen3-tiny") +
      " --ids 5,6 --max-new-tokens 5 --temperature 1.3 --top-k 40 --top-p 0.95 --seed 11 --json";
  CliRun a = run(args, false), b = run(args, false);
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["ids"], nlohmann::json::parse(b.out)["ids"]);
}

TEST(CliGenerate, KernelizeFlagsRunKernelize) {
  CliRun r =
      run("generate --model " + fixture("qwen3-tiny") +
              " --ids 5,6 --max-new-tokens 2 --use-kernels --attn-implementation sdpa --json",
          false);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["kernelize"]["layers"].is_array()) << r.out;
  bool saw_norm = false;
  for (auto& layer : j["kernelize"]["layers"])
    saw_norm = saw_norm || layer["path"] == "model.layers.0.input_layernorm";
  EXPECT_TRUE(saw_norm) << r.out;
  // Greedy ids do not change: kernels must match the built-in numerics on the fixture.
  CliRun plain = run(
      "generate --model " + fixture("qwen3-tiny") + " --ids 5,6 --max-new-tokens 2 --json", false);
  EXPECT_EQ(j["ids"], nlohmann::json::parse(plain.out)["ids"]);
}

void expect_user_error(const std::string& args, const std::string& sentence) {
  CliRun r = run(args);
  EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("hk: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(sentence), std::string::npos) << args << "\n" << r.out;
}

TEST(CliGenerate, BadInputExitsOneWithASentence) {
  const std::string m = " --model " + fixture("qwen3-tiny");
  expect_user_error("generate --model /nonexistent/dir --ids 1", "does not exist");
  expect_user_error("generate" + m + " --ids 1,x", "--ids must be comma-separated");
  expect_user_error("generate" + m, "give the prompts as text");
  expect_user_error("generate" + m + " --prompt hi --ids 1", "not both");
  expect_user_error("generate" + m + " --prompts-file /nonexistent/prompts.txt",
                    "/nonexistent/prompts.txt");
  expect_user_error("generate" + m + " --ids 1 --eos-token-id x", "--eos-token-id must be");
  expect_user_error("generate" + m + " --ids 1 --stop ''", "--stop needs a non-empty string");
  expect_user_error("generate" + m + " --ids 1 --max-new-tokens 500",
                    "longer than the model's context");
  expect_user_error("generate" + m + " --ids 1 --dtype f8", "f8");
  expect_user_error("generate" + m + " --ids 99999", "outside the vocabulary");
  expect_user_error("generate" + m + " --ids 1 --attn-implementation flash_attention_9",
                    "flash_attention_9");
  expect_user_error("generate" + m + " --ids 1 --kernel-config /nonexistent.json",
                    "/nonexistent.json");
}

// Several prompts are one left-padded batch: one JSON object a line, in prompt order, with the
// ids Transformers gives for that batch.
TEST(CliGenerate, SeveralPromptsGiveOneJsonLineEachInOrder) {
  std::ifstream in(fixture("qwen3-tiny") + "/expected.json");
  auto expected = nlohmann::json::parse(in);
  std::string ids_args, prompt_args;
  fs::path file = fs::temp_directory_path() / ("hk_cli_prompts_" + std::to_string(::getpid()));
  {
    std::ofstream out(file);
    for (auto& p : expected["prompts"]) {
      std::string ids;
      for (auto& id : p["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
      ids_args += " --ids " + ids;
      const std::string text = p["text"].get<std::string>();
      if (text.find('\n') == std::string::npos) out << text << "\n\n";  // blank lines skipped
    }
  }
  const int64_t n = expected["max_new_tokens"].get<int64_t>();
  CliRun r = run("generate --model " + fixture("qwen3-tiny") + ids_args + " --max-new-tokens " +
                     std::to_string(n) + " --json",
                 false);
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  size_t row = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    ASSERT_LT(row, expected["prompts"].size()) << r.out;
    EXPECT_EQ(j["prompt_ids"], expected["prompts"][row]["ids"]);
    EXPECT_EQ(j["ids"], expected["batch_greedy"][row]) << "row " << row;
    EXPECT_EQ(j["timings"]["batch"], expected["prompts"].size());
    EXPECT_TRUE(j["timings"]["decode_path"].is_string());
    ++row;
  }
  EXPECT_EQ(row, expected["prompts"].size());
  // --prompts-file: one prompt a line, empty lines skipped; text mode prints a line per prompt.
  CliRun f = run("generate --model " + fixture("qwen3-tiny") + " --prompts-file " + file.string() +
                     " --max-new-tokens 3 --json",
                 false);
  ASSERT_EQ(f.status, 0) << f.out;
  EXPECT_EQ(std::count(f.out.begin(), f.out.end(), '\n'), 2) << f.out;  // prompts 0 and 1
  EXPECT_EQ(nlohmann::json::parse(f.out.substr(0, f.out.find('\n')))["prompt_ids"],
            expected["prompts"][0]["ids"]);
  fs::remove(file);
}

// Text mode streams one prompt's text as it is produced; the output is the decoded text.
TEST(CliGenerate, TextModeStreamsTheDecodedText) {
  CliRun j = run("generate --model " + fixture("qwen3-tiny") +
                     " --prompt \"Hello world\" --max-new-tokens 8 --json",
                 false);
  ASSERT_EQ(j.status, 0) << j.out;
  CliRun t = run("generate --model " + fixture("qwen3-tiny") +
                     " --prompt \"Hello world\" --max-new-tokens 8 --no-cuda-graphs",
                 false);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_EQ(t.out, nlohmann::json::parse(j.out)["text"].get<std::string>() + "\n");
  // Without a tokenizer the ids stream, comma-separated.
  CliRun ids = run(
      "generate --model " + fixture("qwen3-tiny") + " --ids 39,384,306 --max-new-tokens 4", false);
  CliRun ids_json = run(
      "generate --model " + fixture("qwen3-tiny") + " --ids 39,384,306 --max-new-tokens 4 --json",
      false);
  // (the fixture has a tokenizer, so --ids output is the decoded text as well)
  const auto parsed = nlohmann::json::parse(ids_json.out);
  EXPECT_EQ(parsed["ids"].size(), 4u);
  EXPECT_EQ(ids.out, parsed["text"].get<std::string>() + "\n");
}

// --eos-token-id replaces the stop ids; --stop ends a row once its text contains the string.
TEST(CliGenerate, EosTokenIdAndStopStringsEndRows) {
  const std::string base = "generate --model " + fixture("qwen3-tiny") + " --ids 39,384,306";
  auto ids_of = [&](const std::string& extra) {
    CliRun r = run(base + " --max-new-tokens 8 --json" + extra, false);
    EXPECT_EQ(r.status, 0) << r.out;
    return nlohmann::json::parse(r.out);
  };
  auto free_run = ids_of(" --eos-token-id 0");
  ASSERT_EQ(free_run["ids"].size(), 8u);
  const auto all = free_run["ids"].get<std::vector<int64_t>>();
  const int64_t stop_id = all[2];
  const auto first = std::find(all.begin(), all.end(), stop_id);  // it may occur before index 2
  auto eos_run = ids_of(" --eos-token-id 0," + std::to_string(stop_id));
  EXPECT_EQ(eos_run["ids"].get<std::vector<int64_t>>(),
            std::vector<int64_t>(all.begin(), first + 1));
  // A stop string taken from the text of the first two tokens ends the row at the token that
  // completed it.
  CliRun two = run(base + " --max-new-tokens 2 --eos-token-id 0 --json", false);
  const std::string text2 = nlohmann::json::parse(two.out)["text"].get<std::string>();
  ASSERT_FALSE(text2.empty());
  const std::string stop = text2.substr(text2.size() - 1);
  auto stopped = ids_of(" --eos-token-id 0 --stop '" + stop + "'");
  EXPECT_LE(stopped["ids"].size(), 2u);
  EXPECT_NE(stopped["text"].get<std::string>().find(stop), std::string::npos);
}

TEST(CliGenerate, CorruptAndMismatchedCheckpointsExitOne) {
  fs::path dir = fs::temp_directory_path() / ("hk_cli_generate_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(fixture("qwen3-tiny"), dir, fs::copy_options::recursive);
  {
    std::ifstream in(dir / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("\"hidden_size\": 64"), 17, "\"hidden_size\": 32");
    std::ofstream(dir / "config.json", std::ios::trunc) << text;
  }
  expect_user_error("generate --model " + dir.string() + " --ids 1", "does not match");
  fs::remove_all(dir);
  fs::copy(fixture("qwen3-tiny"), dir, fs::copy_options::recursive);
  fs::resize_file(dir / "model.safetensors", 1000);
  expect_user_error("generate --model " + dir.string() + " --ids 1", "model.safetensors");
  fs::remove_all(dir);
}

}  // namespace
