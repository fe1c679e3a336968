// Strict parsers of the hub: kernel specs, semver ranges, LOCAL_KERNELS, refs, metadata.json and
// the lockfile. Good input round-trips; bad input is an InvalidArgument that quotes it.
#include <gtest/gtest.h>

#include <functional>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/hub_signing.h"
#include "hub_test_util.h"

namespace hk::hub {
namespace {

TEST(KernelSpec, Forms) {
  auto s = KernelSpec::parse("kernels-community/rmsnorm");
  EXPECT_EQ(s.repo(), "kernels-community/rmsnorm");
  EXPECT_FALSE(s.revision);
  EXPECT_TRUE(s.entry.empty());

  s = KernelSpec::parse("kernels-community/liger-kernels:LigerRMSNorm");
  EXPECT_EQ(s.entry, "LigerRMSNorm");

  s = KernelSpec::parse("org/repo@v2.1.0:Fn");
  EXPECT_EQ(*s.revision, "v2.1.0");
  EXPECT_EQ(s.entry, "Fn");

  s = KernelSpec::parse("kernels-community/flash-attn2@>=2.0,<3.0");
  ASSERT_TRUE(s.version_range);
  EXPECT_TRUE(s.version_range->matches(SemVer{2, 5, 1}));
  EXPECT_FALSE(s.version_range->matches(SemVer{3, 0, 0}));
  EXPECT_EQ(s.str(), "kernels-community/flash-attn2@>=2.0,<3.0");

  s = KernelSpec::parse("/opt/kernels/rmsnorm:RMSNorm");
  EXPECT_EQ(s.kind, KernelSpec::Kind::Local);
  EXPECT_EQ(s.local_path, "/opt/kernels/rmsnorm");
  EXPECT_EQ(s.entry, "RMSNorm");
}

TEST(KernelSpec, RejectsBadInput) {
  for (const char* bad :
       {"", "norepo", "/", "a/", "/x:1bad", "org/re po", "org/repo@", "org/repo:", "org/repo@v1@v2",
        "org/../x", ".org/x", "org/repo@../../x", "org/repo@>=abc", "org/repo:Bad-Name",
        "relative/path/x:E", "~/k:E", "org/repo@>=1,,<2"}) {
    EXPECT_THROW(KernelSpec::parse(bad), InvalidArgument) << bad;
  }
  try {
    KernelSpec::parse("org/re po");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("org/re po"), std::string::npos) << e.what();
  }
}

TEST(SemVer, RangesAndOperators) {
  EXPECT_EQ(SemVer::parse("v1.2.3"), (SemVer{1, 2, 3}));
  EXPECT_EQ(SemVer::parse("2"), (SemVer{2, 0, 0}));
  EXPECT_FALSE(SemVer::try_parse("1.2.3.4"));
  EXPECT_FALSE(SemVer::try_parse("01.2"));
  EXPECT_FALSE(SemVer::try_parse("1.2-rc1"));
  auto r = [](const char* text, SemVer v) { return VersionRange::parse(text).matches(v); };
  EXPECT_TRUE(r(">=1.0", {1, 0, 0}));
  EXPECT_FALSE(r(">1.0", {1, 0, 0}));
  EXPECT_TRUE(r("<=1.2", {1, 2, 0}));
  EXPECT_FALSE(r("<1.2", {1, 2, 0}));
  EXPECT_TRUE(r("==1.2.3", {1, 2, 3}));
  EXPECT_FALSE(r("!=1.2.3", {1, 2, 3}));
  EXPECT_TRUE(r("~=2.1", {2, 9, 0}));
  EXPECT_FALSE(r("~=2.1", {3, 0, 0}));
  EXPECT_TRUE(r("~=2.1.3", {2, 1, 9}));
  EXPECT_FALSE(r("~=2.1.3", {2, 2, 0}));
  EXPECT_TRUE(r(">=1.0, <2.0, !=1.5.0", {1, 4, 0}));
  EXPECT_FALSE(r(">=1.0, <2.0, !=1.5.0", {1, 5, 0}));
  for (const char* bad : {"", ">=", "1.0", "=>1.0", ">=1.0,", "~=2", "<1.x"})
    EXPECT_THROW(VersionRange::parse(bad), InvalidArgument) << bad;
}

TEST(LocalKernels, Parse) {
  auto m = parse_local_kernels("org/a=/abs/a:org/b=/abs/b/c");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m["org/a"], "/abs/a");
  EXPECT_EQ(m["org/b"], "/abs/b/c");
  EXPECT_TRUE(parse_local_kernels("").empty());
  EXPECT_THROW(parse_local_kernels("org/a"), InvalidArgument);
  EXPECT_THROW(parse_local_kernels("org/a=relative"), InvalidArgument);
  EXPECT_THROW(parse_local_kernels("bad=/x"), InvalidArgument);
  EXPECT_THROW(parse_local_kernels("org/a=/x:org/a=/y"), InvalidArgument);
}

