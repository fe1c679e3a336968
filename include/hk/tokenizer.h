// hk/tokenizer.h — BPE tokenizer read from a Hugging Face `tokenizer.json`.
//
// Covers the files of Qwen2/Qwen3, Llama 2 and 3, Mistral, SmolLM and GPT-2 style models (the
// byte-level and the SentencePiece-style layouts, and the file Transformers 5 writes for
// LlamaTokenizer), and produces the same ids and text as the Hugging Face `tokenizers` library
// (the reference the tests compare against):
//   normalizer      NFC, NFKC, Prepend, Replace (String or Regex), Sequence of those
//   pre_tokenizer   Split (Regex or String pattern, every split behaviour, invert), ByteLevel
//                   (add_prefix_space, use_regex = the GPT-2 regex), Metaspace (replacement,
//                   prepend_scheme always/first/never, split), Sequence of those; or none
//   model           BPE with vocab + merges ("a b" strings or [a, b] pairs), ignore_merges,
//                   byte_fallback (<0xXX> tokens), unk_token, fuse_unk; no dropout and no
//                   continuing_subword_prefix / end_of_word_suffix
//   added_tokens    matched first (leftmost-longest), honouring lstrip / rstrip / single_word /
//                   normalized, mapped straight to their ids (assigned as the reference assigns
//                   them, which for Qwen/Llama files are the ids written in the file)
//   post_processor  ByteLevel, TemplateProcessing (single template), Bert/Roberta, Sequence
//   decoder         ByteLevel (invalid UTF-8 becomes U+FFFD, as in the reference), ByteFallback,
//                   Fuse, Replace, Strip, Metaspace, Sequence; none = tokens joined by spaces
// Sequences nest at most 32 deep. Anything else is rejected at load time with
// hk::InvalidArgument naming the file and the part, rather than tokenizing differently from the
// reference (a file with "truncation" or "padding" settings too: hk never truncates or pads).
// It deliberately does not do pair encodings, offsets or training.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hk {

class Tokenizer {
 public:
  // Reads a `tokenizer.json`. Throws NotFound when the file is missing, InvalidArgument when it
  // is malformed or uses a part this tokenizer does not implement.
  static Tokenizer from_file(const std::string& path);
  // Parses the text of a `tokenizer.json`; `source` names it in error messages.
  static Tokenizer from_json(const std::string& json, const std::string& source = "tokenizer.json");
  // Reads DIR/tokenizer.json, and DIR/tokenizer_config.json when present for the bos / eos / pad
  // tokens (otherwise they are guessed as from_file does).
  static Tokenizer from_pretrained(const std::string& dir);

  // Text → ids. `add_special_tokens` applies the post-processor's template (e.g. Llama 3's BOS).
  // Text must be valid UTF-8 (InvalidArgument otherwise).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids → text. Unknown ids throw InvalidArgument.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  // The token's string as stored in the file (byte-level form for vocabulary tokens).
  std::string id_to_token(int64_t id) const;
  // Number of distinct ids: vocabulary plus added tokens (like `get_vocab_size(True)`).
  int64_t vocab_size() const;
  bool is_special(int64_t id) const;

  // Known from the post-processor template or tokenizer_config.json, else guessed from the
  // common special-token names (<|endoftext|>, <|end_of_text|>, </s>, ...); empty when unknown.
  std::optional<int64_t> bos_id() const;
  std::optional<int64_t> eos_id() const;
  std::optional<int64_t> pad_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  // Shared and immutable apart from an internally synchronised cache: copies are cheap and a
  // tokenizer may be used from several threads at once.
  std::shared_ptr<const Impl> impl_;
};

}  // namespace hk
