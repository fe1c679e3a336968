// hk/mode.h — kernelize modes and their fallback chains.
//
// A mode says what the model is about to do: Inference or Training (exclusive), optionally with
// Capture (CUDA-graph safe: no host sync, no allocation — hk's counterpart of the kernels
// library's TORCH_COMPILE). A mapping may name different kernels per mode; lookup walks the
// chain below and ends at the mode-independent "fallback" entry:
//   I → I|C → T → T|C → fallback      I|C → I|C → T|C → fallback
//   T → T → T|C → fallback            T|C → T|C → fallback
// This header only defines the values and the chains; kernelize applies them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hk {

enum class Mode : uint32_t {
  None = 0,
  Inference = 1,
  Training = 2,
  Capture = 4,
  Fallback = 8,  // mapping key only: the entry used when no mode-specific entry applies
};

constexpr Mode operator|(Mode a, Mode b) {
  return static_cast<Mode>(static_cast<uint32_t>(a) | static_cast<uint32_t>(b));
}
constexpr Mode operator&(Mode a, Mode b) {
  return static_cast<Mode>(static_cast<uint32_t>(a) & static_cast<uint32_t>(b));
}
constexpr bool has(Mode set, Mode flag) {
  return (set & flag) == flag && flag != Mode::None;
}

// Throws InvalidArgument for Inference|Training, for Capture alone, for None and for Fallback.
void validate_mode(Mode mode);
// The lookup chain for `mode` (validated), ending with Mode::Fallback.
std::vector<Mode> fallback_chain(Mode mode);
// "inference", "training", "inference|capture", "training|capture", "fallback".
std::string mode_name(Mode mode);
// Parses "inference", "training", "inference,capture", "training|capture" (case-insensitive).
Mode parse_mode(std::string_view text);

}  // namespace hk
