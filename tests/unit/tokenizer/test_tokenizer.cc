// Tokenizer tests against the reference: tests/fixtures/tokenizer/<name>/expected.json holds the
// ids and decodings that Hugging Face `tokenizers` produced for the committed tokenizer.json files
// (tools/fixtures/make_tokenizer_fixture.py). Also round trips, special tokens, NFC, errors and
// speed.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "hk/error.h"
#include "hk/tokenizer.h"
#include "tokenizer_test_util.h"

namespace hk {
namespace {

using tokenizer_test::fixture_dir;
using tokenizer_test::ids_of;
using tokenizer_test::read_text;

nlohmann::json expected(const std::string& name) {
  return nlohmann::json::parse(read_text(fixture_dir() + "/" + name + "/expected.json"));
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, IdsAndDecodingMatchTokenizersLibrary) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/" + GetParam() + "/tokenizer.json");
  nlohmann::json exp = expected(GetParam());
  EXPECT_EQ(tok.vocab_size(), exp["vocab_size"].get<int64_t>());
  ASSERT_GT(exp["cases"].size(), 100u);
  for (const auto& c : exp["cases"]) {
    std::string text = c["text"];
    std::vector<int64_t> ids = ids_of(c["ids"]);
    EXPECT_EQ(tok.encode(text), ids) << "text: " << text;
    EXPECT_EQ(tok.encode(text, true), ids_of(c["ids_with_special_tokens"])) << "text: " << text;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>())
        << "text: " << text;
  }
}

TEST_P(Reference, DecodeOfEncodeIsTheText) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/" + GetParam() + "/tokenizer.json");
  const nlohmann::json exp = expected(GetParam());
  for (const auto& c : exp["cases"]) {
    std::string text = c["text"];
    // Every fixture text is already NFC and contains only characters of the byte alphabet,
    // except the <mask> cases of llama3, whose lstrip/rstrip swallow spaces on purpose.
    if (text.find("<mask>") != std::string::npos) continue;
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
}

TEST_P(Reference, RepeatedEncodingUsesTheCacheConsistently) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/" + GetParam() + "/tokenizer.json");
  Tokenizer copy = tok;  // copies share the model and the cache
  const nlohmann::json exp = expected(GetParam());
  for (const auto& c : exp["cases"]) {
    std::string text = c["text"];
    std::vector<int64_t> first = tok.encode(text);
    EXPECT_EQ(copy.encode(text), first);
  }
}

TEST_P(Reference, ConcurrentEncodingGivesTheSameIds) {
  // One tokenizer shared by several threads: the word cache is the only mutable state.
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/" + GetParam() + "/tokenizer.json");
  const nlohmann::json exp = expected(GetParam());
  std::vector<std::pair<std::string, std::vector<int64_t>>> cases;
  for (const auto& c : exp["cases"]) cases.emplace_back(c["text"], ids_of(c["ids"]));
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = t; i < cases.size() + t; ++i) {
          const auto& [text, ids] = cases[i % cases.size()];
          if (tok.encode(text) != ids) ++failures[t];
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Reference, ::testing::Values("qwen2", "llama3", "gpt2"));

TEST(Tokenizer, VariantsMatchTokenizersLibrary) {
  // Small tokenizers for the rarer parts of the format (split behaviours, added-token flags,
  // Bert/Roberta templates, reassigned added-token ids), with the reference's ids.
  auto variants = nlohmann::json::parse(read_text(fixture_dir() + "/variants.json"));
  ASSERT_GE(variants.size(), 6u);
  for (const auto& v : variants) {
    Tokenizer tok = Tokenizer::from_json(v["tokenizer"].dump(), v["name"].get<std::string>());
    for (const auto& c : v["cases"]) {
      std::string text = c["text"];
      std::vector<int64_t> ids = ids_of(c["ids"]);
      EXPECT_EQ(tok.encode(text), ids) << v["name"] << ": " << text;
      EXPECT_EQ(tok.encode(text, true), ids_of(c["ids_with_special_tokens"]))
          << v["name"] << ": " << text;
      EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << v["name"] << ": " << text;
    }
  }
}

TEST(Tokenizer, SpecialTokensQwen) {
  Tokenizer tok = Tokenizer::from_pretrained(fixture_dir() + "/qwen2");
  auto im_start = tok.token_to_id("<|im_start|>");
  auto im_end = tok.token_to_id("<|im_end|>");
  ASSERT_TRUE(im_start && im_end);
  EXPECT_TRUE(tok.is_special(*im_start));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("<think>")));
  EXPECT_EQ(tok.id_to_token(*im_end), "<|im_end|>");
  std::vector<int64_t> ids = tok.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), *im_start);
  EXPECT_EQ(ids.back(), *im_end);
  EXPECT_EQ(tok.decode(ids, true), "user\nhi");
  // Qwen's ByteLevel post-processor adds nothing.
  EXPECT_EQ(tok.encode("hi", true), tok.encode("hi"));
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("<|endoftext|>"));
  EXPECT_FALSE(tok.bos_id().has_value());
}

