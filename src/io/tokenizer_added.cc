// Added-token matching: splits text around the tokenizer's added tokens before anything else
// runs, like the reference's AddedVocabulary::find_matches. Matches are leftmost-longest and
// non-overlapping; a single_word token that touches a word character on either side is skipped
// (and the scan resumes after it, as the reference's non-overlapping match iterator does);
// lstrip/rstrip absorb the white space around a match into the token — without moving the scan,
// so an added token made of white space right after an rstrip token is emitted as well, exactly
// as the reference does.
#include <algorithm>
#include <cstring>

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

// Rust's char::is_alphanumeric (Alphabetic or a numeric category): the reference's "word" test
// for single_word tokens. PCRE2 knows both properties.
bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  static const Regex alphanumeric(R"([\p{Alphabetic}\p{N}])", false);
  std::string one;
  append_utf8(one, cp);
  bool found = false;
  alphanumeric.for_each_match(one, [&](size_t, size_t) { found = true; });
  return found;
}

uint32_t last_code_point(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  uint32_t cp = 0;
  size_t j = i;
  return next_code_point(s, j, cp) ? cp : 0;
}

uint32_t first_code_point(std::string_view s) {
  size_t i = 0;
  uint32_t cp = 0;
  return next_code_point(s, i, cp) ? cp : 0;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens)
    : tokens_(std::move(tokens)) {
  for (const AddedToken* t : tokens_)
    if (!t->matched().empty())
      by_first_byte_[static_cast<unsigned char>(t->matched()[0])].push_back(t);
  for (auto& bucket : by_first_byte_)
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->matched().size() > b->matched().size();
    });
}

std::vector<Segment> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Segment> segments;
  size_t consumed = 0;  // end of the last emitted segment
  size_t pos = 0;       // where the non-overlapping scan resumes
  while (pos < text.size()) {
    const AddedToken* found = nullptr;
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[pos])];
    for (const AddedToken* t : bucket) {
      const std::string& m = t->matched();
      if (m.size() <= text.size() - pos &&
          std::memcmp(text.data() + pos, m.data(), m.size()) == 0) {
        found = t;
        break;
      }
    }
    if (!found) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + found->matched().size();
    pos = stop;
    if (found->single_word) {
      bool space_before = start == 0 || !is_word_char(last_code_point(text.substr(0, start)));
      bool space_after = stop == text.size() || !is_word_char(first_code_point(text.substr(stop)));
      if (!space_before || !space_after) continue;
    }
    if (found->lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t b = s - 1;
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        size_t j = b;
        uint32_t cp;
        if (!next_code_point(text, j, cp) || !is_white_space(cp)) break;
        s = b;
      }
      // White space an earlier match already took stays with it.
      start = std::max(s, consumed);
    }
    if (found->rstrip) {
      size_t j = stop;
      uint32_t cp;
      while (j < text.size()) {
        size_t k = j;
        if (!next_code_point(text, k, cp) || !is_white_space(cp)) break;
        j = k;
      }
      // The scan still resumes at the token's own end: like the reference, a later added token
      // inside the stripped white space is matched too (the two then overlap).
      stop = j;
    }
    start = std::min(start, stop);
    if (consumed < start) segments.push_back({consumed, start, -1});
    segments.push_back({start, stop, found->id});
    consumed = stop;
  }
  if (consumed < text.size()) segments.push_back({consumed, text.size(), -1});
  return segments;
}

}  // namespace hk::tok
