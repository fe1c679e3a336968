// libFuzzer target for the tokenizer: the tokenizer.json parser and, through it, encode/decode.
// The first input byte picks the mode:
//   even  the rest is a tokenizer.json; when it loads, a few texts are encoded and every id decoded
//   odd   the rest is text (any bytes) encoded and decoded by a small built-in Qwen2-style
//         tokenizer (all 256 byte tokens, some merges, NFC, added tokens with every flag)
// Only hk::Error may escape the library; anything else (or a sanitizer report) is a bug.
//
// Build and run (a separate clang build; the whole library instrumented):
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DHK_CUDA=OFF -DHK_BUILD_FUZZERS=ON \
//     -DHK_BUILD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
//     -DCMAKE_CXX_FLAGS="-fsanitize=address,fuzzer-no-link" -DCMAKE_C_FLAGS="-fsanitize=address"
//   ninja -C build-fuzz fuzz_tokenizer
//   build-fuzz/tests/unit/tokenizer/fuzz_tokenizer -max_total_time=120 -max_len=8192 \
//     /tmp/tok-corpus tests/unit/tokenizer/fuzz_corpus
// Regressions: put the crashing input in fuzz_corpus/; ctest runs fuzz_tokenizer_corpus on
// every file there.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "hk/error.h"
#include "hk/tokenizer.h"

namespace {

// The built-in tokenizer of the "text" mode: byte tokens in GPT-2 order plus a few merges.
std::string builtin_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  std::vector<std::string> chars;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    uint32_t cp = printable ? b : 256 + extra++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[s] = b;
  }
  nlohmann::json merges = nlohmann::json::array();
  int next = 256;
  for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{{"\xC4\xA0", "t"},
                                                                      {"h", "e"},
                                                                      {"\xC4\xA0t", "he"},
                                                                      {"i", "n"},
                                                                      {"\xC4\xA0", "\xC4\xA0"},
                                                                      {"e", "r"},
                                                                      {"\xC3\x83", "\xC2\xA9"},
                                                                      {"1", "2"},
                                                                      {"12", "3"}}) {
    merges.push_back({a, b});
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  nlohmann::json added = nlohmann::json::array();
  auto add = [&](const char* content, bool special, bool lstrip, bool rstrip, bool single,
                 bool normalized) {
    added.push_back({{"id", next++},
                     {"content", content},
                     {"special", special},
                     {"lstrip", lstrip},
                     {"rstrip", rstrip},
                     {"single_word", single},
                     {"normalized", normalized}});
  };
  add("<|endoftext|>", true, false, false, false, false);
  add("<|im_start|>", true, false, false, false, false);
  add("<mask>", true, true, true, false, false);
  add("word", false, false, false, true, true);
  add("caf\xC3\xA9", false, false, false, false, true);
  nlohmann::json j = nlohmann::json::parse(R"({
    "version": "1.0",
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "behavior": "Isolated", "invert": false, "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": []}}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": true}
  })");
  j["added_tokens"] = added;
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = merges;
  j["post_processor"]["special_tokens"]["<|im_start|>"]["ids"].push_back(next - 4);
  return j.dump();
}

void exercise(const hk::Tokenizer& tok, const std::string& text) {
  try {
    std::vector<int64_t> ids = tok.encode(text, true);
    std::string decoded = tok.decode(ids);
    (void)tok.decode(ids, true);
    (void)decoded;
  } catch (const hk::Error&) {
    // Invalid UTF-8 text is rejected with InvalidArgument: expected.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 1) {
    static const hk::Tokenizer builtin = hk::Tokenizer::from_json(builtin_tokenizer_json());
    exercise(builtin, rest);
    return 0;
  }
  try {
    hk::Tokenizer tok = hk::Tokenizer::from_json(rest, "fuzz/tokenizer.json");
    for (const char* text :
         {"", "Hello world, it's 2026!\n\n  x", "caf\xC3\xA9 e\xCC\x81 \xE5\x86\x85"})
      exercise(tok, text);
    exercise(tok, rest.substr(0, 256));
    int64_t limit = std::min<int64_t>(tok.vocab_size(), 512);
    std::vector<int64_t> ids;
    for (int64_t id = 0; id < limit; ++id)
      if (tok.token_to_id(tok.id_to_token(id)).has_value()) ids.push_back(id);
    (void)tok.decode(ids);
  } catch (const hk::Error&) {
    // Rejected with a message: the expected outcome for most inputs.
  }
  return 0;
}
