// Signed kernels (hk/hub_signing.h): the policy on every verify/load — good signature, missing
// signature, a key the org does not trust, tampered metadata.json, a key trusted for another
// org, HK_REQUIRE_SIGNED — on a local hub directory, over HTTP through the cache (refused before
// any code is downloaded), through the CLI (`hk kernels keygen / sign / verify`) and for a repo
// the SDK signed at publish time (signed-org/rmsnorm in <build>/test-hub). Also: a library whose
// own table names another repo is refused, and `hk kernels lock` never writes through a planted
// hk.lock.tmp or an hk.lock symlink.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/hub_signing.h"
#include "hk/kernel_loader.h"
#include "hub_test_util.h"

namespace hk::hub {
namespace {

using namespace testing;
using namespace std::chrono_literals;

const std::string A = commit_id('a');
const std::string kVariant = "hk1-cpu-x86_64-linux";
// The test publisher key committed for the SDK test (tests/hub/keys/README.md).
const std::string kTestPublisherKey =
    "fcad749c263ecc4c0bab16dacede024e3d0d449f9981010660c0205e5e6f8f36";

class Signing : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path() / "hub";
    for (const char* repo : {"org-a/kern", "org-c/kern"}) {
      write_variant(root_, repo, A, "1.0.0", FakeVariant{});
      write_ref(root_, repo, "heads", "v1", A);
    }
    for (const char* name : {"a", "b", "c"})
      pub_[name] = generate_signing_key(tmp_.path() / (std::string(name) + ".pem"));
    keys_.by_org["org-a"] = {pub_["a"]};
    keys_.by_org["org-b"] = {pub_["b"]};
  }
  fs::path variant(const std::string& repo) const { return root_ / repo / A / "build" / kVariant; }
  void sign(const std::string& repo, const std::string& key) {
    fs::path meta = variant(repo) / "metadata.json";
    save_signature(meta.parent_path() / kSignatureFileName,
                   sign_metadata(read_file(meta), tmp_.path() / (key + ".pem")));
  }
  HubConfig config(bool require = false) const {
    HubConfig c;
    c.hub_dir = root_;
    c.cache_dir = tmp_.path() / "cache";
    c.trusted_orgs = {"org-a", "org-b", "org-c"};
    c.publisher_keys = keys_;
    c.require_signed = require;
    return c;
  }
  std::string verify(const std::string& repo, bool require = false) {
    Hub hub(config(require));
    return hub.verify(hub.resolve(repo, Target::for_device(Device::cpu())));
  }

  TempDir tmp_;
  fs::path root_;
  std::map<std::string, std::string> pub_;
  PublisherKeys keys_;
};

TEST_F(Signing, AGoodSignatureVerifies) {
  sign("org-a/kern", "a");
  EXPECT_EQ(verify("org-a/kern"), "signed by publisher key " + pub_["a"] + " of org org-a");
  EXPECT_EQ(verify("org-a/kern", /*require=*/true),
            "signed by publisher key " + pub_["a"] + " of org org-a");
}

TEST_F(Signing, AMissingSignatureIsRefusedWhenTheOrgHasKeys) {
  std::string m = message_of([&] { verify("org-a/kern"); });
  EXPECT_NE(m.find("kernel repo org-a/kern is not signed"), std::string::npos) << m;
  EXPECT_NE(m.find(pub_["a"]), std::string::npos) << "the sentence names the key: " << m;
}

