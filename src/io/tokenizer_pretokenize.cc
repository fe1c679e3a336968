// Pre-tokenization: cuts normalized text into the pieces that BPE merges within. Mirrors the
// reference's Split (every SplitDelimiterBehavior, invert), ByteLevel (prefix space, GPT-2 regex,
// then the byte→character mapping) and Metaspace (' ' → '▁', the prepend schemes, split before
// each '▁') pre-tokenizers, each step applied to every piece of the previous one, in the file's
// order. Empty matches take part in the split behaviours (they can separate pieces) and empty
// pieces are dropped, as in the reference. A piece remembers whether it starts at offset 0 of the
// original text, which Metaspace's "first" scheme asks.
#include <functional>

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

struct Piece {
  std::string text;
  bool at_start;
};

void split_spans(const std::vector<Piece>& in, std::vector<Piece>& out,
                 const std::function<std::vector<Span>(std::string_view)>& spans_of,
                 SplitBehavior behavior) {
  out.clear();
  for (const Piece& piece : in) {
    for (const Span& s : apply_behavior(spans_of(piece.text), behavior))
      if (s.end > s.begin)
        out.push_back(
            {piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
}

// Every occurrence of a non-empty literal, and the gaps (the reference's pattern for a char).
std::vector<Span> literal_spans(std::string_view text, std::string_view literal) {
  std::vector<Span> spans;
  size_t previous = 0;
  for (size_t at = text.find(literal); at != std::string_view::npos;
       at = text.find(literal, at + literal.size())) {
    if (previous != at) spans.push_back({previous, at, false});
    spans.push_back({at, at + literal.size(), true});
    previous = at + literal.size();
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), false});
  return spans;
}

std::string replace_spaces(std::string_view text, const std::string& replacement) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char c : text) {
    if (c == ' ')
      out += replacement;
    else
      out += c;
  }
  return out;
}

void run_step(const PreTokenizerStep& step, std::vector<Piece>& pieces, std::vector<Piece>& next) {
  switch (step.kind) {
    case PreTokenizerStep::Kind::Split:
      split_spans(
          pieces, next, [&](std::string_view t) { return find_spans(*step.regex, t, step.invert); },
          step.behavior);
      pieces.swap(next);
      return;
    case PreTokenizerStep::Kind::ByteLevel: {
      if (step.add_prefix_space)
        for (Piece& piece : pieces)
          if (piece.text[0] != ' ') piece.text.insert(piece.text.begin(), ' ');
      if (step.byte_level_regex) {
        split_spans(
            pieces, next,
            [&](std::string_view t) { return find_spans(*step.byte_level_regex, t, false); },
            SplitBehavior::Isolated);
        pieces.swap(next);
      }
      const auto& chars = byte_to_unicode();
      for (Piece& piece : pieces) {
        std::string mapped;
        mapped.reserve(piece.text.size() * 2);
        for (unsigned char b : piece.text) mapped += chars[b];
        piece.text.swap(mapped);
      }
      return;
    }
    case PreTokenizerStep::Kind::Metaspace: {
      for (Piece& piece : pieces) {
        piece.text = replace_spaces(piece.text, step.replacement);
        const bool starts_with_replacement =
            piece.text.compare(0, step.replacement.size(), step.replacement) == 0;
        const bool prepend = !starts_with_replacement &&
                             (step.prepend_scheme == PrependScheme::Always ||
                              (step.prepend_scheme == PrependScheme::First && piece.at_start));
        if (prepend) piece.text.insert(0, step.replacement);
      }
      if (step.split) {
        split_spans(
            pieces, next, [&](std::string_view t) { return literal_spans(t, step.replacement); },
            SplitBehavior::MergedWithNext);
        pieces.swap(next);
      }
      return;
    }
  }
}

}  // namespace

void PreTokenizer::split(std::string_view text, bool at_start,
                         std::vector<std::string>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  std::vector<Piece> current{{std::string(text), at_start}}, next;
  for (const PreTokenizerStep& step : steps) {
    run_step(step, current, next);
    if (current.empty()) return;
  }
  pieces.reserve(current.size());
  for (Piece& piece : current) pieces.push_back(std::move(piece.text));
}

}  // namespace hk::tok
