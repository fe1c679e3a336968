// hk/version.h — the library version, for `hk --version` and kernel build provenance.
#pragma once

namespace hk {
const char* version_string();  // e.g. "0.1.0"
}  // namespace hk