TEST(Tokenizer, LlamaTemplateAddsBos) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/llama3/tokenizer.json");
  auto bos = tok.token_to_id("<|begin_of_text|>");
  ASSERT_TRUE(bos);
  EXPECT_EQ(tok.bos_id(), bos);
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("<|end_of_text|>"));
  std::vector<int64_t> plain = tok.encode("Hello");
  std::vector<int64_t> with = tok.encode("Hello", true);
  ASSERT_EQ(with.size(), plain.size() + 1);
  EXPECT_EQ(with[0], *bos);
  EXPECT_EQ(tok.encode("", true), std::vector<int64_t>{*bos});
}

TEST(Tokenizer, IgnoreMergesEmitsWholeVocabularyWords) {
  // With ignore_merges a pre-token that is in the vocabulary is one id even if the merges
  // would build it differently; every vocabulary word must therefore encode to itself.
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/llama3/tokenizer.json");
  auto id = tok.token_to_id("Ġkernel");
  ASSERT_TRUE(id);
  EXPECT_EQ(tok.encode(" kernel"), std::vector<int64_t>{*id});
}

TEST(Tokenizer, TokenizerConfigNamesSpecialTokens) {
  std::string dir = ::testing::TempDir() + "/hk_tok_config";
  std::string mk = "mkdir -p '" + dir + "'";
  ASSERT_EQ(std::system(mk.c_str()), 0);
  std::ofstream(dir + "/tokenizer.json") << read_text(fixture_dir() + "/qwen2/tokenizer.json");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": null, "eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>"})";
  Tokenizer tok = Tokenizer::from_pretrained(dir);
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("<|im_end|>"));
  EXPECT_EQ(tok.pad_id(), tok.token_to_id("<|endoftext|>"));
  EXPECT_FALSE(tok.bos_id().has_value());
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<nope>"})";
  EXPECT_THROW(Tokenizer::from_pretrained(dir), InvalidArgument);
}

