// Strict parsing of metadata.json (one variant of a kernel repo) and of refs (files and JSON).
//
// Every field is type-checked; digests must be 64 lower-case hex characters and file names must be
// plain names inside the variant directory, so a hostile metadata.json cannot make the cache write
// or read outside it. Unknown top-level keys are ignored (forward compatibility); unknown values of
// known enums (backend type, mode) are rejected. JSON goes through the strict reader: nesting is
// bounded and a key given twice (a second digest for the library) is refused.
#include <nlohmann/json.hpp>

#include "core/strict_json.h"
#include "hk/error.h"
#include "hk/hub_metadata.h"
#include "hk/hub_spec.h"

namespace hk::hub {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& why) {
  throw InvalidArgument("bad kernel metadata " + origin + ": " + why);
}

const json& field(const json& obj, const char* key, const std::string& origin, const char* where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(origin, std::string(where) + " has no \"" + key + "\"");
  return *it;
}

std::string get_string(const json& obj, const char* key, const std::string& origin,
                       const char* where, bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) fail(origin, std::string(where) + " has no \"" + key + "\"");
    return {};
  }
  if (!it->is_string()) fail(origin, std::string(where) + " \"" + key + "\" is not a string");
  return it->get<std::string>();
}

int get_int(const json& obj, const char* key, const std::string& origin, const char* where,
            bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) fail(origin, std::string(where) + " has no \"" + key + "\"");
    return 0;
  }
  if (!it->is_number_integer())
    fail(origin, std::string(where) + " \"" + key + "\" is not an integer");
  auto v = it->get<int64_t>();
  if (v < 0 || v > 1000000) fail(origin, std::string(where) + " \"" + key + "\" is out of range");
  return static_cast<int>(v);
}

std::vector<std::string> get_strings(const json& obj, const char* key, const std::string& origin,
                                     const char* where, bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) fail(origin, std::string(where) + " has no \"" + key + "\"");
    return {};
  }
  if (!it->is_array()) fail(origin, std::string(where) + " \"" + key + "\" is not a list");
  std::vector<std::string> out;
  for (const json& v : *it) {
    if (!v.is_string()) fail(origin, std::string(where) + " \"" + key + "\" holds a non-string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool is_known_backend(const std::string& t) {
  return t == "cpu" || t == "cuda" || t == "rocm" || t == "xpu" || t == "mps" || t == "npu";
}

json parse_json(std::string_view text, const std::string& origin) {
  return parse_json_strict(text, "bad kernel metadata " + origin + ": it ");
}

}  // namespace

bool is_safe_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name)
    if (c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
  return true;
}

std::vector<std::string> VariantMetadata::entry_names() const {
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.name);
  return names;
}

VariantMetadata parse_variant_metadata(std::string_view text, const std::string& origin) {
  json j = parse_json(text, origin);
  if (!j.is_object()) fail(origin, "the top level is not an object");
  VariantMetadata m;
  const char* top = "metadata";
  m.name = get_string(j, "name", origin, top);
  m.repo = get_string(j, "repo", origin, top);
  parse_repo_name(m.repo);  // validates
  m.version = get_string(j, "version", origin, top, false);
  m.id = get_string(j, "id", origin, top);
  if (!is_commit_id(m.id)) fail(origin, "\"id\" is not a 40-hex commit id");
  m.variant = get_string(j, "variant", origin, top);
  if (!is_safe_file_name(m.variant)) fail(origin, "\"variant\" is not a plain name");
  const json& abi = field(j, "abi", origin, top);
  if (!abi.is_object()) fail(origin, "\"abi\" is not an object");
  m.abi_major = get_int(abi, "major", origin, "abi");
  m.abi_minor = get_int(abi, "minor", origin, "abi", false);
  const json& backend = field(j, "backend", origin, top);
  if (!backend.is_object()) fail(origin, "\"backend\" is not an object");
  m.backend.type = get_string(backend, "type", origin, "backend");
  if (!is_known_backend(m.backend.type))
    fail(origin,
         "backend type \"" + m.backend.type + "\" is unknown (cpu, cuda, rocm, xpu, mps, npu)");
  m.backend.version = get_string(backend, "version", origin, "backend", false);
  m.backend.archs = get_strings(backend, "archs", origin, "backend", false);
  if (m.backend.type == "cuda") {
    if (m.backend.version.empty()) fail(origin, "a cuda backend needs \"version\" (e.g. \"13.0\")");
    if (!SemVer::try_parse(m.backend.version))
      fail(origin, "backend version \"" + m.backend.version + "\" is not MAJOR.MINOR");
    if (m.backend.archs.empty()) fail(origin, "a cuda backend needs \"archs\" (e.g. [\"90a\"])");
    for (const auto& a : m.backend.archs) {
      std::string_view digits = a;
      if (!digits.empty() && digits.back() == 'a') digits.remove_suffix(1);
      bool ok = !digits.empty() && digits.size() <= 4;
      for (char c : digits) ok = ok && c >= '0' && c <= '9';
      if (!ok) fail(origin, "cuda arch \"" + a + "\" is not like \"90a\" or \"80\"");
    }
  }
  m.os = get_string(j, "os", origin, top);
  m.arch = get_string(j, "arch", origin, top);
  m.library = get_string(j, "library", origin, top);
  if (!is_safe_file_name(m.library)) fail(origin, "\"library\" is not a plain file name");

  const json& entries = field(j, "entries", origin, top);
  if (!entries.is_array()) fail(origin, "\"entries\" is not a list");
  for (const json& e : entries) {
    if (!e.is_object()) fail(origin, "an entry is not an object");
    EntryMetadata em;
    em.name = get_string(e, "name", origin, "entry");
    if (em.name.empty()) fail(origin, "an entry has an empty name");
    em.interface = get_string(e, "interface", origin, "entry");
    em.interface_version = get_int(e, "interface_version", origin, "entry");
    em.modes = get_strings(e, "modes", origin, "entry", false);
    for (const auto& mode : em.modes)
      if (mode != "inference" && mode != "training" && mode != "capture")
        fail(origin, "entry " + em.name + " has unknown mode \"" + mode + "\"");
    em.device = get_string(e, "device", origin, "entry", false);
    em.min_capability = get_int(e, "min_capability", origin, "entry", false);
    em.max_capability = get_int(e, "max_capability", origin, "entry", false);
    em.dtypes = get_strings(e, "dtypes", origin, "entry", false);
    auto bw = e.find("backward");
    if (bw != e.end()) {
      if (!bw->is_boolean()) fail(origin, "entry " + em.name + " \"backward\" is not a boolean");
      em.backward = bw->get<bool>();
    }
    m.entries.push_back(std::move(em));
  }

  const json& digest = field(j, "digest", origin, top);
  if (!digest.is_object()) fail(origin, "\"digest\" is not an object");
  const json& sha = field(digest, "sha256", origin, "digest");
  if (!sha.is_object()) fail(origin, "\"digest.sha256\" is not an object");
  for (auto it = sha.begin(); it != sha.end(); ++it) {
    if (!is_safe_file_name(it.key()) || it.key() == "metadata.json")
      fail(origin, "digest names file \"" + it.key() + "\", which is not a plain file name");
    if (!it->is_string() || !is_hex64(it->get<std::string>()))
      fail(origin, "digest of " + it.key() + " is not 64 lower-case hex characters");
    m.sha256[it.key()] = it->get<std::string>();
  }
  if (!m.sha256.count(m.library))
    fail(origin, "the library " + m.library + " has no sha256 digest, so it cannot be verified");
  if (auto sizes = j.find("size"); sizes != j.end()) {
    if (!sizes->is_object()) fail(origin, "\"size\" is not an object of file → bytes");
    for (auto it = sizes->begin(); it != sizes->end(); ++it) {
      if (!m.sha256.count(it.key()))
        fail(origin,
             "\"size\" names file \"" + escape_control_bytes(it.key()) + "\", which has no digest");
      if (!it->is_number_unsigned())
        fail(origin, "the size of " + it.key() + " is not a non-negative integer");
      m.size[it.key()] = it->get<uint64_t>();
    }
  }
  auto prov = j.find("provenance");
  m.provenance_json = prov == j.end() ? "{}" : prov->dump();
  return m;
}