TEST(Refs, FilesAndJson) {
  std::string c = testing::commit_id('a');
  EXPECT_EQ(parse_ref_file(c + "\n", "ref"), c);
  EXPECT_THROW(parse_ref_file("main\n", "ref"), InvalidArgument);
  EXPECT_THROW(parse_ref_file(c.substr(1), "ref"), InvalidArgument);
  RefTable t;
  t.branches["v1"] = c;
  t.tags["v1.0.0"] = c;
  RefTable back = parse_refs_json(serialize_refs_json(t), "x");
  EXPECT_EQ(back.branches, t.branches);
  EXPECT_EQ(back.tags, t.tags);
  EXPECT_THROW(parse_refs_json("[]", "x"), InvalidArgument);
  EXPECT_THROW(parse_refs_json(R"({"tags": {"../x": ")" + c + "\"}}", "x"), InvalidArgument);
  EXPECT_THROW(parse_refs_json(R"({"tags": {"v1": "zz"}})", "x"), InvalidArgument);
}

std::string good_metadata() {
  return R"({"name": "rmsnorm", "repo": "kernels-community/rmsnorm", "version": "1.2.0",
    "id": ")" +
         testing::commit_id('c') + R"(", "variant": "hk1-cu130-x86_64-linux",
    "abi": {"major": 1, "minor": 0}, "backend": {"type": "cuda", "version": "13.0", "archs": ["90a", "80"]},
    "os": "linux", "arch": "x86_64", "library": "librmsnorm.so",
    "entries": [{"name": "RMSNorm", "interface": "rms_norm", "interface_version": 1,
                 "modes": ["inference", "training"], "device": "cuda", "min_capability": 80,
                 "dtypes": ["bf16"], "backward": true}],
    "digest": {"sha256": {"librmsnorm.so": ")" +
         std::string(64, 'e') + R"("}},
    "provenance": {"builder": "test"}})";
}

TEST(Metadata, ParsesAndRoundTrips) {
  VariantMetadata m = parse_variant_metadata(good_metadata(), "test");
  EXPECT_EQ(m.backend.archs, (std::vector<std::string>{"90a", "80"}));
  EXPECT_EQ(m.entries.at(0).interface_version, 1);
  EXPECT_TRUE(m.entries.at(0).backward);
  VariantMetadata again = parse_variant_metadata(serialize_variant_metadata(m), "again");
  EXPECT_EQ(again.sha256, m.sha256);
  EXPECT_EQ(again.entry_names(), m.entry_names());
  EXPECT_EQ(again.provenance_json, m.provenance_json);
}

TEST(Metadata, RejectsHostileOrBrokenFields) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = good_metadata();
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const std::pair<std::string, std::string> cases[] = {
      {"\"librmsnorm.so\": \"", "\"../evil.so\": \""},
      {"\"library\": \"librmsnorm.so\"", "\"library\": \"../x.so\""},
      {std::string(64, 'e'), std::string(63, 'e')},
      {"\"type\": \"cuda\"", "\"type\": \"tpu\""},
      {"\"archs\": [\"90a\", \"80\"]", "\"archs\": [\"sm90\"]"},
      {"\"major\": 1", "\"major\": \"1\""},
      {"\"inference\", \"training\"", "\"inference\", \"turbo\""},
      {"\"library\": \"librmsnorm.so\"", "\"library\": \"libother.so\""},  // no digest for it
      {"\"id\": \"", "\"id\": \"x"},
  };
  for (const auto& [from, to] : cases)
    EXPECT_THROW(parse_variant_metadata(with(from, to), "t"), InvalidArgument) << to;
  EXPECT_THROW(parse_variant_metadata("{", "t"), InvalidArgument);
  EXPECT_THROW(parse_variant_metadata("[]", "t"), InvalidArgument);
}