TEST_F(Signing, AKeyTheOrgDoesNotTrustIsRefused) {
  sign("org-a/kern", "c");
  std::string m = message_of([&] { verify("org-a/kern"); });
  EXPECT_NE(m.find("is signed by key " + pub_["c"] + ", which is not a publisher key of org org-a"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(pub_["a"]), std::string::npos) << m;
}

TEST_F(Signing, AKeyTrustedForAnotherOrgIsRefused) {
  sign("org-a/kern", "b");
  std::string m = message_of([&] { verify("org-a/kern"); });
  EXPECT_NE(m.find("is signed by key " + pub_["b"]), std::string::npos) << m;
  EXPECT_NE(m.find("trusted for org org-b only"), std::string::npos) << m;
}

TEST_F(Signing, TamperedMetadataIsRefused) {
  sign("org-a/kern", "a");
  fs::path meta = variant("org-a/kern") / "metadata.json";
  std::string text = read_file(meta);
  text.replace(text.find("\"1.0.0\""), 7, "\"1.0.1\"");  // any byte changed after signing
  write_file(meta, text);
  std::string m = message_of([&] {
    Hub hub(config());
    Resolution r = hub.resolve("org-a/kern", Target::for_device(Device::cpu()));
    hub.verify(r);
  });
  EXPECT_NE(m.find("does not match its content"), std::string::npos) << m;
  EXPECT_NE(m.find(pub_["a"]), std::string::npos) << m;
}

TEST_F(Signing, RequireSignedRefusesUnsignedAndUnknownOrgs) {
  EXPECT_EQ(verify("org-c/kern"), "unsigned (trusted by org name)");  // the default
  std::string m = message_of([&] { verify("org-c/kern", /*require=*/true); });
  EXPECT_NE(m.find("HK_REQUIRE_SIGNED=1"), std::string::npos) << m;
  EXPECT_NE(m.find("no publisher key is configured for org org-c"), std::string::npos) << m;
  sign("org-c/kern", "c");  // signed, but nobody trusts that key for org-c
  m = message_of([&] { verify("org-c/kern", /*require=*/true); });
  EXPECT_NE(m.find("is signed by key " + pub_["c"]), std::string::npos) << m;
}

TEST_F(Signing, OverHttpTheSignatureIsCheckedBeforeAnyCodeIsDownloaded) {
  sign("org-a/kern", "a");
  ServerProcess server(root_);
  const fs::path keys_file = tmp_.path() / "keys.json";
  write_file(keys_file, "{\"org-a\": [\"" + pub_["a"] + "\"], \"org-c\": [\"" + pub_["a"] + "\"]}");
  auto env = [&](const fs::path& cache) {
    return std::map<std::string, std::string>{{"HK_ENDPOINT", server.url()},
                                              {"HK_KERNELS_CACHE", cache.string()},
                                              {"HK_PUBLISHER_KEYS", keys_file.string()},
                                              {"HK_TRUSTED_ORGS", "org-a,org-c"},
                                              {"HF_HUB_OFFLINE", "<unset>"},
                                              {"HK_KERNELS_LOCK", "<unset>"}};
  };
  TempDir cache;
  auto ok = run_hk({"kernels", "verify", "org-a/kern"}, env(cache.path()));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("signature  signed by publisher key " + pub_["a"]), std::string::npos)
      << ok.out;
  EXPECT_TRUE(fs::exists(cache.path() / "org-a/kern/snapshots" / A / "build" / kVariant /
                         kSignatureFileName));
  // org-c has keys now but its variant is unsigned: refused, and nothing was downloaded.
  auto refused = run_hk({"kernels", "verify", "org-c/kern"}, env(cache.path()));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("is not signed"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(cache.path() / "org-c/kern/blobs"));
}

TEST_F(Signing, TheCliSignsAndKeysAreNeverOverwritten) {
  const fs::path key = tmp_.path() / "cli.pem";
  auto gen = run_hk({"kernels", "keygen", key.string(), "--json"}, {});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  auto j = nlohmann::json::parse(gen.out);
  const std::string pub = j["public_key"];
  EXPECT_EQ(pub, signing_key_public(key));
  auto again = run_hk({"kernels", "keygen", key.string()}, {});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("never overwritten"), std::string::npos) << again.err;
  auto signed_run =
      run_hk({"kernels", "sign", "--key", key.string(), (root_ / "org-a/kern" / A).string()}, {});
  ASSERT_EQ(signed_run.exit_code, 0) << signed_run.err;
  EXPECT_NE(signed_run.out.find("signed  org-a/kern"), std::string::npos) << signed_run.out;
  keys_.by_org["org-a"] = {pub};
  EXPECT_EQ(verify("org-a/kern"), "signed by publisher key " + pub + " of org org-a");
  // Garbage is never signed.
  write_file(tmp_.path() / "junk" / "metadata.json", "{\"not\": \"metadata\"}");
  auto junk =
      run_hk({"kernels", "sign", "--key", key.string(), (tmp_.path() / "junk").string()}, {});
  EXPECT_EQ(junk.exit_code, 1);
}

