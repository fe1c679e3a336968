// Parsing of kernel specs (org/repo[@rev|@range][:Entry], /abs/path[:Entry]) and LOCAL_KERNELS.
//
// Strict by design: names are limited to the characters the hub tree can hold safely as path
// components ([A-Za-z0-9._-], no leading dot), so a spec can never point outside the hub or cache.
// This file does not resolve anything against a hub.
#include "hk/error.h"
#include "hk/hub_spec.h"

namespace hk::hub {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

void check_component(std::string_view part, std::string_view whole, const char* what) {
  auto fail = [&](const std::string& why) {
    throw InvalidArgument("bad kernel repo '" + std::string(whole) + "': the " + what + " " + why +
                          "; expected org/repo with letters, digits, '-', '_' or '.'");
  };
  if (part.empty()) fail("is empty");
  if (part.size() > 96) fail("is longer than 96 characters");
  if (part.front() == '.') fail("starts with '.'");
  for (char c : part)
    if (!is_name_char(c)) fail(std::string("contains '") + c + "'");
}

bool is_entry_name(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_')) return false;
  for (char c : s)
    if (!(is_name_char(c) && c != '.' && c != '-')) return false;
  return true;
}

}  // namespace

std::pair<std::string, std::string> parse_repo_name(std::string_view text) {
  size_t slash = text.find('/');
  if (slash == std::string_view::npos)
    throw InvalidArgument("bad kernel repo '" + std::string(text) +
                          "': expected org/repo (for example kernels-community/rmsnorm)");
  std::string_view org = text.substr(0, slash), name = text.substr(slash + 1);
  check_component(org, text, "org");
  check_component(name, text, "repo name");
  return {std::string(org), std::string(name)};
}

bool is_commit_id(std::string_view text) {
  if (text.size() != 40) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

void check_revision_name(std::string_view text) {
  auto fail = [&](const std::string& why) {
    throw InvalidArgument("bad revision '" + std::string(text) + "': " + why +
                          "; expected a tag (v1.2.0), a branch (v1) or a 40-hex commit id");
  };
  if (text.empty()) fail("it is empty");
  if (text.size() > 128) fail("it is longer than 128 characters");
  if (text.front() == '.' || text.front() == '/' || text.back() == '/')
    fail("bad first/last character");
  if (text.find("..") != std::string_view::npos || text.find("//") != std::string_view::npos)
    fail("it contains '..' or '//'");
  for (char c : text)
    if (!(is_name_char(c) || c == '/')) fail(std::string("it contains '") + c + "'");
}

KernelSpec KernelSpec::parse(std::string_view text) {
  KernelSpec spec;
  if (text.empty())
    throw InvalidArgument("empty kernel spec; expected org/repo[@revision][:Entry]");
  if (text.size() > 4096) throw InvalidArgument("kernel spec is longer than 4096 characters");
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x20)
      throw InvalidArgument("kernel spec contains a control character");

  if (text.front() == '/') {
    // Local directory: the entry is what follows the last ':' when it is a valid entry name.
    spec.kind = Kind::Local;
    size_t colon = text.rfind(':');
    std::string_view path = text;
    if (colon != std::string_view::npos) {
      std::string_view entry = text.substr(colon + 1);
      if (!is_entry_name(entry))
        throw InvalidArgument("bad local kernel spec '" + std::string(text) + "': '" +
                              std::string(entry) +
                              "' is not an entry name; expected /abs/path:Entry");
      spec.entry = std::string(entry);
      path = text.substr(0, colon);
    }
    if (path.size() < 2)
      throw InvalidArgument("bad local kernel spec '" + std::string(text) + "': the path is empty");
    spec.local_path = std::string(path);
    return spec;
  }
  if (text.front() == '.' || text.front() == '~')
    throw InvalidArgument("local kernel path '" + std::string(text) +
                          "' must be absolute (start with '/')");

  std::string_view rest = text;
  // The entry follows the last ':'; revisions and ranges never contain ':'.
  size_t colon = rest.rfind(':');
  if (colon != std::string_view::npos) {
    std::string_view entry = rest.substr(colon + 1);
    if (!is_entry_name(entry))
      throw InvalidArgument(
          "bad kernel spec '" + std::string(text) + "': '" + std::string(entry) +
          "' is not an entry name (letters, digits, '_'; not starting with a digit)");
    spec.entry = std::string(entry);
    rest = rest.substr(0, colon);
  }
  size_t at = rest.find('@');
  std::string_view repo = rest.substr(0, at);
  auto [org, name] = parse_repo_name(repo);
  spec.org = std::move(org);
  spec.name = std::move(name);
  if (at != std::string_view::npos) {
    std::string_view rev = rest.substr(at + 1);
    if (rev.find('@') != std::string_view::npos)
      throw InvalidArgument("bad kernel spec '" + std::string(text) + "': more than one '@'");
    if (looks_like_version_range(rev)) {
      spec.version_range = VersionRange::parse(rev);
    } else {
      check_revision_name(rev);
      spec.revision = std::string(rev);
    }
  }
  return spec;
}

std::string KernelSpec::str() const {
  std::string s = kind == Kind::Local ? local_path : repo();
  if (kind == Kind::Hub) {
    if (revision) s += "@" + *revision;
    if (version_range) s += "@" + version_range->str();
  }
  if (!entry.empty()) s += ":" + entry;
  return s;
}

std::map<std::string, std::string> parse_local_kernels(std::string_view text) {
  std::map<std::string, std::string> out;
  // Items are separated by ':' but paths never contain '=' here, so split on ':' followed by
  // something that looks like "org/repo=".
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t eq = rest.find('=');
    if (eq == std::string_view::npos)
      throw InvalidArgument("bad LOCAL_KERNELS item '" + std::string(rest) +
                            "': expected org/repo=/abs/path (items separated by ':')");
    std::string_view repo = rest.substr(0, eq);
    auto [org, name] = parse_repo_name(repo);
    rest.remove_prefix(eq + 1);
    // The path runs to the ':' that starts the next "org/repo=" item, or to the end.
    size_t end = std::string_view::npos;
    for (size_t pos = rest.find(':'); pos != std::string_view::npos;
         pos = rest.find(':', pos + 1)) {
      std::string_view next = rest.substr(pos + 1);
      size_t next_eq = next.find('=');
      size_t next_colon = next.find(':');
      if (next_eq != std::string_view::npos && next_eq < next_colon &&
          next.substr(0, next_eq).find('/') != std::string_view::npos && next.front() != '/') {
        end = pos;
        break;
      }
    }
    std::string_view path = rest.substr(0, end);
    if (path.empty() || path.front() != '/')
      throw InvalidArgument("bad LOCAL_KERNELS item for " + std::string(repo) + ": path '" +
                            std::string(path) + "' must be absolute");
    std::string key = org + "/" + name;
    if (out.count(key)) throw InvalidArgument("LOCAL_KERNELS names " + key + " twice");
    out[key] = std::string(path);
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return out;
}

}  // namespace hk::hub
