// PCRE2 wrapper for the tokenizer's split patterns. The reference (Hugging Face tokenizers) runs
// these patterns with Oniguruma; PCRE2 in UTF + UCP mode agrees on syntax, classes, case folding
// and look-ahead, but not on every code point's class: its \s differs from White_Space (U+0085,
// U+180E) and its Unicode 14 lacks newer letters and numbers. The pattern is rewritten before
// compiling so that \s, \S, \p{L} and \p{N} match what Oniguruma matches (a test checks every
// code point); other properties (\p{Lu}, \w, ...) are left to PCRE2.
// Patterns are compiled (and JIT-compiled when available) once per tokenizer; matching allocates
// its match data per call so one Regex can serve several threads.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <stdexcept>

#include "hk/error.h"

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

// The members of Oniguruma's \s: the Unicode White_Space property (stable since Unicode 4.1).
constexpr const char* kWhiteSpaceMembers =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string range_members(const CodePointRange* ranges, size_t count) {
  std::string out;
  char buf[40];
  for (size_t i = 0; i < count; ++i) {
    if (ranges[i].first == ranges[i].last)
      std::snprintf(buf, sizeof(buf), "\\x{%X}", ranges[i].first);
    else
      std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", ranges[i].first, ranges[i].last);
    out += buf;
  }
  return out;
}

// Rewrites \s, \S (outside classes), \p{L} and \p{N} into explicit classes with Oniguruma's
// membership (see Regex). Other escapes and \S inside a class are left to PCRE2.
std::string translate_for_oniguruma_parity(const std::string& pattern) {
  static const std::string letters = "\\p{L}" + range_members(kNewerLetters, kNewerLettersCount);
  static const std::string numbers = "\\p{N}" + range_members(kNewerNumbers, kNewerNumbersCount);
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[++i];
      std::string_view rest(pattern.data() + i, pattern.size() - i);
      const std::string* property = nullptr;
      if (rest.substr(0, 4) == "p{L}") property = &letters;
      if (rest.substr(0, 4) == "p{N}") property = &numbers;
      if (property) {
        out += in_class ? *property : "[" + *property + "]";
        i += 3;
      } else if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceMembers)
                        : std::string("[") + kWhiteSpaceMembers + "]";
      } else if (n == 'S' && !in_class) {
        out += std::string("[^") + kWhiteSpaceMembers + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      size_t close = pattern.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(pattern, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Regex::Regex(const std::string& pattern, bool literal) : code_(std::make_unique<Code>()) {
  std::string source = literal ? pattern : translate_for_oniguruma_parity(pattern);
  // PCRE2_LITERAL admits UTF but not UCP (irrelevant to a literal anyway).
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options,
                              &error, &offset, nullptr);
  if (!code_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument("regex /" + pattern + "/ does not compile at offset " +
                                std::to_string(offset) + ": " +
                                reinterpret_cast<const char*>(message));
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (code_ && code_->code) pcre2_code_free(code_->code);
}

bool Regex::next_match(std::string_view text, size_t start, size_t& begin, size_t& end) const {
  struct MatchData {
    pcre2_match_data* data;
    ~MatchData() { pcre2_match_data_free(data); }
  } md{pcre2_match_data_create(1, nullptr)};
  if (!md.data) throw std::bad_alloc();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The caller validated the UTF-8 once; skipping PCRE2's check keeps matching linear.
  uint32_t options = PCRE2_NO_UTF_CHECK;
  int rc = pcre2_match(code_->code, subject, text.size(), start, options, md.data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code_->code, subject, text.size(), start, options | PCRE2_NO_JIT, md.data,
                     nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw hk::RuntimeFailure(std::string("splitting text with the tokenizer's pattern failed (") +
                             reinterpret_cast<const char*>(message) +
                             "); split the input into smaller parts");
  }
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.data);
  begin = ovector[0];
  end = ovector[1];
  // \K in a look-behind can report an end before the start; treat that as an empty match.
  if (end < begin) end = begin;
  return true;
}

const std::string& gpt2_pattern() {
  static const std::string pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return pattern;
}

}  // namespace hk::tok
