// The parts of the BPE tokenizer (hk/tokenizer.h), each implemented in its own
// src/io/tokenizer_*.cc file: UTF-8 and the GPT-2 byte↔unicode table, the PCRE2 regex wrapper,
// the normalizer, pre-tokenizer and decoder steps, the BPE model, the added-token matcher and
// NFC/NFKC. Internal to libhk; nothing here parses JSON (tokenizer_load.cc turns tokenizer.json
// into these parts).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hk::tok {

// ---- UTF-8 and bytes (tokenizer_bytes.cc) ------------------------------------------------------

// Decodes one code point at s[i] and advances i; returns false (i unchanged) on invalid UTF-8.
bool next_code_point(std::string_view s, size_t& i, uint32_t& cp);
// Byte offset of the first invalid UTF-8 sequence, or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
// Like Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_white_space(uint32_t cp);

// GPT-2's bytes_to_unicode: the printable bytes map to themselves, the others to U+0100 + n.
// byte_to_unicode()[b] is the UTF-8 encoding of the character standing for byte b.
const std::array<std::string, 256>& byte_to_unicode();
// The byte a character stands for, or -1 when the character is not in the table.
int unicode_to_byte(uint32_t cp);
// Byte-level decoding of one token: its characters' bytes when every character is in the table,
// else the token's own UTF-8 bytes (what the reference ByteLevel decoder does).
void append_token_bytes(std::string& out, std::string_view token);

// ---- regex (tokenizer_regex.cc) ----------------------------------------------------------------

// A compiled PCRE2 pattern in UTF + UCP mode, translated so that \s, \S, \p{L} and \p{N} class
// every code point like Oniguruma (the reference's engine): \s is exactly White_Space (PCRE2 adds
// U+180E and lacks U+0085) and \p{L} / \p{N} gain the letters and numbers of newer Unicode.
class Regex {
 public:
  // `literal` matches the pattern text verbatim. Throws std::invalid_argument with PCRE2's message.
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls on_match(begin, end) for successive non-overlapping matches in valid UTF-8, with the
  // reference's (Rust onig crate's) rule for empty matches: allowed, except one that ends where
  // the previous match ended, which makes the search resume one character later.
  template <class F>
  void for_each_match(std::string_view text, F&& on_match) const {
    size_t search_from = 0, b = 0, e = 0;
    bool have_previous = false;
    size_t previous_end = 0;
    while (search_from <= text.size() && next_match(text, search_from, b, e)) {
      if (b == e && have_previous && previous_end == e) {
        search_from += 1;
        while (search_from < text.size() &&
               (static_cast<unsigned char>(text[search_from]) & 0xC0) == 0x80)
          ++search_from;
        continue;
      }
      search_from = previous_end = e;
      have_previous = true;
      on_match(b, e);
    }
  }

 private:
  // The first match at or after `start` (possibly empty); false when there is none.
  bool next_match(std::string_view text, size_t start, size_t& begin, size_t& end) const;
  struct Code;
  std::unique_ptr<Code> code_;
};

// Code points the reference's regex engine (a newer Unicode) counts as \p{L} / \p{N} that are
// unassigned in PCRE2's Unicode 14; generated into tokenizer_regex_tables.cc.
struct CodePointRange {
  uint32_t first, last;
};
extern const CodePointRange kNewerLetters[];
extern const size_t kNewerLettersCount;
extern const CodePointRange kNewerNumbers[];
extern const size_t kNewerNumbersCount;

// ---- normalizer (tokenizer_normalize.cc) -------------------------------------------------------

// One normalizer of the file's chain, applied in order to each segment between added tokens.
struct NormalizerStep {
  enum class Kind { NFC, NFKC, Prepend, Replace };
  Kind kind = Kind::NFC;
  std::string text;                      // Prepend: the prefix; Replace: the content
  std::shared_ptr<const Regex> pattern;  // Replace (a String pattern is a literal regex)
};

class Normalizer {
 public:
  std::vector<NormalizerStep> steps;  // Sequences are flattened at load
  bool empty() const { return steps.empty(); }
  std::string apply(std::string_view text) const;
};

// Every non-overlapping match of `pattern` replaced by `content`, with the reference's rules for
// empty matches; empty text is left as it is (the reference reports no match there).
std::string replace_all(const Regex& pattern, std::string_view text, std::string_view content);

// ---- pre-tokenizer (tokenizer_pretokenize.cc) --------------------------------------------------

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
enum class PrependScheme { Always, First, Never };

// One pre-tokenizer of the file's chain. Each runs on every piece the previous ones produced.
struct PreTokenizerStep {
  enum class Kind { Split, ByteLevel, Metaspace };
  Kind kind = Kind::Split;
  // Split
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // ByteLevel: optional prefix space, the GPT-2 regex (null: use_regex false), then every byte
  // becomes its byte-level character (the BPE vocabulary's alphabet)
  bool add_prefix_space = false;
  std::shared_ptr<const Regex> byte_level_regex;
  // Metaspace: ' ' becomes `replacement`, prefixed per `prepend_scheme`, optionally split before
  // each replacement character
  std::string replacement;
  PrependScheme prepend_scheme = PrependScheme::Always;
  bool split = true;
};

