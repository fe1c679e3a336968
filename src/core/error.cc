// Check-failure helper behind HK_CHECK: formats the message, keeps the source location for
// debugging builds only (users act on the sentence, not on our line numbers). Also the escaping
// of untrusted text that messages quote.
#include "hk/error.h"

#include <cstdio>

namespace hk {

std::string escape_control_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace hk

namespace hk::detail {

void throw_check_failure(const char* file, int line, const std::string& message) {
#ifndef NDEBUG
  throw InvalidArgument(message + " [" + file + ":" + std::to_string(line) + "]");
#else
  (void)file;
  (void)line;
  throw InvalidArgument(message);
#endif
}

}  // namespace hk::detail
