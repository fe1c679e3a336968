// The normalizer chain of tokenizer.json (NFC, NFKC, Prepend, Replace; Sequences flattened at
// load), applied to each segment of the input between added tokens, as the reference does. The
// reference also tracks offsets through every step; hk has no offsets, only the text.
#include "io/tokenizer_internal.h"

namespace hk::tok {

std::string replace_all(const Regex& pattern, std::string_view text, std::string_view content) {
  if (text.empty()) return std::string();
  std::string out;
  out.reserve(text.size());
  size_t previous = 0;
  pattern.for_each_match(text, [&](size_t b, size_t e) {
    out.append(text.substr(previous, b - previous));
    out.append(content);
    previous = e;
  });
  out.append(text.substr(previous));
  return out;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::Kind::NFC:
        s = nfc(s);
        break;
      case NormalizerStep::Kind::NFKC:
        s = nfkc(s);
        break;
      case NormalizerStep::Kind::Prepend:
        if (!s.empty()) s.insert(0, step.text);
        break;
      case NormalizerStep::Kind::Replace:
        s = replace_all(*step.pattern, s, step.text);
        break;
    }
  }
  return s;
}

}  // namespace hk::tok
