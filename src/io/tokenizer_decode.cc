// The decoder chain of tokenizer.json: each step maps the list of token strings to a new list,
// as the reference's decode_chain does, and the final list is concatenated. ByteLevel turns the
// byte-level characters back into bytes (invalid UTF-8 → U+FFFD, one string); ByteFallback joins
// runs of <0xXX> tokens into their UTF-8 text (a run that is not valid UTF-8 → one U+FFFD per
// byte); Fuse concatenates; Replace substitutes a pattern in every token; Strip removes up to
// start/stop copies of a character from each token's ends; Metaspace turns '▁' into spaces
// (dropping it in the first token unless the scheme is "never"). Without a decoder the tokens are
// joined with spaces, like the reference.
#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xXX>" token. Like the reference (Rust's u8::from_str_radix on the two
// characters), lower-case digits and a '+' sign before a single digit are accepted too.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  if (token[3] == '+') return hex_digit(token[4]);
  const int hi = hex_digit(token[3]), lo = hex_digit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    if (find_invalid_utf8(bytes) == std::string::npos)
      out.push_back(bytes);
    else
      for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
    bytes.clear();
  };
  for (std::string& token : tokens) {
    const int b = fallback_byte(token);
    if (b >= 0) {
      bytes += static_cast<char>(b);
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  return out;
}

std::vector<std::string> byte_level(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) append_token_bytes(bytes, token);
  return {utf8_lossy(bytes)};
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    if (!next_code_point(s, i, cp)) {
      cp = 0xFFFD;
      ++i;
    }
    cps.push_back(cp);
  }
  return cps;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string s;
  for (size_t i = begin; i < end; ++i) append_utf8(s, cps[i]);
  return s;
}

// The reference panics when the cuts cross (e.g. start 2, stop 3 on "  "); hk gives "".
std::string strip(const std::string& token, uint32_t content, size_t start, size_t stop) {
  const std::vector<uint32_t> cps = code_points(token);
  size_t start_cut = 0;
  for (size_t i = 0; i < cps.size() && i < start && cps[i] == content; ++i) start_cut = i + 1;
  size_t stop_cut = cps.size();
  for (size_t i = 0; i < stop && i < cps.size() && cps[cps.size() - 1 - i] == content; ++i)
    stop_cut = cps.size() - 1 - i;
  if (start_cut >= stop_cut) return std::string();
  return from_code_points(cps, start_cut, stop_cut);
}

std::string metaspace(const std::string& token, const std::string& replacement, bool drop) {
  std::string out;
  out.reserve(token.size());
  for (size_t at = 0; at < token.size();) {
    if (token.compare(at, replacement.size(), replacement) == 0) {
      if (!drop) out += ' ';
      at += replacement.size();
    } else {
      out += token[at++];
    }
  }
  return out;
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!present) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::ByteLevel:
        tokens = byte_level(tokens);
        break;
      case DecoderStep::Kind::ByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case DecoderStep::Kind::Fuse: {
        std::string fused;
        for (const std::string& t : tokens) fused += t;
        tokens = {fused};
        break;
      }
      case DecoderStep::Kind::Replace:
        for (std::string& t : tokens) t = replace_all(*step.pattern, t, step.text);
        break;
      case DecoderStep::Kind::Strip: {
        const uint32_t content = code_points(step.text).at(0);
        for (std::string& t : tokens) t = strip(t, content, step.start, step.stop);
        break;
      }
      case DecoderStep::Kind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = metaspace(tokens[i], step.text,
                                i == 0 && step.prepend_scheme != PrependScheme::Never);
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace hk::tok
