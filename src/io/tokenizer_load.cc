// tokenizer.json → the parts of tokenizer_internal.h. Every field that changes ids or text and
// that hk does not implement is rejected by name ("<file>: <part>: <problem>"), so nothing is
// silently tokenized differently from the reference. Sequences (of normalizers, pre-tokenizers,
// post-processors, decoders) are flattened into one list of steps; their nesting is bounded
// (kMaxNesting) so a hostile file cannot exhaust the stack — real files nest at most two deep.
#include <algorithm>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "hk/error.h"
#include "io/tokenizer_impl.h"

namespace hk::tok {
namespace {

using nlohmann::json;

constexpr int kMaxNesting = 32;

// Builds the messages of one tokenizer.json: "<source>: <part>: <problem>".
class Loader {
 public:
  explicit Loader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& part, const std::string& problem) const {
    throw InvalidArgument("tokenizer file '" + source_ + "': " + part + ": " + problem);
  }
  [[noreturn]] void unsupported(const std::string& part, const std::string& what) const {
    fail(part, what + " is not supported by hk's BPE tokenizer (supported: the tokenizer.json " +
                   "layouts of Qwen2/Qwen3, Llama 2/3, Mistral, SmolLM and GPT-2)");
  }
  void check_depth(int depth, const std::string& part) const {
    if (depth > kMaxNesting)
      fail(part, "Sequence nested more than " + std::to_string(kMaxNesting) +
                     " deep; hk refuses it rather than recurse without bound");
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
  size_t count_member(const json& object, const char* key, const std::string& part) const {
    const json& v = member(object, key, part);
    if (!v.is_number_unsigned() || v.get<uint64_t>() > (1u << 20))
      fail(part, std::string("\"") + key + "\" must be a non-negative integer");
    return v.get<size_t>();
  }
  // A string of exactly one character (the reference's `char` fields).
  std::string char_member(const json& object, const char* key, const std::string& part) const {
    std::string s = string_member(object, key, part);
    size_t i = 0;
    uint32_t cp = 0;
    if (s.empty() || !next_code_point(s, i, cp) || i != s.size())
      fail(part, std::string("\"") + key + "\" must be one character, got \"" + s + "\"");
    return s;
  }
  int64_t id_value(const json& v, const std::string& part) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(part, "token ids must be integers in 0..2^31-1");
    return v.get<int64_t>();
  }
  std::shared_ptr<const Regex> regex(const std::string& pattern, bool literal,
                                     const std::string& part) const {
    try {
      return std::make_shared<const Regex>(pattern, literal);
    } catch (const std::invalid_argument& e) {
      fail(part, e.what());
    }
  }
  // {"String": "..."} (a literal) or {"Regex": "..."}.
  std::shared_ptr<const Regex> pattern(const json& object, const std::string& part) const {
    const json& p = member(object, "pattern", part);
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
      return regex(p["Regex"].get<std::string>(), false, part);
    if (p.is_object() && p.contains("String") && p["String"].is_string())
      return regex(p["String"].get<std::string>(), true, part);
    fail(part, "\"pattern\" must be {\"Regex\": ...} or {\"String\": ...}");
  }
  std::string type_of(const json& part_json, const std::string& part) const {
    return string_member(part_json, "type", part);
  }

  void load(const json& root, Tokenizer::Impl& impl) const;

 private:
  void load_normalizer(const json& n, int depth, Tokenizer::Impl& impl) const;
  void load_pre_tokenizer(const json& p, int depth, Tokenizer::Impl& impl) const;
  void load_metaspace(const json& m, const std::string& part, std::string& replacement,
                      PrependScheme& scheme, bool& split) const;
  void load_model(const json& m, Tokenizer::Impl& impl) const;
  void load_added_tokens(const json& a, Tokenizer::Impl& impl) const;
  void load_post_processor(const json& p, int depth, Tokenizer::Impl& impl) const;
  void load_decoder(const json& d, int depth, Tokenizer::Impl& impl) const;

