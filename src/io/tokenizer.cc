// hk::Tokenizer: reads a Hugging Face tokenizer.json into the parts of tokenizer_internal.h and
// runs them in the reference's order: non-normalized added tokens → normalizer → normalized added
// tokens → pre-tokenizer → BPE → post-processor. Decoding maps ids back to token strings and
// through the ByteLevel decoder. Every part of the file this does not implement is rejected by
// name at load time; nothing is silently tokenized differently from the reference.
#include "hk/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "hk/error.h"
#include "io/tokenizer_internal.h"

namespace hk {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string source;
  bool nfc = false;
  std::vector<tok::AddedToken> added;
  std::unordered_map<std::string, int64_t> added_by_content;
  std::unordered_map<int64_t, const tok::AddedToken*> added_by_id;
  std::unique_ptr<tok::AddedTokenMatcher> raw_matcher;         // normalized == false
  std::unique_ptr<tok::AddedTokenMatcher> normalized_matcher;  // normalized == true
  tok::PreTokenizer pre_tokenizer;
  std::unique_ptr<tok::Bpe> bpe;
  std::vector<int64_t> prefix_ids, suffix_ids;  // post-processor template around the sequence
  std::optional<int64_t> bos, eos, pad;
  int64_t vocab_size = 0;

  void encode_text(std::string_view text, std::vector<int64_t>& out) const;
  void encode_normalized(std::string_view text, std::vector<int64_t>& out) const;
};

namespace {

// Builds the messages of one tokenizer.json: "<source>: <part>: <problem>".
class Loader {
 public:
  explicit Loader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& part, const std::string& problem) const {
    throw InvalidArgument("tokenizer file '" + source_ + "': " + part + ": " + problem);
  }
  [[noreturn]] void unsupported(const std::string& part, const std::string& what) const {
    fail(part, what + " is not supported by hk's byte-level BPE tokenizer (supported: " +
                   "the Qwen2/Qwen3, Llama 3 and GPT-2 tokenizer.json layouts)");
  }

  const json& member(const json& object, const char* key, const std::string& part) const {
    if (!object.is_object()) fail(part, "expected a JSON object");
    auto it = object.find(key);
    if (it == object.end()) fail(part, std::string("missing \"") + key + "\"");
    return *it;
  }
  std::string string_member(const json& object, const char* key, const std::string& part) const {
    const json& v = member(object, key, part);
    if (!v.is_string()) fail(part, std::string("\"") + key + "\" must be a string");
    return v.get<std::string>();
  }
  bool bool_member(const json& object, const char* key, bool fallback,
                   const std::string& part) const {
    if (!object.is_object() || !object.contains(key) || object.at(key).is_null()) return fallback;
    const json& v = object.at(key);
    if (!v.is_boolean()) fail(part, std::string("\"") + key + "\" must be true or false");
    return v.get<bool>();
  }
  int64_t id_value(const json& v, const std::string& part) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(part, "token ids must be integers in 0..2^31-1");
    return v.get<int64_t>();
  }
  std::shared_ptr<const tok::Regex> regex(const std::string& pattern, bool literal,
                                          const std::string& part) const {
    try {
      return std::make_shared<const tok::Regex>(pattern, literal);
    } catch (const std::invalid_argument& e) {
      fail(part, e.what());
    }
  }

  void load(const json& root, Tokenizer::Impl& impl) const;

 private:
  void load_normalizer(const json& n, Tokenizer::Impl& impl) const;
  void load_pre_tokenizer(const json& p, Tokenizer::Impl& impl) const;
  void load_pre_tokenizer_step(const json& p, bool last, Tokenizer::Impl& impl) const;
  void load_model(const json& m, Tokenizer::Impl& impl) const;
  void load_added_tokens(const json& a, Tokenizer::Impl& impl) const;
  void load_post_processor(const json& p, Tokenizer::Impl& impl) const;
  void load_decoder(const json& d) const;

  std::string source_;
};

std::string type_of(const Loader& loader, const json& part_json, const std::string& part) {
  return loader.string_member(part_json, "type", part);
}

