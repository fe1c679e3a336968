// Internal: hk::Tokenizer's state — the parts of tokenizer_internal.h as one tokenizer.json
// describes them — and the loader that builds it (tokenizer_load.cc). tokenizer.cc runs them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "hk/tokenizer.h"
#include "io/tokenizer_internal.h"

namespace hk {

struct Tokenizer::Impl {
  std::string source;
  tok::Normalizer normalizer;
  std::vector<tok::AddedToken> added;
  std::unordered_map<std::string, int64_t> added_by_content;
  std::unordered_map<int64_t, const tok::AddedToken*> added_by_id;
  std::unique_ptr<tok::AddedTokenMatcher> raw_matcher;         // normalized == false
  std::unique_ptr<tok::AddedTokenMatcher> normalized_matcher;  // normalized == true
  tok::PreTokenizer pre_tokenizer;
  std::unique_ptr<tok::Bpe> bpe;
  tok::Decoder decoder;
  std::vector<int64_t> prefix_ids, suffix_ids;  // post-processor template around the sequence
  std::optional<int64_t> bos, eos, pad;
  int64_t vocab_size = 0;

  void encode_text(std::string_view text, std::vector<int64_t>& out) const;
  void encode_normalized(std::string_view text, bool at_start, std::vector<int64_t>& out) const;
};

namespace tok {

// Parses a tokenizer.json's text; `source` names it in errors (InvalidArgument).
std::shared_ptr<Tokenizer::Impl> parse_tokenizer(const std::string& text,
                                                 const std::string& source);
// Sets bos / eos / pad from tokenizer_config.json (bos_token, eos_token, pad_token).
void apply_tokenizer_config(const std::string& config_path, Tokenizer::Impl& impl);
// The whole file; NotFound when it cannot be opened.
std::string read_tokenizer_file(const std::string& path);

}  // namespace tok
}  // namespace hk
