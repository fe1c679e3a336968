// The Llama-family tokenizer.json layouts against the reference: SentencePiece-style files
// (Prepend/Replace normalizers, Metaspace, byte_fallback, fuse_unk, unk, the ByteFallback / Fuse /
// Replace / Strip / Metaspace decoders), the file Transformers 5 writes for LlamaTokenizer, a
// byte-level file with byte_fallback and a Sequence decoder, NFKC, and small variants for each
// option — ids, ids with the template and decodings from Hugging Face `tokenizers`
// (tools/fixtures/make_tokenizer_fixture_layouts.py). Also the nesting bound on Sequences.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hk/error.h"
#include "hk/tokenizer.h"
#include "io/tokenizer_internal.h"
#include "tokenizer_test_util.h"

namespace hk {
namespace {

using tokenizer_test::fixture_dir;
using tokenizer_test::ids_of;
using tokenizer_test::read_text;

// The reference's decoding; null where the reference panics (Strip cutting past a short token's
// ends), for which hk returns the empty string.
std::string decoded_of(const nlohmann::json& j) {
  return j.is_null() ? std::string() : j.get<std::string>();
}

// Compares every case of one fixture; returns the number of cases checked.
size_t expect_cases(const Tokenizer& tok, const nlohmann::json& cases, const std::string& name) {
  size_t n = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::vector<int64_t> ids = ids_of(c["ids"]);
    EXPECT_EQ(tok.encode(text), ids) << name << ": " << text;
    EXPECT_EQ(tok.encode(text, true), ids_of(c["ids_with_special_tokens"])) << name << ": " << text;
    EXPECT_EQ(tok.decode(ids), decoded_of(c["decoded"])) << name << ": " << text;
    EXPECT_EQ(tok.decode(ids, true), decoded_of(c["decoded_skip_special"])) << name << ": " << text;
    ++n;
  }
  return n;
}

class Layout : public ::testing::TestWithParam<std::string> {};

TEST_P(Layout, IdsAndDecodingMatchTokenizersLibrary) {
  const std::string dir = fixture_dir() + "/" + GetParam();
  Tokenizer tok = Tokenizer::from_pretrained(dir);
  const nlohmann::json exp = nlohmann::json::parse(read_text(dir + "/expected.json"));
  EXPECT_EQ(tok.vocab_size(), exp["vocab_size"].get<int64_t>());
  EXPECT_GT(expect_cases(tok, exp["cases"], GetParam()), 100u);
}

INSTANTIATE_TEST_SUITE_P(Llama, Layout,
                         ::testing::Values("llama2", "llama_hf5", "smollm", "mistral"));

TEST(TokenizerLayouts, VariantsMatchTokenizersLibrary) {
  auto variants = nlohmann::json::parse(read_text(fixture_dir() + "/layout_variants.json"));
  ASSERT_GE(variants.size(), 15u);
  for (const auto& v : variants) {
    Tokenizer tok = Tokenizer::from_json(v["tokenizer"].dump(), v["name"].get<std::string>());
    expect_cases(tok, v["cases"], v["name"].get<std::string>());
  }
}

TEST(TokenizerLayouts, ByteFallbackAndUnknownsAsTheReference) {
  // Llama 2's layout: characters outside the vocabulary become their UTF-8 bytes' <0xXX>
  // tokens, and decoding joins those bytes back into the character.
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/llama2/tokenizer.json");
  auto e4 = tok.token_to_id("<0xE4>"), b8 = tok.token_to_id("<0xB8>"),
       x80 = tok.token_to_id("<0x80>");
  ASSERT_TRUE(e4 && b8 && x80);
  EXPECT_EQ(tok.decode({*e4, *b8, *x80}), "一");
  // An incomplete sequence is one U+FFFD per byte (ByteFallback), not one per run.
  EXPECT_EQ(tok.decode({*e4, *b8}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok.bos_id(), tok.token_to_id("<s>"));
  EXPECT_EQ(tok.encode("hi", true).front(), *tok.token_to_id("<s>"));
}

TEST(TokenizerLayouts, TransformersLlamaTokenizerConfigNamesTheSpecials) {
  // The Transformers 5 file has a template without specials; tokenizer_config.json names them.
  Tokenizer tok = Tokenizer::from_pretrained(fixture_dir() + "/llama_hf5");
  EXPECT_EQ(tok.bos_id(), tok.token_to_id("<s>"));
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("</s>"));
  EXPECT_EQ(tok.encode("hello", true), tok.encode("hello"));
}

TEST(TokenizerLayouts, NfkcMatchesTokenizersLibrary) {
  // Every code point whose NFKC differs from its NFC in the reference, and mark sequences.
  auto cases = nlohmann::json::parse(read_text(fixture_dir() + "/nfkc_expected.json"));
  ASSERT_GT(cases.size(), 3000u);
  size_t mismatches = 0;
  for (const auto& c : cases) {
    const std::string in = c[0], out = c[1];
    const std::string got = tok::nfkc(in);
    if (got != out && ++mismatches <= 20)
      ADD_FAILURE() << "NFKC of " << nlohmann::json(in).dump() << ": got "
                    << nlohmann::json(got).dump() << ", reference " << nlohmann::json(out).dump();
  }
  EXPECT_EQ(mismatches, 0u);
  // And NFC's cases are NFKC's when the text has no compatibility characters.
  EXPECT_EQ(tok::nfkc("Cafe\xCC\x81"), "Caf\xC3\xA9");
  EXPECT_EQ(tok::nfkc("plain ascii"), "plain ascii");
}

// A {"type": "Sequence", key: [...]} nested `depth` deep around `leaf`, built as text: building it
// with nlohmann and dumping it would recurse as deep as the input.
std::string nested(const std::string& key, const std::string& leaf, int depth) {
  std::string open, close;
  for (int i = 0; i < depth; ++i) {
    open += R"({"type": "Sequence", ")" + key + R"(": [)";
    close += "]}";
  }
  return open + leaf + close;
}

std::string with_part(const std::string& part, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(read_text(fixture_dir() + "/llama2/tokenizer.json"));
  j[part] = nullptr;
  std::string text = j.dump();
  const std::string needle = "\"" + part + "\":null";
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos);
  return text.replace(at, needle.size(), "\"" + part + "\":" + value);
}