void Loader::load_normalizer(const json& n, Tokenizer::Impl& impl) const {
  if (n.is_null()) return;
  std::string type = type_of(*this, n, "normalizer");
  if (type == "NFC") {
    impl.nfc = true;
  } else if (type == "Sequence") {
    const json& list = member(n, "normalizers", "normalizer");
    if (!list.is_array()) fail("normalizer", "\"normalizers\" must be a list");
    for (const json& step : list) load_normalizer(step, impl);
  } else {
    unsupported("normalizer", "the normalizer type \"" + type + "\"");
  }
}

void Loader::load_pre_tokenizer_step(const json& p, bool last, Tokenizer::Impl& impl) const {
  const std::string part = "pre_tokenizer";
  std::string type = type_of(*this, p, part);
  if (type == "Split") {
    if (impl.pre_tokenizer.byte_level_regex || impl.pre_tokenizer.add_prefix_space)
      unsupported(part, "a Split after ByteLevel");
    const json& pattern = member(p, "pattern", part);
    tok::SplitStep step;
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string())
      step.regex = regex(pattern["Regex"].get<std::string>(), false, part);
    else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string())
      step.regex = regex(pattern["String"].get<std::string>(), true, part);
    else
      fail(part, "Split \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}");
    std::string behavior = string_member(p, "behavior", part);
    static const std::pair<const char*, tok::SplitBehavior> kBehaviors[] = {
        {"Removed", tok::SplitBehavior::Removed},
        {"Isolated", tok::SplitBehavior::Isolated},
        {"MergedWithPrevious", tok::SplitBehavior::MergedWithPrevious},
        {"MergedWithNext", tok::SplitBehavior::MergedWithNext},
        {"Contiguous", tok::SplitBehavior::Contiguous}};
    auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                           [&](const auto& b) { return behavior == b.first; });
    if (it == std::end(kBehaviors)) unsupported(part, "the Split behavior \"" + behavior + "\"");
    step.behavior = it->second;
    step.invert = bool_member(p, "invert", false, part);
    impl.pre_tokenizer.steps.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    if (!last) unsupported(part, "a pre-tokenizer after ByteLevel");
    impl.pre_tokenizer.add_prefix_space = bool_member(p, "add_prefix_space", true, part);
    if (bool_member(p, "use_regex", true, part))
      impl.pre_tokenizer.byte_level_regex = regex(tok::gpt2_pattern(), false, part);
  } else {
    unsupported(part, "the pre-tokenizer type \"" + type + "\"");
  }
}

void Loader::load_pre_tokenizer(const json& p, Tokenizer::Impl& impl) const {
  if (p.is_null()) fail("pre_tokenizer", "a byte-level BPE needs a ByteLevel pre-tokenizer");
  std::string type = type_of(*this, p, "pre_tokenizer");
  std::vector<const json*> steps;
  if (type == "Sequence") {
    const json& list = member(p, "pretokenizers", "pre_tokenizer");
    if (!list.is_array()) fail("pre_tokenizer", "\"pretokenizers\" must be a list");
    for (const json& step : list) steps.push_back(&step);
  } else {
    steps.push_back(&p);
  }
  bool has_byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    load_pre_tokenizer_step(*steps[i], i + 1 == steps.size(), impl);
    has_byte_level = type_of(*this, *steps[i], "pre_tokenizer") == "ByteLevel";
  }
  if (!has_byte_level)
    unsupported("pre_tokenizer", "a pre-tokenizer that does not end with ByteLevel");
}

