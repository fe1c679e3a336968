// PCRE2 wrapper for the tokenizer's split patterns. The reference (Hugging Face tokenizers) runs
// these patterns with Oniguruma; PCRE2 in UTF + UCP mode agrees on \p{..}, classes and
// look-ahead, but its \s leaves out U+0085 (NEL), so \s / \S are widened here before compiling.
// Patterns are compiled (and JIT-compiled when available) once per tokenizer; matching allocates
// its match data per call so one Regex can serve several threads.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include "hk/error.h"

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

// Oniguruma's \s is the White_Space property; PCRE2 UCP's is Z + the ASCII spaces, i.e. the same
// minus U+0085. Rewrites \s and \S (outside classes) and \s (inside classes) to include it.
std::string widen_space_classes(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[++i];
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
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
  std::string source = literal ? pattern : widen_space_classes(pattern);
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
