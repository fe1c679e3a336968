// `hk generate` as a user runs it: the built binary (HK_BINARY_DIR/bin/hk) on the fixtures; --json
// shape on success, exit status 1 and a sentence on each bad input.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  expect_user_error("generate" + m, "exactly one of --prompt TEXT or --ids");
  expect_user_error("generate" + m + " --ids 1 --max-new-tokens 500",
                    "longer than the model's context");
  expect_user_error("generate" + m + " --ids 1 --dtype f8", "f8");
  expect_user_error("generate" + m + " --ids 99999", "outside the vocabulary");
  expect_user_error("generate" + m + " --ids 1 --attn-implementation flash_attention_9",
                    "flash_attention_9");
  expect_user_error("generate" + m + " --ids 1 --kernel-config /nonexistent.json",
                    "/nonexistent.json");
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