std::string serialize_variant_metadata(const VariantMetadata& m) {
  json j;
  j["name"] = m.name;
  j["repo"] = m.repo;
  j["version"] = m.version;
  j["id"] = m.id;
  j["variant"] = m.variant;
  j["abi"] = {{"major", m.abi_major}, {"minor", m.abi_minor}};
  json backend = {{"type", m.backend.type}};
  if (!m.backend.version.empty()) backend["version"] = m.backend.version;
  if (!m.backend.archs.empty()) backend["archs"] = m.backend.archs;
  j["backend"] = backend;
  j["os"] = m.os;
  j["arch"] = m.arch;
  j["library"] = m.library;
  j["entries"] = json::array();
  for (const auto& e : m.entries) {
    j["entries"].push_back({{"name", e.name},
                            {"interface", e.interface},
                            {"interface_version", e.interface_version},
                            {"modes", e.modes},
                            {"device", e.device},
                            {"min_capability", e.min_capability},
                            {"max_capability", e.max_capability},
                            {"dtypes", e.dtypes},
                            {"backward", e.backward}});
  }
  j["digest"]["sha256"] = m.sha256;
  if (!m.size.empty()) j["size"] = m.size;
  j["provenance"] = json::parse(m.provenance_json);
  return j.dump(2) + "\n";
}

std::string parse_ref_file(std::string_view text, const std::string& origin) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  if (!is_commit_id(text))
    throw InvalidArgument("bad ref " + origin + ": expected a 40-hex commit id and a newline");
  return std::string(text);
}

RefTable parse_refs_json(std::string_view text, const std::string& origin) {
  json j = parse_json_strict(text, "bad refs " + origin + ": it ");
  if (!j.is_object())
    throw InvalidArgument("bad refs " + origin + ": the top level is not an object");
  RefTable refs;
  for (const char* kind : {"branches", "tags"}) {
    auto it = j.find(kind);
    if (it == j.end()) continue;
    if (!it->is_object())
      throw InvalidArgument("bad refs " + origin + ": \"" + kind + "\" is not an object");
    auto& table = std::string_view(kind) == "branches" ? refs.branches : refs.tags;
    for (auto r = it->begin(); r != it->end(); ++r) {
      check_revision_name(r.key());
      if (!r->is_string() || !is_commit_id(r->get<std::string>()))
        throw InvalidArgument("bad refs " + origin + ": " + r.key() + " is not a 40-hex commit id");
      table[r.key()] = r->get<std::string>();
    }
  }
  return refs;
}

std::string serialize_refs_json(const RefTable& refs) {
  json j;
  j["branches"] = refs.branches;
  j["tags"] = refs.tags;
  return j.dump(2) + "\n";
}

}  // namespace hk::hub