void Loader::load_model(const json& m, Tokenizer::Impl& impl) const {
  const std::string part = "model";
  if (!m.is_object()) fail(part, "expected a JSON object");
  std::string type = m.contains("type") ? string_member(m, "type", part) : "BPE";
  if (type != "BPE") unsupported(part, "the model type \"" + type + "\"");
  if (bool_member(m, "byte_fallback", false, part)) unsupported(part, "byte_fallback true");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && !m[key].is_null() &&
        !(m[key].is_string() && m[key].get<std::string>().empty()))
      unsupported(part, std::string("\"") + key + "\"");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    unsupported(part, "BPE dropout");

  const json& vocab_json = member(m, "vocab", part);
  if (!vocab_json.is_object()) fail(part, "\"vocab\" must be an object of token → id");
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(vocab_json.size());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it)
    vocab.emplace(it.key(), id_value(it.value(), part + " vocab entry '" + it.key() + "'"));

  const json& merges_json = member(m, "merges", part);
  if (!merges_json.is_array()) fail(part, "\"merges\" must be a list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const json& merge = merges_json[i];
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        fail(part, "merge #" + std::to_string(i) + " \"" + text + "\" is not two tokens \"a b\"");
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail(part, "merge #" + std::to_string(i) + " must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  std::optional<int64_t> unk;
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    std::string unk_token = string_member(m, "unk_token", part);
    auto it = vocab.find(unk_token);
    if (it == vocab.end()) fail(part, "unk_token '" + unk_token + "' is not in the vocabulary");
    unk = it->second;
  }
  try {
    impl.bpe = std::make_unique<tok::Bpe>(std::move(vocab), merges,
                                          bool_member(m, "ignore_merges", false, part), unk);
  } catch (const std::invalid_argument& e) {
    fail(part, e.what());
  }
}

void Loader::load_added_tokens(const json& a, Tokenizer::Impl& impl) const {
  const std::string part = "added_tokens";
  impl.raw_matcher =
      std::make_unique<tok::AddedTokenMatcher>(std::vector<const tok::AddedToken*>{});
  impl.normalized_matcher =
      std::make_unique<tok::AddedTokenMatcher>(std::vector<const tok::AddedToken*>{});
  if (a.is_null()) return;
  if (!a.is_array()) fail(part, "expected a list");
  impl.added.reserve(a.size());
  // Ids are assigned like the reference's AddedVocabulary::add_tokens, which ignores the "id"
  // written in the file: a token of the vocabulary keeps its vocabulary id, any other takes the
  // next id after the vocabulary and the added tokens so far. For consistent files (Qwen, Llama)
  // this is the written id; for others it is what the reference uses.
  const auto& vocab = impl.bpe->vocab();
  const auto model_size = static_cast<int64_t>(vocab.size());
  std::optional<int64_t> max_added;
  for (const json& entry : a) {
    tok::AddedToken t;
    int64_t written_id = id_value(member(entry, "id", part), part);
    t.content = string_member(entry, "content", part);
    if (t.content.empty()) fail(part, "token " + std::to_string(written_id) + " has empty content");
    if (tok::find_invalid_utf8(t.content) != std::string::npos)
      fail(part, "token " + std::to_string(written_id) + " is not valid UTF-8");
    t.special = bool_member(entry, "special", false, part);
    t.single_word = bool_member(entry, "single_word", false, part);
    t.lstrip = bool_member(entry, "lstrip", false, part);
    t.rstrip = bool_member(entry, "rstrip", false, part);
    t.normalized = bool_member(entry, "normalized", !t.special, part);
    if (impl.added_by_content.count(t.content)) continue;  // a repeated token keeps its first entry
    auto in_vocab = vocab.find(t.content);
    if (in_vocab != vocab.end())
      t.id = in_vocab->second;
    else if (!max_added)
      t.id = model_size;
    else
      t.id = (*max_added >= model_size || model_size == 0) ? *max_added + 1 : model_size;
    max_added = std::max(max_added.value_or(t.id), t.id);
    impl.added_by_content[t.content] = t.id;
    impl.added.push_back(std::move(t));
  }
  std::vector<const tok::AddedToken*> raw, normalized;
  for (const tok::AddedToken& t : impl.added) {
    impl.added_by_id[t.id] = &t;
    (t.normalized ? normalized : raw).push_back(&t);
  }
  // Normalized tokens match normalized text, so their contents are normalized the same way.
  if (impl.nfc)
    for (tok::AddedToken& t : impl.added)
      if (t.normalized) t.content = tok::nfc(t.content);
  impl.raw_matcher = std::make_unique<tok::AddedTokenMatcher>(raw);
  impl.normalized_matcher = std::make_unique<tok::AddedTokenMatcher>(normalized);
}

