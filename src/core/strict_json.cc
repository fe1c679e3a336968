// Strict JSON: a SAX document builder with a depth limit and duplicate-key refusal (see
// core/strict_json.h).
#include "core/strict_json.h"

#include <utility>
#include <vector>

#include "hk/error.h"

namespace hk {
namespace {

using nlohmann::json;

// Quotes a key from the input for a message: control bytes escaped, long keys cut.
std::string quote_key(std::string_view key) {
  std::string shown = escape_control_bytes(key.substr(0, 80));
  return "\"" + shown + (key.size() > 80 ? "...\"" : "\"");
}

class StrictBuilder {
 public:
  StrictBuilder(std::string_view prefix, const JsonLimits& limits)
      : prefix_(prefix), limits_(limits) {}

  json take() { return std::move(root_); }

  // nlohmann SAX interface.
  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(json::number_integer_t v) { return add(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return add(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return add(json(v)); }
  bool string(json::string_t& v) { return add(json(std::move(v))); }
  bool binary(json::binary_t& v) { return add(json(json::binary_t(std::move(v)))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail("is not valid JSON (" + json_error_reason(e) + ")");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw InvalidArgument(std::string(prefix_) + why);
  }

  std::string where() const {
    std::string path;
    for (const auto& [value, key] : stack_)
      if (!key.empty()) path += (path.empty() ? "" : ".") + key;
    if (path.empty()) return "the top-level object";
    std::string out = "\"";
    out += escape_control_bytes(path);
    out += '"';
    return out;
  }

  // Places `value` in the current container (or as the root) and returns where it went.
  json* place(json&& value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& parent = *stack_.back().first;
    if (parent.is_array()) {
      parent.get_ref<json::array_t&>().push_back(std::move(value));
      return &parent.get_ref<json::array_t&>().back();
    }
    auto& object = parent.get_ref<json::object_t&>();
    auto [it, inserted] = object.try_emplace(key_, std::move(value));
    if (!inserted) {
      if (!limits_.allow_duplicate_keys)
        fail("has the key " + quote_key(key_) + " twice in " + where() +
             " (duplicate keys are not allowed: which one was meant?)");
      it->second = std::move(value);
    }
    return &it->second;
  }

  bool add(json&& value) {
    place(std::move(value));
    return true;
  }

  bool open(json&& container) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      fail("nests deeper than " + std::to_string(limits_.max_depth) +
           " levels, which no valid file does");
    std::string key = !stack_.empty() && stack_.back().first->is_object() ? key_ : std::string();
    json* placed = place(std::move(container));
    stack_.emplace_back(placed, std::move(key));
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  std::string_view prefix_;
  JsonLimits limits_;
  json root_;
  // Open containers, innermost last, with the key each one has in its parent (for messages).
  // Pointers stay valid: a container only grows while it is the innermost one.
  std::vector<std::pair<json*, std::string>> stack_;
  std::string key_;
};

}  // namespace

std::string json_error_reason(const nlohmann::detail::exception& e) {
  std::string_view what = e.what();
  if (const size_t close = what.find("] "); what.starts_with("[json.") && close != what.npos)
    what.remove_prefix(close + 2);
  return escape_control_bytes(what.substr(0, 300));
}

nlohmann::json parse_json_strict(std::string_view text, std::string_view prefix,
                                 const JsonLimits& limits) {
  StrictBuilder builder(prefix, limits);
  json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json,
                  /*strict=*/true);
  return builder.take();
}

}  // namespace hk
