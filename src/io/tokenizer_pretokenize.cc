// Pre-tokenization: cuts normalized text into the pieces that BPE merges within. Mirrors the
// reference's Split (every SplitDelimiterBehavior, invert) and ByteLevel (prefix space, GPT-2
// regex) pre-tokenizers, piece by piece. Empty matches take part in the split behaviours (they
// can separate pieces) and empty pieces are dropped at the end, as in the reference. The
// byte→character mapping of ByteLevel is applied by the BPE model, which works on raw bytes.
#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

struct Span {
  size_t begin, end;
  bool is_match;
};

// Matches and the gaps between them, covering all of `text` (the reference's find_matches).
std::vector<Span> find_spans(const Regex& regex, std::string_view text, bool invert) {
  std::vector<Span> spans;
  size_t previous = 0;
  regex.for_each_match(text, [&](size_t b, size_t e) {
    if (previous != b) spans.push_back({previous, b, invert});
    spans.push_back({b, e, !invert});
    previous = e;
  });
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});
  return spans;
}

// Applies the delimiter behaviour (the reference's NormalizedString::split) to the spans.
std::vector<Span> apply_behavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      return spans;
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) out.push_back(s);
      return out;
    case SplitBehavior::MergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      return out;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty())
          out.back().begin = it->begin;
        else
          out.push_back({it->begin, it->end, false});
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::Contiguous:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].is_match == previous_match)
          out.back().end = spans[i].end;
        else
          out.push_back({spans[i].begin, spans[i].end, false});
        previous_match = spans[i].is_match;
      }
      return out;
  }
  return spans;
}

void split_each(const std::vector<std::string>& in, std::vector<std::string>& out,
                const Regex& regex, SplitBehavior behavior, bool invert) {
  out.clear();
  for (const std::string& piece : in) {
    for (const Span& s : apply_behavior(find_spans(regex, piece, invert), behavior))
      if (s.end > s.begin) out.emplace_back(piece, s.begin, s.end - s.begin);
  }
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.emplace_back(text);
  std::vector<std::string> next;
  for (const SplitStep& step : steps) {
    split_each(pieces, next, *step.regex, step.behavior, step.invert);
    pieces.swap(next);
  }
  if (add_prefix_space)
    for (std::string& piece : pieces)
      if (piece.empty() || piece[0] != ' ') piece.insert(piece.begin(), ' ');
  if (byte_level_regex) {
    split_each(pieces, next, *byte_level_regex, SplitBehavior::Isolated, false);
    pieces.swap(next);
  }
}

}  // namespace hk::tok
