// UTF-8 helpers and GPT-2's byte↔unicode table for the byte-level BPE tokenizer. The table maps
// every byte to a printable character so that vocabularies can be stored as text; decoding
// reverses it. Invalid UTF-8 is replaced exactly as Rust's from_utf8_lossy does (one U+FFFD per
// maximal invalid subpart), because the reference decoder uses that function.
#include <array>

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

// Valid range of the second byte for a lead byte (Unicode Table 3-7), 0 length when invalid.
struct LeadInfo {
  int length;
  unsigned char lo, hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b >= 0xE1 && b <= 0xEC) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xEE && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the valid sequence at s[i] (> 0), or minus the length of its maximal invalid subpart.
int sequence_at(std::string_view s, size_t i, uint32_t* cp) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    if (cp) *cp = b;
    return 1;
  }
  LeadInfo info = lead_info(b);
  if (info.length == 0) return -1;
  uint32_t value = b & (0xFF >> (info.length + 1));
  for (int k = 1; k < info.length; ++k) {
    if (i + k >= s.size()) return -k;
    auto c = static_cast<unsigned char>(s[i + k]);
    unsigned char lo = k == 1 ? info.lo : 0x80, hi = k == 1 ? info.hi : 0xBF;
    if (c < lo || c > hi) return -k;
    value = (value << 6) | (c & 0x3F);
  }
  if (cp) *cp = value;
  return info.length;
}

std::array<int, 0x200> make_unicode_to_byte() {
  std::array<int, 0x200> table;
  table.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[printable ? b : 256 + extra++] = b;
  }
  return table;
}

const std::array<int, 0x200>& unicode_to_byte_table() {
  static const std::array<int, 0x200> table = make_unicode_to_byte();
  return table;
}

}  // namespace

bool next_code_point(std::string_view s, size_t& i, uint32_t& cp) {
  int n = sequence_at(s, i, &cp);
  if (n <= 0) return false;
  i += n;
  return true;
}

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int n = sequence_at(s, i, nullptr);
    if (n <= 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    int n = sequence_at(bytes, i, nullptr);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += -n;
    }
  }
  return out;
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x7F) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    const auto& reverse = unicode_to_byte_table();
    for (uint32_t cp = 0; cp < reverse.size(); ++cp)
      if (reverse[cp] >= 0) append_utf8(t[reverse[cp]], cp);
    return t;
  }();
  return table;
}

int unicode_to_byte(uint32_t cp) {
  return cp < 0x200 ? unicode_to_byte_table()[cp] : -1;
}

void append_token_bytes(std::string& out, std::string_view token) {
  size_t start = out.size();
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    int byte = next_code_point(token, i, cp) ? unicode_to_byte(cp) : -1;
    if (byte < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out += static_cast<char>(byte);
  }
}

}  // namespace hk::tok