TEST(TokenizerLayouts, DeeplyNestedSequencesAreRefusedNotACrash) {
  // Issue 12: a normalizer or decoder Sequence nested ~40,000 deep used to overflow the stack.
  struct Part {
    const char* part;
    const char* key;
    const char* leaf;
  };
  for (const Part& p :
       {Part{"normalizer", "normalizers", R"({"type": "NFC"})"},
        Part{"decoder", "decoders", R"({"type": "Fuse"})"},
        Part{"pre_tokenizer", "pretokenizers", R"({"type": "Metaspace", "replacement": "▁"})"},
        Part{"post_processor", "processors", R"({"type": "ByteLevel"})"}}) {
    try {
      Tokenizer::from_json(with_part(p.part, nested(p.key, p.leaf, 40000)), "deep.json");
      ADD_FAILURE() << p.part << ": a 40,000-deep Sequence was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("deep.json"), std::string::npos) << what;
      EXPECT_NE(what.find(p.part), std::string::npos) << what;
      EXPECT_NE(what.find("nested more than 32 deep"), std::string::npos) << what;
    }
    // Nesting within the bound still works.
    Tokenizer ok = Tokenizer::from_json(with_part(p.part, nested(p.key, p.leaf, 8)), "ok.json");
    EXPECT_FALSE(ok.encode("hello").empty()) << p.part;
  }
}

void expect_rejected(const std::string& part, const std::string& value, const std::string& needle) {
  try {
    Tokenizer::from_json(with_part(part, value), "broken.json");
    ADD_FAILURE() << "accepted " << part << " = " << value;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerLayouts, MalformedPartsAreRefusedByName) {
  expect_rejected("pre_tokenizer", R"({"type": "Metaspace", "replacement": "ab"})",
                  "one character");
  expect_rejected("pre_tokenizer", R"({"type": "Metaspace", "replacement": "▁",
                  "prepend_scheme": "sometimes"})",
                  "sometimes");
  expect_rejected("pre_tokenizer", R"({"type": "Metaspace", "replacement": "▁",
                  "add_prefix_space": false})",
                  "add_prefix_space");
  expect_rejected("decoder", R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})",
                  "start");
  expect_rejected("decoder", R"({"type": "Strip", "content": " ", "start": 1})", "stop");
  expect_rejected("decoder", R"({"type": "Replace", "pattern": {"String": "a"}})", "content");
  expect_rejected("decoder", R"({"type": "CTC"})", "CTC");
  expect_rejected("normalizer", R"({"type": "Lowercase"})", "Lowercase");
  expect_rejected("normalizer", R"({"type": "Replace", "pattern": {"Regex": "("}, "content": ""})",
                  "normalizer");
  expect_rejected("normalizer", R"({"type": "Prepend"})", "prepend");
  expect_rejected("normalizer", R"({"type": "Sequence", "normalizers": [null]})", "null");
}

TEST(TokenizerLayouts, SentencePieceStyleEncodesQuickly) {
  // No pre-tokenizer: each segment is one piece, so the merge heap and the cache (keyed by
  // piece; long pieces bypass it) must keep this O(n log n).
  Tokenizer tok = Tokenizer::from_file(fixture_dir() + "/llama2/tokenizer.json");
  const nlohmann::json exp =
      nlohmann::json::parse(read_text(fixture_dir() + "/llama2/expected.json"));
  std::string sample;
  for (const auto& c : exp["cases"]) sample += c["text"].get<std::string>();
  std::string text;
  while (text.size() < 100 * 1024) text += sample;
  auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> ids = tok.encode(text);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_LT(seconds, 2.0) << "encoding " << text.size() << " bytes took " << seconds << " s";
  std::cout << "llama2 layout: encode of " << text.size() << " bytes: " << seconds * 1e3 << " ms\n";
}

}  // namespace
}  // namespace hk