TEST(Tokenizer, NfcMatchesTokenizersLibrary) {
  // Pairs (input, NFC by the reference's normalizer): every code point the reference changes,
  // every canonical pair, reorderings, Hangul, and blocked / excluded compositions.
  auto cases = nlohmann::json::parse(read_text(fixture_dir() + "/nfc_expected.json"));
  ASSERT_GT(cases.size(), 1000u);
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/qwen2/tokenizer.json");
  size_t mismatches = 0;
  for (const auto& c : cases) {
    std::string in = c[0], out = c[1];
    // Decoding the ids gives the normalized text back (the byte-level vocabulary is lossless).
    std::string got = tok.decode(tok.encode(in));
    if (got != out && ++mismatches <= 20)
      ADD_FAILURE() << "NFC of " << nlohmann::json(in).dump() << ": got "
                    << nlohmann::json(got).dump() << ", reference " << nlohmann::json(out).dump();
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Tokenizer, DecodeReplacesInvalidUtf8LikeTheReference) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/gpt2/tokenizer.json");
  // Byte tokens: 'Ã' stands for byte 0xC3, '©' for 0xA9.
  auto c3 = tok.token_to_id("Ã"), a9 = tok.token_to_id("©"), a = tok.token_to_id("a");
  ASSERT_TRUE(c3 && a9 && a);
  EXPECT_EQ(tok.decode({*c3, *a9}), "é");
  EXPECT_EQ(tok.decode({*c3, *a}),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(tok.decode({*a9, *a9, *a}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");
}

TEST(Tokenizer, UnknownIdsAndInvalidTextAreErrors) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/qwen2/tokenizer.json");
  EXPECT_THROW(tok.decode({1, tok.vocab_size() + 100}), InvalidArgument);
  EXPECT_THROW(tok.decode({-1}), InvalidArgument);
  EXPECT_THROW(tok.id_to_token(1 << 30), InvalidArgument);
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
  EXPECT_THROW(tok.encode("bad \xFF utf8"), InvalidArgument);
  EXPECT_THROW(tok.encode(std::string("trunc \xE4\xB8", 8)), InvalidArgument);
}

// ---- malformed files -------------------------------------------------------------------------

std::string qwen_json() {
  return read_text(fixture_dir() + "/qwen2/tokenizer.json");
}

void expect_rejected(const std::string& text, const std::string& part) {
  try {
    Tokenizer::from_json(text, "broken/tokenizer.json");
    ADD_FAILURE() << "accepted a tokenizer.json with a bad " << part;
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("broken/tokenizer.json"), std::string::npos) << what;
    EXPECT_NE(what.find(part), std::string::npos) << what;
  }
}

nlohmann::json edited(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(qwen_json());
  edit(j);
  return j;
}

TEST(TokenizerErrors, MalformedFilesNameTheFileAndThePart) {
  expect_rejected("{not json", "JSON");
  expect_rejected("[]", "top level");
  expect_rejected(qwen_json().substr(0, 1000), "JSON");
  expect_rejected(edited([](auto& j) { j.erase("model"); }).dump(), "model");
  expect_rejected(edited([](auto& j) { j["model"]["type"] = "WordPiece"; }).dump(), "WordPiece");
  expect_rejected(edited([](auto& j) { j["model"]["byte_fallback"] = "yes"; }).dump(), "model");
  expect_rejected(edited([](auto& j) { j["model"]["unk_token"] = "<nope>"; }).dump(), "unk_token");
  expect_rejected(edited([](auto& j) { j["model"]["dropout"] = 0.1; }).dump(), "dropout");
  expect_rejected(edited([](auto& j) { j["model"]["vocab"] = 3; }).dump(), "model");
  expect_rejected(edited([](auto& j) { j["model"]["vocab"]["x"] = "seven"; }).dump(), "model");
  expect_rejected(edited([](auto& j) { j["model"]["merges"][0] = "onlyone"; }).dump(), "model");
  expect_rejected(edited([](auto& j) {
                    j["model"]["merges"][0] = {"zzzq", "qq"};
                  }).dump(),
                  "not in the vocabulary");
  expect_rejected(edited([](auto& j) { j["model"]["merges"][1] = 5; }).dump(), "merge #1");
  expect_rejected(edited([](auto& j) {
                    j["pre_tokenizer"] = {{"type", "Metaspace"}};
                  }).dump(),
                  "replacement");
  expect_rejected(edited([](auto& j) {
                    j["pre_tokenizer"] = {{"type", "Whitespace"}};
                  }).dump(),
                  "Whitespace");
  expect_rejected(edited([](auto& j) {
                    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
                  }).dump(),
                  "pre_tokenizer");
  expect_rejected(edited([](auto& j) {
                    j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
                  }).dump(),
                  "Sideways");
  expect_rejected(edited([](auto& j) { j["normalizer"] = {{"type", "NFD"}}; }).dump(), "NFD");
  expect_rejected(edited([](auto& j) {
                    j["decoder"] = {{"type", "WordPiece"}};
                  }).dump(),
                  "decoder");
  expect_rejected(edited([](auto& j) {
                    j["post_processor"] = {{"type", "Mystery"}};
                  }).dump(),
                  "Mystery");
  expect_rejected(edited([](auto& j) { j["added_tokens"][0]["id"] = -4; }).dump(), "added_tokens");
  expect_rejected(edited([](auto& j) { j["added_tokens"][0].erase("content"); }).dump(),
                  "added_tokens");
  expect_rejected(edited([](auto& j) { j["model"]["vocab"]["dup"] = 5; }).dump(), "share the id");
  expect_rejected(edited([](auto& j) {
                    j["truncation"] = {{"max_length", 8}};
                  }).dump(),
                  "truncation");
}

TEST(Tokenizer, OptionalPartsMayBeAbsent) {
  // A file without added_tokens, normalizer or post_processor still tokenizes (found by fuzzing:
  // a missing added_tokens list once left the matcher unset).
  nlohmann::json j = nlohmann::json::parse(qwen_json());
  j.erase("added_tokens");
  j.erase("normalizer");
  j.erase("post_processor");
  Tokenizer tok = Tokenizer::from_json(j.dump());
  std::vector<int64_t> ids = tok.encode("hi <|im_end|>", true);
  EXPECT_EQ(tok.decode(ids), "hi <|im_end|>");
  EXPECT_FALSE(tok.token_to_id("<|im_end|>").has_value());
  EXPECT_EQ(tok.vocab_size(), 3000);
}

TEST(TokenizerErrors, MissingFileIsNotFound) {
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), NotFound);
  EXPECT_THROW(Tokenizer::from_pretrained("/nonexistent"), NotFound);
}

TEST(Tokenizer, MergeStringsAndPairsGiveTheSameTokenizer) {
  nlohmann::json pairs = nlohmann::json::parse(qwen_json());
  nlohmann::json strings = pairs;
  for (auto& m : strings["model"]["merges"])
    m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  Tokenizer a = Tokenizer::from_json(pairs.dump()), b = Tokenizer::from_json(strings.dump());
  std::string text = read_text(fixture_dir() + "/../../../README.md");
  EXPECT_EQ(a.encode(text), b.encode(text));
}

TEST(Tokenizer, Encodes100KilobytesWellUnderASecond) {
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/qwen2/tokenizer.json");
  std::string sample;
  const nlohmann::json exp = expected("qwen2");
  for (const auto& c : exp["cases"]) sample += c["text"].get<std::string>();
  ASSERT_FALSE(sample.empty());
  std::string text;
  while (text.size() < 100 * 1024) text += sample;
  // A fresh copy of the file, so the word cache starts empty.
  Tokenizer cold = Tokenizer::from_file(fixture_dir() + "/qwen2/tokenizer.json");
  auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> ids = cold.encode(text);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_LT(seconds, 1.0) << "encoding " << text.size() << " bytes took " << seconds << " s";
  EXPECT_EQ(tok.decode(ids), text);
  std::cout << "encode of " << text.size() << " bytes: " << seconds * 1e3 << " ms\n";
}

}  // namespace
}  // namespace hk