  std::string source_;
};

void Loader::load_normalizer(const json& n, int depth, Tokenizer::Impl& impl) const {
  const std::string part = "normalizer";
  check_depth(depth, part);
  if (n.is_null()) return;
  std::string type = type_of(n, part);
  NormalizerStep step;
  if (type == "Sequence") {
    const json& list = member(n, "normalizers", part);
    if (!list.is_array()) fail(part, "\"normalizers\" must be a list");
    for (const json& s : list) {
      if (s.is_null()) fail(part, "a Sequence step is null");
      load_normalizer(s, depth + 1, impl);
    }
    return;
  } else if (type == "NFC") {
    step.kind = NormalizerStep::Kind::NFC;
  } else if (type == "NFKC") {
    step.kind = NormalizerStep::Kind::NFKC;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::Prepend;
    step.text = string_member(n, "prepend", part);
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::Replace;
    step.pattern = pattern(n, part);
    step.text = string_member(n, "content", part);
  } else {
    unsupported(part, "the normalizer type \"" + type + "\"");
  }
  impl.normalizer.steps.push_back(std::move(step));
}

void Loader::load_metaspace(const json& m, const std::string& part, std::string& replacement,
                            PrependScheme& scheme, bool& split) const {
  replacement = char_member(m, "replacement", part);
  scheme = PrependScheme::Always;
  const bool has_scheme = m.contains("prepend_scheme") && !m["prepend_scheme"].is_null();
  if (has_scheme) {
    std::string s = string_member(m, "prepend_scheme", part);
    if (s == "always")
      scheme = PrependScheme::Always;
    else if (s == "first")
      scheme = PrependScheme::First;
    else if (s == "never")
      scheme = PrependScheme::Never;
    else
      fail(part, "Metaspace \"prepend_scheme\" must be always, first or never, got \"" + s + "\"");
  }
  // Older files say add_prefix_space instead; the reference rejects a false one that
  // contradicts the scheme.
  if (m.contains("add_prefix_space") && !m["add_prefix_space"].is_null() &&
      !bool_member(m, "add_prefix_space", true, part) && scheme != PrependScheme::Never)
    fail(part, "Metaspace \"add_prefix_space\": false does not match prepend_scheme \"" +
                   std::string(has_scheme ? "first/always" : "always (the default)") + "\"");
  split = bool_member(m, "split", true, part);
}

void Loader::load_pre_tokenizer(const json& p, int depth, Tokenizer::Impl& impl) const {
  const std::string part = "pre_tokenizer";
  check_depth(depth, part);
  if (p.is_null()) return;
  std::string type = type_of(p, part);
  PreTokenizerStep step;
  if (type == "Sequence") {
    const json& list = member(p, "pretokenizers", part);
    if (!list.is_array()) fail(part, "\"pretokenizers\" must be a list");
    for (const json& s : list) {
      if (s.is_null()) fail(part, "a Sequence step is null");
      load_pre_tokenizer(s, depth + 1, impl);
    }
    return;
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::Split;
    step.regex = pattern(p, part);
    std::string behavior = string_member(p, "behavior", part);
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::Removed},
        {"Isolated", SplitBehavior::Isolated},
        {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
        {"MergedWithNext", SplitBehavior::MergedWithNext},
        {"Contiguous", SplitBehavior::Contiguous}};
    auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                           [&](const auto& b) { return behavior == b.first; });
    if (it == std::end(kBehaviors)) unsupported(part, "the Split behavior \"" + behavior + "\"");
    step.behavior = it->second;
    step.invert = bool_member(p, "invert", false, part);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::ByteLevel;
    step.add_prefix_space = bool_member(p, "add_prefix_space", true, part);
    if (bool_member(p, "use_regex", true, part))
      step.byte_level_regex = regex(gpt2_pattern(), false, part);
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::Metaspace;
    load_metaspace(p, part, step.replacement, step.prepend_scheme, step.split);
  } else {
    unsupported(part, "the pre-tokenizer type \"" + type + "\"");
  }
  impl.pre_tokenizer.steps.push_back(std::move(step));
}

void Loader::load_model(const json& m, Tokenizer::Impl& impl) const {
  const std::string part = "model";
  if (!m.is_object()) fail(part, "expected a JSON object");
  std::string type = m.contains("type") ? string_member(m, "type", part) : "BPE";
  if (type != "BPE") unsupported(part, "the model type \"" + type + "\"");
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
  BpeOptions options;
  options.ignore_merges = bool_member(m, "ignore_merges", false, part);
  options.fuse_unk = bool_member(m, "fuse_unk", false, part);
  options.byte_fallback = bool_member(m, "byte_fallback", false, part);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    std::string unk_token = string_member(m, "unk_token", part);
    auto it = vocab.find(unk_token);
    if (it == vocab.end()) fail(part, "unk_token '" + unk_token + "' is not in the vocabulary");
    options.unk_id = it->second;
  }
  try {
    impl.bpe = std::make_unique<Bpe>(std::move(vocab), merges, options);
  } catch (const std::invalid_argument& e) {
    fail(part, e.what());
  }
}

