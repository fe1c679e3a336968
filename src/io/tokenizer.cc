// hk::Tokenizer: runs the parts tokenizer_load.cc built from a tokenizer.json in the reference's
// order: non-normalized added tokens → normalizer → normalized added tokens → pre-tokenizer →
// BPE → post-processor template. Decoding maps ids to token strings (added tokens by content)
// and runs the decoder chain.
#include "hk/tokenizer.h"

#include <fstream>

#include "hk/error.h"
#include "io/tokenizer_impl.h"

namespace hk {

// ---- encoding ----------------------------------------------------------------------------------

void Tokenizer::Impl::encode_normalized(std::string_view text, bool at_start,
                                        std::vector<int64_t>& out) const {
  std::vector<std::string> pieces;
  pre_tokenizer.split(text, at_start, pieces);
  for (const std::string& piece : pieces) bpe->encode(piece, out);
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int64_t>& out) const {
  for (const tok::Segment& seg : raw_matcher->split(text)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized = normalizer.apply(part);
    for (const tok::Segment& sub : normalized_matcher->split(normalized)) {
      if (sub.id >= 0)
        out.push_back(sub.id);
      else
        encode_normalized(std::string_view(normalized).substr(sub.begin, sub.end - sub.begin),
                          seg.begin == 0 && sub.begin == 0, out);
    }
  }
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& source) {
  return Tokenizer(tok::parse_tokenizer(text, source));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  return Tokenizer(tok::parse_tokenizer(tok::read_tokenizer_file(path), path));
}

Tokenizer Tokenizer::from_pretrained(const std::string& dir) {
  std::string path = dir + "/tokenizer.json";
  auto impl = tok::parse_tokenizer(tok::read_tokenizer_file(path), path);
  std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path)) tok::apply_tokenizer_config(config_path, *impl);
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t bad = tok::find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    throw InvalidArgument("text to tokenize is not valid UTF-8 (bad byte at offset " +
                          std::to_string(bad) + ")");
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = impl_->prefix_ids;
  impl_->encode_text(text, ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    auto added = impl_->added_by_id.find(id);
    if (added != impl_->added_by_id.end()) {
      if (skip_special_tokens && added->second->special) continue;
      tokens.push_back(added->second->content);
      continue;
    }
    const std::string* token = impl_->bpe->token(id);
    if (!token)
      throw InvalidArgument("cannot decode id " + std::to_string(id) + ": it is not in the " +
                            "vocabulary of '" + impl_->source + "'");
    tokens.push_back(*token);
  }
  return impl_->decoder.decode(std::move(tokens));
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  std::string key(token);
  auto a = impl_->added_by_content.find(key);
  if (a != impl_->added_by_content.end()) return a->second;
  auto v = impl_->bpe->vocab().find(key);
  if (v != impl_->bpe->vocab().end()) return v->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  auto added = impl_->added_by_id.find(id);
  if (added != impl_->added_by_id.end()) return added->second->content;
  if (const std::string* token = impl_->bpe->token(id)) return *token;
  throw InvalidArgument("id " + std::to_string(id) + " is not a token of '" + impl_->source + "'");
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

bool Tokenizer::is_special(int64_t id) const {
  auto added = impl_->added_by_id.find(id);
  return added != impl_->added_by_id.end() && added->second->special;
}

std::optional<int64_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<int64_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
std::optional<int64_t> Tokenizer::pad_id() const {
  return impl_->pad;
}

}  // namespace hk
