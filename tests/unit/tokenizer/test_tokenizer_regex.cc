// The split patterns under PCRE2 against the reference's Oniguruma on every code point:
// tests/fixtures/tokenizer/regex_classes.json records, per code point c, how the reference splits
// the probes "x c y", ". c ." and "' c x" with the Qwen2 and Llama 3 patterns. A difference here
// (a Unicode-version gap between the engines, or a \s mismatch) would change ids for text with c.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

std::vector<int> piece_lengths(const PreTokenizer& pre, const std::string& probe) {
  std::vector<std::string> pieces;
  pre.split(probe, true, pieces);
  std::vector<int> lengths;
  for (const std::string& p : pieces) {
    int n = 0;
    for (unsigned char b : p) n += (b & 0xC0) != 0x80;
    lengths.push_back(n);
  }
  return lengths;
}

TEST(TokenizerRegex, EveryCodePointSplitsLikeOniguruma) {
  const char* src = std::getenv("HK_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/tests/fixtures/tokenizer/regex_classes.json");
  ASSERT_TRUE(in);
  nlohmann::json classes = nlohmann::json::parse(in);
  for (const char* name : {"qwen2", "llama3"}) {
    const auto& c = classes[name];
    PreTokenizer pre;
    PreTokenizerStep split;
    split.regex = std::make_shared<const Regex>(c["pattern"].get<std::string>(), false);
    pre.steps.push_back(split);
    size_t checked = 0, mismatches = 0;
    for (const auto& range : c["ranges"]) {
      const auto& expected = c["signatures"][range[2].get<size_t>()];
      for (uint32_t cp = range[0]; cp <= range[1].get<uint32_t>(); ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        std::string ch;
        append_utf8(ch, cp);
        std::vector<std::vector<int>> got = {piece_lengths(pre, "x" + ch + "y"),
                                             piece_lengths(pre, "." + ch + "."),
                                             piece_lengths(pre, "'" + ch + "x")};
        ++checked;
        if (nlohmann::json(got) != expected && ++mismatches <= 10)
          ADD_FAILURE() << name << ": U+" << std::hex << cp << " splits as "
                        << nlohmann::json(got).dump() << ", reference " << expected.dump();
      }
    }
    EXPECT_EQ(checked, 0x110000u - 0x800u) << name;
    EXPECT_EQ(mismatches, 0u) << name;
  }
}

}  // namespace
}  // namespace hk::tok
