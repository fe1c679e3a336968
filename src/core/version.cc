#include "hk/version.h"

namespace hk {
const char* version_string() { return HK_VERSION_STRING; }
}  // namespace hk