void Loader::load_post_processor(const json& p, Tokenizer::Impl& impl) const {
  const std::string part = "post_processor";
  if (p.is_null()) return;
  std::string type = type_of(*this, p, part);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = member(p, "processors", part);
    if (!list.is_array()) fail(part, "\"processors\" must be a list");
    for (const json& step : list) load_post_processor(step, impl);
    return;
  }
  if (!impl.prefix_ids.empty() || !impl.suffix_ids.empty())
    unsupported(part, "more than one template post-processor");
  if (type == "TemplateProcessing") {
    const json& single = member(p, "single", part);
    const json& specials = member(p, "special_tokens", part);
    if (!single.is_array()) fail(part, "\"single\" must be a list");
    bool seen_sequence = false;
    for (const json& item : single) {
      if (item.is_object() && item.contains("Sequence")) {
        if (seen_sequence) fail(part, "the single template uses the sequence twice");
        seen_sequence = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        std::string name = string_member(item["SpecialToken"], "id", part);
        const json& special = member(specials, name.c_str(), part + " special_tokens");
        const json& ids = member(special, "ids", part + " special_tokens");
        if (!ids.is_array()) fail(part, "special token '" + name + "' \"ids\" must be a list");
        for (const json& id : ids)
          (seen_sequence ? impl.suffix_ids : impl.prefix_ids).push_back(id_value(id, part));
      } else {
        fail(part, "template items must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_sequence) fail(part, "the single template never uses the sequence $A");
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const json& pair = member(p, key, part);
      if (!pair.is_array() || pair.size() != 2)
        fail(part, std::string(key) + " must be [token, id]");
      (std::string(key) == "cls" ? impl.prefix_ids : impl.suffix_ids)
          .push_back(id_value(pair[1], part));
    }
  } else {
    unsupported(part, "the post-processor type \"" + type + "\"");
  }
}

void Loader::load_decoder(const json& d) const {
  if (d.is_null()) unsupported("decoder", "a missing decoder (byte-level BPE needs ByteLevel)");
  std::string type = type_of(*this, d, "decoder");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = member(d, "decoders", "decoder");
    if (!list.is_array() || list.size() != 1) unsupported("decoder", "a Sequence decoder");
    load_decoder(list[0]);
    return;
  }
  unsupported("decoder", "the decoder type \"" + type + "\"");
}

void Loader::load(const json& root, Tokenizer::Impl& impl) const {
  if (!root.is_object()) fail("top level", "expected a JSON object");
  auto part = [&](const char* key) -> const json& {
    static const json null_json;
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  load_normalizer(part("normalizer"), impl);
  load_model(member(root, "model", "top level"), impl);
  load_added_tokens(part("added_tokens"), impl);
  load_pre_tokenizer(part("pre_tokenizer"), impl);
  load_post_processor(part("post_processor"), impl);
  load_decoder(part("decoder"));
  for (const char* key : {"truncation", "padding"})
    if (!part(key).is_null())
      fail(key, std::string("hk never truncates or pads; set \"") + key +
                    "\" to null in the file to use it");

  // Distinct token strings, as the reference counts get_vocab_size(with_added_tokens=True).
  std::unordered_set<std::string> contents;
  for (const auto& [token, id] : impl.bpe->vocab()) contents.insert(token);
  for (const tok::AddedToken& t : impl.added) contents.insert(t.content);
  impl.vocab_size = static_cast<int64_t>(contents.size());

  // bos / eos from the template when it has them, else from the usual names.
  if (impl.prefix_ids.size() == 1) impl.bos = impl.prefix_ids[0];
  if (impl.suffix_ids.size() == 1) impl.eos = impl.suffix_ids[0];
  auto first_known = [&](std::initializer_list<const char*> names) -> std::optional<int64_t> {
    for (const char* name : names) {
      auto it = impl.added_by_content.find(name);
      if (it != impl.added_by_content.end()) return it->second;
    }
    return std::nullopt;
  };
  if (!impl.bos) impl.bos = first_known({"<|begin_of_text|>", "<s>", "<bos>", "[CLS]"});
  if (!impl.eos) impl.eos = first_known({"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"});
  impl.pad = first_known({"<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>"});
  if (!impl.pad) impl.pad = first_known({"<|endoftext|>"});
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw NotFound("cannot open tokenizer file '" + path +
                   "'; pass a model directory containing tokenizer.json");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InvalidArgument("cannot read tokenizer file '" + path + "'");
  return text.str();
}

}  // namespace