TEST(SdkSigning, ARepoSignedAtPublishTimeVerifiesAndLoads) {
  fs::path test_hub = binary_dir() / "test-hub";
  ASSERT_TRUE(fs::is_directory(test_hub / "signed-org/rmsnorm")) << "test hub not published";
  HubConfig c;
  c.hub_dir = test_hub;
  c.cache_dir = fs::temp_directory_path() / "hk-sdk-signing-cache";
  c.trusted_orgs = {"kernels-community", "signed-org"};
  c.publisher_keys.by_org["signed-org"] = {kTestPublisherKey};
  c.require_signed = true;
  Hub hub(c);
  Resolution r = hub.resolve("signed-org/rmsnorm", Target::for_device(Device::cpu()));
  EXPECT_EQ(hub.verify(r), "signed by publisher key " + kTestPublisherKey + " of org signed-org");
  auto lib = hub.load(r);
  ASSERT_TRUE(lib);
  EXPECT_EQ(lib->repo(), "signed-org/rmsnorm");
  // The unsigned repos of the same hub are refused under HK_REQUIRE_SIGNED.
  std::string m = message_of([&] {
    hub.load(hub.resolve("kernels-community/rmsnorm", Target::for_device(Device::cpu())));
  });
  EXPECT_NE(m.find("HK_REQUIRE_SIGNED=1"), std::string::npos) << m;
}

TEST(LoaderIdentity, ALibraryWhoseTableNamesAnotherRepoIsRefused) {
  fs::path test_hub = binary_dir() / "test-hub";
  const std::string commit = read_file(test_hub / "kernels-community/rmsnorm/refs/tags/v1.0.0");
  fs::path real =
      test_hub / "kernels-community/rmsnorm" / commit.substr(0, 40) / "build" / kVariant;
  ASSERT_TRUE(fs::exists(real / "librmsnorm.so")) << "test hub not published";
  // A hub that serves rmsnorm's (validly hashed) library as repo kernels-community/impostor.
  TempDir tmp;
  fs::path dir =
      tmp.path() / "hub/kernels-community/impostor" / commit.substr(0, 40) / "build" / kVariant;
  fs::create_directories(dir);
  fs::copy_file(real / "librmsnorm.so", dir / "librmsnorm.so");
  std::string meta = read_file(real / "metadata.json");
  for (size_t at; (at = meta.find("kernels-community/rmsnorm")) != std::string::npos;)
    meta.replace(at, std::string("kernels-community/rmsnorm").size(), "kernels-community/impostor");
  write_file(dir / "metadata.json", meta);
  write_ref(tmp.path() / "hub", "kernels-community/impostor", "heads", "v1", commit.substr(0, 40));
  HubConfig c;
  c.hub_dir = tmp.path() / "hub";
  c.cache_dir = tmp.path() / "cache";
  Hub hub(c);
  Resolution r = hub.resolve("kernels-community/impostor", Target::for_device(Device::cpu()));
  std::string m = message_of([&] { hub.load(r); });
  EXPECT_NE(m.find("says it is repo kernels-community/rmsnorm but was resolved as "
                   "kernels-community/impostor"),
            std::string::npos)
      << m;
}

TEST(LockfileWriting, APlantedTempFileOrSymlinkIsNeverWrittenThrough) {
  TempDir tmp;
  fs::path hub_root = tmp.path() / "hub";
  write_variant(hub_root, "kernels-community/norm", A, "1.0.0", FakeVariant{});
  write_ref(hub_root, "kernels-community/norm", "heads", "v1", A);
  fs::path project = tmp.path() / "project";
  write_file(project / "hk-kernels.json", "{\"kernels-community/norm\": 1}");
  fs::path victim = tmp.path() / "victim";
  write_file(victim, "precious\n");
  fs::create_symlink(victim, project / "hk.lock.tmp");  // the old fixed temp name
  std::map<std::string, std::string> env{{"HK_HUB_DIR", hub_root.string()},
                                         {"HK_ENDPOINT", "<unset>"},
                                         {"HK_KERNELS_LOCK", "<unset>"},
                                         {"HK_KERNELS_CACHE", (tmp.path() / "cache").string()}};
  auto r = run_hk({"kernels", "lock", project.string()}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(victim), "precious\n");
  EXPECT_EQ(load_lockfile(project / "hk.lock").repos.at(0).commit, A);
  // A symlink at hk.lock itself is replaced, not followed.
  fs::remove(project / "hk.lock");
  fs::create_symlink(victim, project / "hk.lock");
  r = run_hk({"kernels", "lock", project.string()}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(victim), "precious\n");
  EXPECT_FALSE(fs::is_symlink(project / "hk.lock"));
}

}  // namespace
}  // namespace hk::hub
