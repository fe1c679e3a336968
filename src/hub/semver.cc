// Semantic versions and version ranges over vX.Y.Z tags (see hk/hub_spec.h for the grammar).
//
// Deliberately small: no pre-release ordering, no wildcards, no "||". A range is a comma-separated
// conjunction of comparisons; anything else is rejected with the offending text quoted.
#include <charconv>

#include "hk/error.h"
#include "hk/hub_spec.h"

namespace hk::hub {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Parses up to three dot-separated non-negative integers; returns the part count or 0 on error.
int parse_parts(std::string_view text, SemVer& out) {
  if (!text.empty() && (text.front() == 'v' || text.front() == 'V')) text.remove_prefix(1);
  if (text.empty()) return 0;
  int values[3] = {0, 0, 0};
  int count = 0;
  while (true) {
    if (count == 3) return 0;
    size_t dot = text.find('.');
    std::string_view part = text.substr(0, dot);
    if (part.empty() || part.size() > 9) return 0;
    for (char c : part)
      if (c < '0' || c > '9') return 0;
    if (part.size() > 1 && part.front() == '0') return 0;  // no leading zeros, as in semver
    std::from_chars(part.data(), part.data() + part.size(), values[count]);
    ++count;
    if (dot == std::string_view::npos) break;
    text.remove_prefix(dot + 1);
  }
  out = SemVer{values[0], values[1], values[2]};
  return count;
}

}  // namespace

std::optional<SemVer> SemVer::try_parse(std::string_view text) {
  SemVer v;
  if (parse_parts(text, v) == 0) return std::nullopt;
  return v;
}

SemVer SemVer::parse(std::string_view text) {
  auto v = try_parse(text);
  if (!v)
    throw InvalidArgument("'" + std::string(text) +
                          "' is not a version; expected MAJOR[.MINOR[.PATCH]] such as 2.1.0");
  return *v;
}

std::string SemVer::str() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

bool looks_like_version_range(std::string_view text) {
  text = trim(text);
  return !text.empty() && (text.front() == '<' || text.front() == '>' || text.front() == '=' ||
                           text.front() == '!' || text.front() == '~');
}

VersionRange VersionRange::parse(std::string_view text) {
  VersionRange range;
  range.text_ = std::string(trim(text));
  auto fail = [&](const std::string& why) -> InvalidArgument {
    return InvalidArgument("bad version range '" + std::string(text) + "': " + why +
                           "; expected comparisons like >=2.0,<3.0 (operators >= > <= < == != ~=)");
  };
  if (range.text_.empty()) throw fail("it is empty");
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    if (item.empty()) throw fail("an empty comparison");
    static constexpr std::pair<std::string_view, Op> kOps[] = {
        {">=", Op::GreaterEqual}, {"<=", Op::LessEqual}, {"==", Op::Equal}, {"!=", Op::NotEqual},
        {"~=", Op::Compatible},   {">", Op::Greater},    {"<", Op::Less}};
    bool found = false;
    for (auto [token, op] : kOps) {
      if (item.substr(0, token.size()) != token) continue;
      std::string_view version_text = trim(item.substr(token.size()));
      SemVer v;
      int parts = parse_parts(version_text, v);
      if (parts == 0) throw fail("'" + std::string(version_text) + "' is not a version");
      if (op == Op::Compatible && parts < 2) throw fail("~= needs at least MAJOR.MINOR");
      range.clauses_.push_back(Clause{op, v, parts});
      found = true;
      break;
    }
    if (!found) throw fail("'" + std::string(item) + "' has no comparison operator");
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return range;
}

bool VersionRange::matches(const SemVer& v) const {
  for (const Clause& c : clauses_) {
    bool ok = true;
    switch (c.op) {
      case Op::GreaterEqual:
        ok = v >= c.version;
        break;
      case Op::Greater:
        ok = v > c.version;
        break;
      case Op::LessEqual:
        ok = v <= c.version;
        break;
      case Op::Less:
        ok = v < c.version;
        break;
      case Op::Equal:
        ok = v == c.version;
        break;
      case Op::NotEqual:
        ok = v != c.version;
        break;
      case Op::Compatible: {
        // ~=X.Y → >=X.Y,<X+1 ; ~=X.Y.Z → >=X.Y.Z,<X.Y+1
        SemVer upper = c.given_parts == 2 ? SemVer{c.version.major + 1, 0, 0}
                                          : SemVer{c.version.major, c.version.minor + 1, 0};
        ok = v >= c.version && v < upper;
        break;
      }
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace hk::hub
