// Check-failure helper behind HK_CHECK: formats the message, keeps the source location for
// debugging builds only (users act on the sentence, not on our line numbers).
#include "hk/error.h"

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