void Loader::load_added_tokens(const json& a, Tokenizer::Impl& impl) const {
  const std::string part = "added_tokens";
  impl.raw_matcher = std::make_unique<AddedTokenMatcher>(std::vector<const AddedToken*>{});
  impl.normalized_matcher = std::make_unique<AddedTokenMatcher>(std::vector<const AddedToken*>{});
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
    AddedToken t;
    int64_t written_id = id_value(member(entry, "id", part), part);
    t.content = string_member(entry, "content", part);
    if (t.content.empty()) fail(part, "token " + std::to_string(written_id) + " has empty content");
    if (find_invalid_utf8(t.content) != std::string::npos)
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
  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& t : impl.added) {
    impl.added_by_id[t.id] = &t;
    (t.normalized ? normalized : raw).push_back(&t);
  }
  // Normalized tokens match normalized text, so the reference normalizes their contents with
  // the whole normalizer (a Prepend normalizer prefixes them too). Decoding keeps the original.
  for (const AddedToken* t : normalized) {
    auto& token = const_cast<AddedToken&>(*t);
    token.match_content = impl.normalizer.apply(token.content);
  }
  impl.raw_matcher = std::make_unique<AddedTokenMatcher>(raw);
  impl.normalized_matcher = std::make_unique<AddedTokenMatcher>(normalized);
}

void Loader::load_post_processor(const json& p, int depth, Tokenizer::Impl& impl) const {
  const std::string part = "post_processor";
  check_depth(depth, part);
  if (p.is_null()) return;
  std::string type = type_of(p, part);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = member(p, "processors", part);
    if (!list.is_array()) fail(part, "\"processors\" must be a list");
    for (const json& step : list) {
      if (step.is_null()) fail(part, "a Sequence step is null");
      load_post_processor(step, depth + 1, impl);
    }
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

void Loader::load_decoder(const json& d, int depth, Tokenizer::Impl& impl) const {
  const std::string part = "decoder";
  check_depth(depth, part);
  if (d.is_null()) return;
  impl.decoder.present = true;
  std::string type = type_of(d, part);
  DecoderStep step;
  if (type == "Sequence") {
    const json& list = member(d, "decoders", part);
    if (!list.is_array()) fail(part, "\"decoders\" must be a list");
    for (const json& s : list) {
      if (s.is_null()) fail(part, "a Sequence step is null");
      load_decoder(s, depth + 1, impl);
    }
    return;
  } else if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::ByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::ByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::Fuse;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::Replace;
    step.pattern = pattern(d, part);
    step.text = string_member(d, "content", part);
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::Strip;
    step.text = char_member(d, "content", part);
    step.start = count_member(d, "start", part);
    step.stop = count_member(d, "stop", part);
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::Metaspace;
    bool split = true;
    load_metaspace(d, part, step.text, step.prepend_scheme, split);
  } else {
    unsupported(part, "the decoder type \"" + type + "\"");
  }
  impl.decoder.steps.push_back(std::move(step));
}

void Loader::load(const json& root, Tokenizer::Impl& impl) const {
  if (!root.is_object()) fail("top level", "expected a JSON object");
  auto part = [&](const char* key) -> const json& {
    static const json null_json;
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  load_normalizer(part("normalizer"), 0, impl);
  load_model(member(root, "model", "top level"), impl);
  load_added_tokens(part("added_tokens"), impl);
  load_pre_tokenizer(part("pre_tokenizer"), 0, impl);
  load_post_processor(part("post_processor"), 0, impl);
  load_decoder(part("decoder"), 0, impl);
  for (const char* key : {"truncation", "padding"})
    if (!part(key).is_null())
      fail(key, std::string("hk never truncates or pads; set \"") + key +
                    "\" to null in the file to use it");

  // Distinct token strings, as the reference counts get_vocab_size(with_added_tokens=True).
  std::unordered_set<std::string> contents;
  for (const auto& [token, id] : impl.bpe->vocab()) contents.insert(token);
  for (const AddedToken& t : impl.added) contents.insert(t.content);
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

}  // namespace

std::string read_tokenizer_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw NotFound("cannot open tokenizer file '" + path +
                   "'; pass a model directory containing tokenizer.json");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InvalidArgument("cannot read tokenizer file '" + path + "'");
  return text.str();
}

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

void apply_tokenizer_config(const std::string& config_path, Tokenizer::Impl& impl) {
  json config;
  try {
    config = json::parse(read_tokenizer_file(config_path));
  } catch (const json::exception& e) {
    throw InvalidArgument("tokenizer config '" + config_path + "' is not valid JSON (" + e.what() +
                          ")");
  }
  if (!config.is_object()) return;
  // A string, an {"content": ...} object, or null for none.
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

}  // namespace hk::tok
