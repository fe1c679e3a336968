// Unicode Normalization Forms C and KC for the tokenizer's NFC / NFKC normalizers (Qwen2/Qwen3
// files use NFC): canonical (KC: compatibility) decomposition, canonical ordering of combining
// marks, then canonical composition, per UAX #15, with Hangul handled algorithmically. The tables
// are generated from Python's unicodedata (see tokenizer_nfc_tables.cc); the reference uses the
// Rust crate unicode-normalization-alignments, whose Unicode version may be older, so characters
// added to Unicode after it can normalize differently — the tests compare the two on every code
// point. Text below U+0300 is always already NFC and is returned without any lookup (ASCII for
// NFKC).
#include <algorithm>

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningClass* end = kCombiningClasses + kCombiningClassCount;
  auto it = std::lower_bound(kCombiningClasses, end, cp,
                             [](const CombiningClass& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

const Decomposition* decomposition(uint32_t cp) {
  if (cp < 0xC0) return nullptr;
  const Decomposition* end = kDecompositions + kDecompositionCount;
  auto it = std::lower_bound(kDecompositions, end, cp,
                             [](const Decomposition& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = decomposition(cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second) decompose(d->second, out);
}

struct PairHash {
  size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k); }
};

const std::unordered_map<uint64_t, uint32_t, PairHash>& compositions() {
  static const auto table = [] {
    std::unordered_map<uint64_t, uint32_t, PairHash> t;
    for (size_t i = 0; i < kDecompositionCount; ++i) {
      const Decomposition& d = kDecompositions[i];
      if (d.composes) t[(static_cast<uint64_t>(d.first) << 32) | d.second] = d.cp;
    }
    return t;
  }();
  return table;
}

// The primary composite of (starter, c), or 0.
uint32_t compose(uint32_t starter, uint32_t c) {
  if (starter >= kLBase && starter < kLBase + kLCount && c >= kVBase && c < kVBase + kVCount)
    return kSBase + ((starter - kLBase) * kVCount + (c - kVBase)) * kTCount;
  if (starter >= kSBase && starter < kSBase + kSCount && (starter - kSBase) % kTCount == 0 &&
      c > kTBase && c < kTBase + kTCount)
    return starter + (c - kTBase);
  const auto& table = compositions();
  auto it = table.find((static_cast<uint64_t>(starter) << 32) | c);
  return it == table.end() ? 0 : it->second;
}

const CompatibilityDecomposition* compatibility_decomposition(uint32_t cp) {
  const CompatibilityDecomposition* end =
      kCompatibilityDecompositions + kCompatibilityDecompositionCount;
  auto it =
      std::lower_bound(kCompatibilityDecompositions, end, cp,
                       [](const CompatibilityDecomposition& e, uint32_t c) { return e.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

std::string compose_normalized(std::string_view text, bool compatibility) {
  std::vector<uint32_t> chars;
  chars.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    if (!next_code_point(text, i, cp)) {  // callers validate; keep bytes rather than guess
      cp = 0xFFFD;
      ++i;
    }
    if (compatibility && cp >= 0xA0) {
      if (const CompatibilityDecomposition* d = compatibility_decomposition(cp)) {
        chars.insert(chars.end(), kCompatibilityCodePoints + d->first,
                     kCompatibilityCodePoints + d->first + d->length);
        continue;
      }
    }
    decompose(cp, chars);
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < chars.size();) {
    if (combining_class(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && combining_class(chars[j]) != 0) ++j;
    std::stable_sort(chars.begin() + i, chars.begin() + j, [](uint32_t a, uint32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless a character between
  // them has class 0 or a class >= its own (it is "blocked").
  std::vector<uint32_t> out;
  out.reserve(chars.size());
  long starter = -1;
  int last_class = -1;  // class of the last character kept after the starter; -1: none
  for (uint32_t c : chars) {
    int cc = combining_class(c);
    if (starter >= 0) {
      bool blocked = last_class != -1 && (last_class == 0 || last_class >= cc);
      if (!blocked) {
        if (uint32_t composite = compose(out[starter], c)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = static_cast<long>(out.size());
      last_class = -1;
    } else {
      last_class = cc;
    }
    out.push_back(c);
  }
  std::string result;
  result.reserve(text.size());
  for (uint32_t c : out) append_utf8(result, c);
  return result;
}

}  // namespace

std::string nfc(std::string_view text) {
  bool below_0300 = std::all_of(text.begin(), text.end(),
                                [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
  if (below_0300) return std::string(text);
  return compose_normalized(text, false);
}

std::string nfkc(std::string_view text) {
  bool ascii = std::all_of(text.begin(), text.end(),
                           [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) return std::string(text);
  return compose_normalized(text, true);
}

}  // namespace hk::tok
