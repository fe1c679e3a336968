// What the publish step wrote: refs point at commits whose metadata names the right version,
// metadata digests match the files, entries in metadata.json equal the loaded table, and commit
// ids are derived from content (40 hex, distinct per version).
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "hk/kernel_loader.h"
#include "hub_fixture.h"

namespace hk {
namespace {

std::string sha256_file(const std::filesystem::path& path) {
  const std::string data = test::read_text(path);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

// Every metadata.json under `hub`.
std::vector<std::filesystem::path> all_metadata(const std::filesystem::path& hub) {
  std::vector<std::filesystem::path> found;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(hub)) {
    if (entry.path().filename() == "metadata.json") found.push_back(entry.path());
  }
  return found;
}

TEST(PublishedHub, DigestsInMetadataMatchTheFiles) {
  for (const auto& hub : {test::embedded_hub(), test::test_hub()}) {
    const auto metas = all_metadata(hub);
    ASSERT_FALSE(metas.empty()) << hub;
    for (const auto& meta_path : metas) {
      const auto meta = nlohmann::json::parse(test::read_text(meta_path));
      const auto& digests = meta.at("digest").at("sha256");
      ASSERT_FALSE(digests.empty()) << meta_path;
      for (const auto& [file, digest] : digests.items()) {
        EXPECT_EQ(sha256_file(meta_path.parent_path() / file), digest.get<std::string>())
            << meta_path.parent_path() / file;
      }
      EXPECT_TRUE(digests.contains(meta.at("library").get<std::string>()));
      // Layout: <hub>/<org>/<repo>/<commit>/build/<variant>/metadata.json
      const auto variant_dir = meta_path.parent_path();
      const auto commit = variant_dir.parent_path().parent_path().filename().string();
      EXPECT_EQ(meta.at("id"), commit);
      EXPECT_TRUE(std::regex_match(commit, std::regex("[0-9a-f]{40}"))) << commit;
      EXPECT_EQ(meta.at("variant"), variant_dir.filename().string());
      const auto repo_dir = variant_dir.parent_path().parent_path().parent_path();
      EXPECT_EQ(meta.at("repo"),
                repo_dir.parent_path().filename().string() + "/" + repo_dir.filename().string());
      const int abi = meta.at("abi").at("major");
      EXPECT_EQ(variant_dir.filename().string().rfind("hk" + std::to_string(abi) + "-", 0), 0u);
      EXPECT_EQ(meta.at("os"), "linux");
      EXPECT_TRUE(meta.at("provenance").contains("builder"));
    }
  }
}

TEST(PublishedHub, RefsPointAtTheirVersions) {
  const auto hub = test::test_hub();
  const std::string repo = "kernels-community/rmsnorm";
  auto version_of = [&](const std::string& ref) {
    const auto dir = test::variant_dir(hub, repo, ref, "-cpu-");
    return nlohmann::json::parse(test::read_text(dir / "metadata.json")).at("version");
  };
  EXPECT_EQ(version_of("tags/v1.0.0"), "1.0.0");
  EXPECT_EQ(version_of("tags/v1.1.0"), "1.1.0");
  EXPECT_EQ(version_of("tags/v2.0.0"), "2.0.0");
  EXPECT_EQ(version_of("heads/v1"), "1.1.0");
  EXPECT_EQ(version_of("heads/v2"), "2.0.0");
  // Three versions, three commits, nothing else under the repo.
  std::set<std::string> commits;
  for (const auto& entry : std::filesystem::directory_iterator(hub / repo)) {
    if (entry.path().filename() != "refs") commits.insert(entry.path().filename().string());
  }
  EXPECT_EQ(commits.size(), 3u);
  EXPECT_EQ(commits.count(test::ref_commit(hub, repo, "tags/v1.0.0")), 1u);
}

std::string sha1_hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha1(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

TEST(PublishedHub, CommitIdsAreDerivedFromContent) {
  // id = sha1("<repo>\n<version>\n" + sorted lines "<variant> <file> <sha256>" joined by "\n" +
  // "\n")
  for (const std::string ref : {"tags/v1.0.0", "tags/v2.0.0"}) {
    const auto hub = test::test_hub();
    const std::string repo = "kernels-community/rmsnorm";
    const std::string commit = test::ref_commit(hub, repo, ref);
    std::vector<std::string> lines;
    std::string version;
    for (const auto& dir : std::filesystem::directory_iterator(hub / repo / commit / "build")) {
      const auto meta = nlohmann::json::parse(test::read_text(dir.path() / "metadata.json"));
      version = meta.at("version");
      for (const auto& [file, digest] : meta.at("digest").at("sha256").items())
        lines.push_back(dir.path().filename().string() + " " + file + " " +
                        digest.get<std::string>());
    }
    std::sort(lines.begin(), lines.end());
    std::string text = repo + "\n" + version + "\n";
    for (size_t i = 0; i < lines.size(); ++i) text += (i ? "\n" : "") + lines[i];
    EXPECT_EQ(sha1_hex(text + "\n"), commit) << ref;
  }
}

TEST(PublishedHub, MetadataEntriesAreTheLibrarysTable) {
  const auto dir =
      test::variant_dir(test::embedded_hub(), "kernels-community/rmsnorm", "heads/v1", "-cpu-");
  const auto meta = nlohmann::json::parse(test::read_text(dir / "metadata.json"));
  EXPECT_EQ(meta.at("backend").at("type"), "cpu");
  auto lib = load_kernel_library(dir / meta.at("library").get<std::string>());
  EXPECT_EQ(meta.at("version"), lib->version());
  ASSERT_EQ(meta.at("entries").size(), lib->entries().size());
  for (size_t i = 0; i < lib->entries().size(); ++i) {
    const auto& m = meta.at("entries")[i];
    const KernelEntryInfo& e = lib->entries()[i];
    EXPECT_EQ(m.at("name"), e.name);
    EXPECT_EQ(m.at("interface"), e.interface);
    EXPECT_EQ(m.at("interface_version"), e.interface_version);
    EXPECT_EQ(m.at("device"), e.device);
    EXPECT_EQ(m.at("modes").get<std::vector<std::string>>(), kernel_mode_names(e.modes));
    EXPECT_EQ(m.at("dtypes").get<std::vector<std::string>>(), kernel_dtype_names(e.dtypes));
    EXPECT_EQ(m.at("backward"), e.has_backward);
    EXPECT_EQ(m.at("min_capability"), e.min_capability);
    EXPECT_EQ(m.at("max_capability"), e.max_capability);
  }
}

}  // namespace
}  // namespace hk