// Cuts normalized text into the pieces BPE runs on, in the model's alphabet. With no steps the
// whole text is one piece (SentencePiece-style files whose normalizer does the work).
class PreTokenizer {
 public:
  std::vector<PreTokenizerStep> steps;  // Sequences are flattened at load

  // `at_start`: the text begins at offset 0 of the original input (Metaspace's "first" scheme
  // prefixes only there, like the reference, which checks the piece's original offset).
  void split(std::string_view text, bool at_start, std::vector<std::string>& pieces) const;
};

const std::string& gpt2_pattern();

// ---- BPE model (tokenizer_bpe.cc) --------------------------------------------------------------

struct BpeOptions {
  bool ignore_merges = false;     // a piece that is itself in the vocabulary is one token
  std::optional<int64_t> unk_id;  // characters missing from the vocabulary (else dropped)
  bool fuse_unk = false;          // consecutive unknown characters give one unk
  bool byte_fallback = false;     // missing characters become their <0xXX> byte tokens
};

class Bpe {
 public:
  // Throws std::invalid_argument naming the merge or token that does not fit the vocabulary.
  Bpe(std::unordered_map<std::string, int64_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  // Appends the ids of one pre-token (text in the vocabulary's alphabet).
  void encode(std::string_view piece, std::vector<int64_t>& out) const;

  const std::unordered_map<std::string, int64_t>& vocab() const { return vocab_; }
  // Empty when the id is not in the vocabulary.
  const std::string* token(int64_t id) const;

 private:
  void merge_word(std::string_view piece, std::vector<int64_t>& out) const;
  int64_t char_id(std::string_view piece, size_t begin, size_t end, uint32_t cp) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, const std::string*> tokens_;
  struct Merge {
    int32_t rank;
    int64_t new_id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::array<int64_t, 0x200> low_char_ids_;     // ids of single characters below U+0200, or -1
  std::array<int64_t, 256> byte_token_ids_;     // ids of "<0xXX>" tokens, or -1
  BpeOptions options_;
  // Words already merged; bounded, cleared when full (text has a Zipfian word distribution).
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

// ---- decoder (tokenizer_decode.cc) -------------------------------------------------------------

// One decoder of the file's chain; each turns the list of token strings into a new list, and the
// last list is concatenated (the reference's decode_chain).
struct DecoderStep {
  enum class Kind { ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace };
  Kind kind = Kind::ByteLevel;
  std::shared_ptr<const Regex> pattern;  // Replace
  std::string text;                      // Replace: content; Strip: the character; Metaspace:
                                         // the replacement character
  size_t start = 0, stop = 0;            // Strip: characters removed at most from each end
  PrependScheme prepend_scheme = PrependScheme::Always;  // Metaspace
};

class Decoder {
 public:
  bool present = false;            // a file without decoder joins the tokens with spaces
  std::vector<DecoderStep> steps;  // Sequences are flattened at load
  std::string decode(std::vector<std::string> tokens) const;
};

// ---- added tokens (tokenizer_added.cc) ---------------------------------------------------------

struct AddedToken {
  std::string content;
  std::string match_content;  // what the matcher looks for when it differs (normalized tokens)
  int64_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
  const std::string& matched() const { return match_content.empty() ? content : match_content; }
};

// One segment of split text: either an added token's id or a span still to be tokenized.
struct Segment {
  size_t begin = 0, end = 0;
  int64_t id = -1;  // >= 0: an added token
};

// Finds added tokens like the reference's AddedVocabulary: leftmost-longest, non-overlapping,
// a single_word token only between non-word characters, lstrip/rstrip absorbing white space.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<const AddedToken*> tokens);
  std::vector<Segment> split(std::string_view text) const;
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<const AddedToken*> tokens_;
  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;  // longest first
};

// ---- NFC (tokenizer_nfc.cc) --------------------------------------------------------------------

// Unicode Normalization Form C of valid UTF-8. Text below U+0300 is returned unchanged without
// table lookups.
std::string nfc(std::string_view text);
// Form KC: compatibility decomposition, then canonical composition. ASCII is returned unchanged.
std::string nfkc(std::string_view text);

// Generated tables (tokenizer_nfc_tables.cc), sorted by code point.
struct CombiningClass {
  uint32_t cp;
  uint8_t ccc;  // non-zero
};
struct Decomposition {
  uint32_t cp, first, second;  // second == 0: a singleton decomposition
  uint8_t composes;            // 1: cp is a primary composite of (first, second)
};
extern const CombiningClass kCombiningClasses[];
extern const size_t kCombiningClassCount;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
// Full compatibility decompositions (tokenizer_nfkc_tables.cc): code point → the reference's
// NFKD of it, kCompatibilityCodePoints[first, first + length), for code points whose NFKD
// differs from their NFD. Sorted by code point.
struct CompatibilityDecomposition {
  uint32_t cp;
  uint32_t first;
  uint8_t length;
};
extern const CompatibilityDecomposition kCompatibilityDecompositions[];
extern const size_t kCompatibilityDecompositionCount;
extern const uint32_t kCompatibilityCodePoints[];

}  // namespace hk::tok