// ---- encoding
// ------------------------------------------------------------------------------------

void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<int64_t>& out) const {
  std::vector<std::string> pieces;
  pre_tokenizer.split(text, pieces);
  for (const std::string& piece : pieces) bpe->encode(piece, out);
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int64_t>& out) const {
  for (const tok::Segment& seg : raw_matcher->split(text)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized = nfc ? tok::nfc(part) : std::string(part);
    for (const tok::Segment& sub : normalized_matcher->split(normalized)) {
      if (sub.id >= 0)
        out.push_back(sub.id);
      else
        encode_normalized(std::string_view(normalized).substr(sub.begin, sub.end - sub.begin), out);
    }
  }
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

namespace {

std::shared_ptr<Tokenizer::Impl> parse_tokenizer(const std::string& text,
                                                 const std::string& source) {
  Loader loader(source);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    loader.fail("JSON", std::string("not valid JSON (") + e.what() + ")");
  }
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->source = source;
  try {
    loader.load(root, *impl);
  } catch (const json::exception& e) {
    loader.fail("structure", std::string("unexpected JSON value (") + e.what() + ")");
  }
  return impl;
}

// Sets bos / eos / pad from tokenizer_config.json's bos_token, eos_token and pad_token (a string,
// an {"content": ...} object, or null for none).
void apply_tokenizer_config(const std::string& config_path, Tokenizer::Impl& impl) {
  json config;
  try {
    config = json::parse(read_file(config_path));
  } catch (const json::exception& e) {
    throw InvalidArgument("tokenizer config '" + config_path + "' is not valid JSON (" + e.what() +
                          ")");
  }
  if (!config.is_object()) return;
  auto named = [&](const char* key, std::optional<int64_t>& slot) {
    auto it = config.find(key);
    if (it == config.end()) return;
    const json& v = *it;
    std::string token;
    if (v.is_null()) {
      slot.reset();
      return;
    }
    if (v.is_string())
      token = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      token = v["content"].get<std::string>();
    else
      return;
    auto a = impl.added_by_content.find(token);
    auto m = impl.bpe->vocab().find(token);
    if (a != impl.added_by_content.end())
      slot = a->second;
    else if (m != impl.bpe->vocab().end())
      slot = m->second;
    else
      throw InvalidArgument("tokenizer config '" + config_path + "': " + key + " '" + token +
                            "' is not a token of tokenizer.json");
  };
  named("bos_token", impl.bos);
  named("eos_token", impl.eos);
  named("pad_token", impl.pad);
}

}  // namespace

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& source) {
  return Tokenizer(parse_tokenizer(text, source));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  return Tokenizer(parse_tokenizer(read_file(path), path));
}

Tokenizer Tokenizer::from_pretrained(const std::string& dir) {
  std::string path = dir + "/tokenizer.json";
  auto impl = parse_tokenizer(read_file(path), path);
  std::string config_path = dir + "/tokenizer_config.json";
  if (std::ifstream(config_path)) apply_tokenizer_config(config_path, *impl);
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
  std::string bytes;
  for (int64_t id : ids) {
    auto added = impl_->added_by_id.find(id);
    if (added != impl_->added_by_id.end()) {
      if (skip_special_tokens && added->second->special) continue;
      tok::append_token_bytes(bytes, added->second->content);
      continue;
    }
    const std::string* token = impl_->bpe->token(id);
    if (!token)
      throw InvalidArgument("cannot decode id " + std::to_string(id) + ": it is not in the " +
                            "vocabulary of '" + impl_->source + "'");
    tok::append_token_bytes(bytes, *token);
  }
  return tok::utf8_lossy(bytes);
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