TEST(Lockfile, RoundTripAndStrictness) {
  Lockfile lock;
  LockedRepo r;
  r.repo = "kernels-community/rmsnorm";
  r.version = 1;
  r.commit = testing::commit_id('d');
  r.variants["hk1-cpu-x86_64-linux"]["librmsnorm.so"] = std::string(64, 'a');
  lock.repos.push_back(r);
  Lockfile back = parse_lockfile(serialize_lockfile(lock), "hk.lock");
  ASSERT_EQ(back.repos.size(), 1u);
  EXPECT_EQ(back.repos[0].variants, r.variants);
  EXPECT_EQ(back.find("kernels-community/rmsnorm")->commit, r.commit);
  EXPECT_EQ(back.find("x/y"), nullptr);
  for (
      const char* bad :
      {"{}", "[1]", R"([{"repo": "bad"}])", R"([{"repo": "a/b", "commit": "x", "variants": {}}])",
       R"([{"repo": "a/b", "commit": "dddddddddddddddddddddddddddddddddddddddd", "variants": {"../v": {}}}])",
       R"([{"repo": "a/b", "commit": "dddddddddddddddddddddddddddddddddddddddd", "variants": {"v": {"f": "12"}}}])"})
    EXPECT_THROW(parse_lockfile(bad, "hk.lock"), InvalidArgument) << bad;
  auto deps = parse_project_kernels(R"({"kernels-community/rmsnorm": 1, "org/x": 2})", "p");
  EXPECT_EQ(deps.size(), 2u);
  EXPECT_THROW(parse_project_kernels(R"({"x": 1})", "p"), InvalidArgument);
  EXPECT_THROW(parse_project_kernels(R"({"a/b": "1"})", "p"), InvalidArgument);
}

}  // namespace
}  // namespace hk::hub

namespace hk::hub {
namespace {

// Nesting deep enough to overflow the stack of recursive JSON code (1,000,000 levels), and a key
// given twice, in every hub parser: a sentence each, never a crash or a silently kept last value.
TEST(HubParsers, DeepNestingAndDuplicateKeysAreRefused) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  const std::string sha(64, 'a');
  const std::string metadata =
      R"({"name": "x", "repo": "org/x", "id": ")" + std::string(40, 'c') +
      R"(", "variant": "hk1-cpu-x86_64-linux", "abi": {"major": 1}, "backend": {"type": "cpu"},
         "os": "linux", "arch": "x86_64", "library": "libx.so", "entries": [],
         "digest": {"sha256": {"libx.so": ")" +
      sha + R"("}})";
  EXPECT_NO_THROW(parse_variant_metadata(metadata + "}", "m"));
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message([&] {
              parse_variant_metadata(metadata + R"(, "provenance": )" + deep + "}", "m");
            }).find("nests deeper"),
            std::string::npos);
  EXPECT_NE(message([&] {
              parse_variant_metadata(metadata + R"(, "library": "libevil.so"})", "m");
            }).find("has the key \"library\" twice"),
            std::string::npos);
  EXPECT_NE(message([&] { parse_lockfile(deep, "l"); }).find("nests deeper"), std::string::npos);
  EXPECT_NE(
      message([&] { parse_refs_json("{\"branches\": " + deep + "}", "r"); }).find("nests deeper"),
      std::string::npos);
  EXPECT_NE(message([&] {
              parse_refs_json(R"({"branches": {"v1": ")" + std::string(40, 'a') + R"(", "v1": ")" +
                                  std::string(40, 'b') + R"("}})",
                              "r");
            }).find("twice"),
            std::string::npos);
  EXPECT_NE(
      message([&] { parse_signature("{\"public_key\": " + deep + "}", "s"); }).find("nests deeper"),
      std::string::npos);
  EXPECT_NE(
      message([&] { parse_publisher_keys(R"({"org": ["a"], "org": ["b"]})", "k"); }).find("twice"),
      std::string::npos);
}

}  // namespace
}  // namespace hk::hub
