// Mode validation, names and the fallback chains of hk/mode.h.
#include "hk/mode.h"

#include <algorithm>
#include <cctype>

#include "hk/error.h"

namespace hk {

void validate_mode(Mode mode) {
  if (has(mode, Mode::Fallback))
    throw InvalidArgument("Mode::Fallback is a mapping key, not a mode to kernelize with");
  const bool inference = has(mode, Mode::Inference), training = has(mode, Mode::Training);
  if (inference && training)
    throw InvalidArgument(
        "kernelize: Inference and Training are exclusive; use Mode::Inference or Mode::Training "
        "(optionally | Mode::Capture)");
  if (!inference && !training)
    throw InvalidArgument(
        "kernelize: the mode must include Inference or Training (Capture only qualifies one of "
        "them)");
}

std::vector<Mode> fallback_chain(Mode mode) {
  validate_mode(mode);
  const Mode I = Mode::Inference, T = Mode::Training, C = Mode::Capture;
  if (mode == I) return {I, I | C, T, T | C, Mode::Fallback};
  if (mode == (I | C)) return {I | C, T | C, Mode::Fallback};
  if (mode == T) return {T, T | C, Mode::Fallback};
  return {T | C, Mode::Fallback};
}

std::string mode_name(Mode mode) {
  if (mode == Mode::Fallback) return "fallback";
  std::string s = has(mode, Mode::Inference)  ? "inference"
                  : has(mode, Mode::Training) ? "training"
                                              : "";
  if (has(mode, Mode::Capture)) s += s.empty() ? "capture" : "|capture";
  return s.empty() ? "none" : s;
}

Mode parse_mode(std::string_view text) {
  Mode mode = Mode::None;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    if (word == "inference")
      mode = mode | Mode::Inference;
    else if (word == "training")
      mode = mode | Mode::Training;
    else if (word == "capture")
      mode = mode | Mode::Capture;
    else
      throw InvalidArgument("unknown mode '" + word +
                            "'; use inference or training, optionally with ,capture");
    word.clear();
  };
  for (char c : text) {
    if (c == ',' || c == '|' || c == '+')
      flush();
    else if (!std::isspace(static_cast<unsigned char>(c)))
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  flush();
  validate_mode(mode);
  return mode;
}

}  // namespace hk
