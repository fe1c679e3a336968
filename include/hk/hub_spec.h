// hk/hub_spec.h — how a kernel is named: repo ids, revisions, semver ranges, local overrides.
//
// A kernel spec is one of
//   org/repo                      the repo at its default version (branch v1)
//   org/repo:Entry                one entry (layer implementation) of the repo
//   org/repo@rev[:Entry]          rev = a tag (v1.2.0), a branch (v2) or a 40-hex commit id
//   org/repo@>=2.0,<3.0[:Entry]   a semver range over the repo's vX.Y.Z tags (comma = and)
//   /abs/path[:Entry]             a local kernel directory (a variant dir or a repo build tree)
// plus `version N` (branch vN) given separately, and the LOCAL_KERNELS environment variable
// (`org/repo=/path:org/b=/path`) that redirects repos to local directories.
//
// Parsers are strict: anything outside the grammar is rejected with an hk::InvalidArgument that
// quotes the input and says what was expected. This header does not resolve anything; see hub.h.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hk::hub {

// A semantic version MAJOR.MINOR.PATCH (pre-release/build suffixes are not supported: tags that
// carry them are not versions for range matching).
struct SemVer {
  int major = 0, minor = 0, patch = 0;

  // Parses "1", "1.2", "1.2.3" with an optional leading 'v'; missing parts are 0.
  // Throws InvalidArgument. `try_parse` returns nullopt instead (used to sift tags).
  static SemVer parse(std::string_view text);
  static std::optional<SemVer> try_parse(std::string_view text);
  std::string str() const;  // "1.2.3"

  friend auto operator<=>(const SemVer&, const SemVer&) = default;
};

// A conjunction of comparisons: ">=2.0,<3.0", "==1.2.0", "!=1.1.0", "~=2.1" (PEP 440 compatible
// release: ~=2.1 means >=2.1,<3; ~=2.1.3 means >=2.1.3,<2.2).
class VersionRange {
 public:
  enum class Op { GreaterEqual, Greater, LessEqual, Less, Equal, NotEqual, Compatible };
  struct Clause {
    Op op;
    SemVer version;
    int given_parts;  // how many of major.minor.patch were written (for ~=)
  };

  static VersionRange parse(std::string_view text);  // throws InvalidArgument
  bool matches(const SemVer& version) const;
  const std::vector<Clause>& clauses() const { return clauses_; }
  const std::string& str() const { return text_; }

 private:
  std::vector<Clause> clauses_;
  std::string text_;
};

// Whether text looks like a range rather than a revision (starts with a comparison operator).
bool looks_like_version_range(std::string_view text);

// A parsed kernel spec (see the grammar above).
struct KernelSpec {
  enum class Kind { Hub, Local };
  Kind kind = Kind::Hub;
  std::string org;                            // Hub only
  std::string name;                           // Hub only: the repo name within the org
  std::optional<std::string> revision;        // @tag / @branch / @commit
  std::optional<VersionRange> version_range;  // @>=2.0,<3.0
  std::string entry;                          // ":Entry", empty when absent
  std::string local_path;                     // Local only: absolute path

  static KernelSpec parse(std::string_view text);        // throws InvalidArgument
  std::string repo() const { return org + "/" + name; }  // "org/repo"
  std::string str() const;                               // canonical text form
};

// Validates "org/repo" and splits it; throws InvalidArgument naming the offending part.
std::pair<std::string, std::string> parse_repo_name(std::string_view text);

// Validates a revision (tag/branch/commit) text; throws InvalidArgument.
void check_revision_name(std::string_view text);

// Whether text is a full 40-hex commit id (lower case).
bool is_commit_id(std::string_view text);

// LOCAL_KERNELS: "org/repo=/abs/path:org/b=/abs/path" → {"org/repo": "/abs/path", ...}.
// Empty text → empty map. Throws InvalidArgument on a malformed item (quoting it).
std::map<std::string, std::string> parse_local_kernels(std::string_view text);

}  // namespace hk::hub
