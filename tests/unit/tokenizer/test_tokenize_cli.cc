// `hk tokenize` end to end: runs the built binary (HK_BINARY_DIR/bin/hk) on the committed fixture
// directories and checks its JSON against the reference ids in expected.json, and that bad input
// exits with status 1 and one sentence on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::string fixture(const std::string& name) {
  return env_or("HK_SOURCE_DIR", ".") + "/tests/fixtures/tokenizer/" + name;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Result {
  int status;
  std::string out, err;
};

Result run_hk(const std::string& args) {
  std::string err_path = ::testing::TempDir() + "/hk_tokenize_cli_stderr.txt";
  std::string cmd =
      quote(env_or("HK_BINARY_DIR", ".") + "/bin/hk") + " " + args + " 2>" + quote(err_path);
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, "", "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.out.append(buf, n);
  int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(err_path);
  std::ostringstream s;
  s << in.rdbuf();
  r.err = s.str();
  return r;
}

nlohmann::json expected_cases(const std::string& name) {
  std::ifstream in(fixture(name) + "/expected.json");
  return nlohmann::json::parse(in)["cases"];
}

TEST(TokenizeCli, JsonMatchesTheReference) {
  // The byte-level layouts at length, the Llama-family ones briefly (each run starts a process).
  for (const char* name : {"qwen2", "llama3", "llama2", "llama_hf5", "smollm"}) {
    const int wanted = std::string(name) == "qwen2" || std::string(name) == "llama3" ? 25 : 6;
    nlohmann::json cases = expected_cases(name);
    int checked = 0;
    for (const auto& c : cases) {
      std::string text = c["text"];
      // Shell arguments cannot carry NUL; keep the command line short.
      if (text.empty() || text.size() > 200 || text.find('\0') != std::string::npos) continue;
      Result r =
          run_hk("tokenize --model " + quote(fixture(name)) + " --text " + quote(text) + " --json");
      ASSERT_EQ(r.status, 0) << r.err;
      nlohmann::json out = nlohmann::json::parse(r.out);
      EXPECT_EQ(out["ids"], c["ids"]) << name << ": " << text;
      EXPECT_EQ(out["decoded"], c["decoded"]) << name << ": " << text;
      if (++checked == wanted) break;
    }
    EXPECT_EQ(checked, wanted);
  }
}

TEST(TokenizeCli, DecodesIdsAndAddsSpecialTokens) {
  nlohmann::json c = expected_cases("llama3")[10];
  std::string ids;
  for (const auto& id : c["ids"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
  Result r = run_hk("tokenize --model " + quote(fixture("llama3")) + " --ids " + ids + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["decoded"], c["decoded"]);

  r = run_hk("tokenize --model " + quote(fixture("llama3")) + " --text " +
             quote(c["text"].get<std::string>()) + " --add-special-tokens --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], c["ids_with_special_tokens"]);
}

TEST(TokenizeCli, BadInputExitsWithOneSentence) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {"tokenize --model /nonexistent/model --text hi", "/nonexistent/model/tokenizer.json"},
           {"tokenize --model " + quote(fixture("qwen2")) + " --ids 1,99999999", "99999999"},
           {"tokenize --model " + quote(fixture("qwen2")) + " --ids 1,x", "--ids"},
           {"tokenize --model " + quote(fixture("qwen2")), "--text"},
           {"tokenize --model " + quote(env_or("HK_SOURCE_DIR", ".") + "/tests/fixtures") +
                " --text hi",
            "tokenizer.json"},
       }) {
    Result r = run_hk(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << " → " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // A corrupt tokenizer.json names the file and the problem.
  std::string dir = ::testing::TempDir() + "/hk_tokenize_cli_bad";
  ASSERT_EQ(std::system(("mkdir -p " + quote(dir)).c_str()), 0);
  std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "Unigram", "vocab": []}})";
  Result r = run_hk("tokenize --model " + quote(dir) + " --text hi --json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("Unigram"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir + "/tokenizer.json"), std::string::npos) << r.err;
}

// A copy of the tiny Qwen3 model whose tokenizer.json is `tokenizer` (its own files otherwise).
std::string model_with_tokenizer(const std::string& name, const std::string& tokenizer) {
  const std::string model = env_or("HK_SOURCE_DIR", ".") + "/tests/fixtures/models/qwen3-tiny";
  const std::string dir = ::testing::TempDir() + "/" + name;
  EXPECT_EQ(std::system(
                ("rm -rf " + quote(dir) + " && cp -r " + quote(model) + " " + quote(dir)).c_str()),
            0);
  std::ofstream(dir + "/tokenizer.json") << tokenizer;
  return dir;
}

TEST(TokenizeCli, GenerateWithIdsSurvivesATokenizerItCannotLoad) {
  // Issue 12: a decoder Sequence nested 40,000 deep crashed even `hk generate --ids`. Now the
  // tokenizer is refused with a sentence, and --ids (which needs no tokenizer) still generates.
  std::string deep;
  for (int i = 0; i < 40000; ++i) deep += R"({"type": "Sequence", "decoders": [)";
  deep += R"({"type": "Fuse"})";
  for (int i = 0; i < 40000; ++i) deep += "]}";
  std::ifstream in(env_or("HK_SOURCE_DIR", ".") +
                   "/tests/fixtures/models/qwen3-tiny/tokenizer.json");
  std::ostringstream original;
  original << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(original.str());
  j["decoder"] = nullptr;
  std::string text = j.dump();
  const size_t at = text.find("\"decoder\":null");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 14, "\"decoder\":" + deep);
  const std::string dir = model_with_tokenizer("hk_generate_deep_tokenizer", text);

  Result r = run_hk("generate --model " + quote(dir) + " --ids 1,2,3 --max-new-tokens 3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("hk: warning:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nested more than 32 deep"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("printing token ids only"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 2) << r.out;  // 3 new ids
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.back(), '\n');

  r = run_hk("generate --model " + quote(dir) + " --ids 1,2,3 --max-new-tokens 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].size(), 2u);

  // --prompt needs the tokenizer: that stays an error, with the same sentence.
  r = run_hk("generate --model " + quote(dir) + " --prompt hi --max-new-tokens 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("nested more than 32 deep"), std::string::npos) << r.err;

  // And hk tokenize refuses it in one sentence.
  r = run_hk("tokenize --model " + quote(dir) + " --text hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("nested more than 32 deep"), std::string::npos) << r.err;
}

TEST(TokenizeCli, GenerateOnAMissingModelDirectorySaysSo) {
  for (const char* input : {"--prompt hi", "--ids 1,2"}) {
    Result r = run_hk(std::string("generate --model /nonexistent/model ") + input);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  }
}

}  // namespace
