// HK_HUB_DIR as a ':'-separated list of hub directories: the first entry is hub_dir, the others
// are searched after it, and each repo comes from the first directory that has it (first match
// wins: a repo shadowed by an earlier directory is not merged with a later one). Your kernels
// combine with the embedded ones this way.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "hk/error.h"
#include "hk/hub.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

fs::path embedded_hub() {
  const char* bin = std::getenv("HK_BINARY_DIR");
  return fs::path(bin ? bin : ".") / "hub";
}

TEST(HubDirList, FirstDirectoryThatHasTheRepoWins) {
  const fs::path mine = fs::temp_directory_path() / ("hk-hub-list-" + std::to_string(getpid()));
  fs::remove_all(mine);
  // "my" hub: a copy of rotary with only its v1 branch (the embedded hub also has v2).
  const fs::path rotary = embedded_hub() / "kernels-community" / "rotary";
  ASSERT_TRUE(fs::exists(rotary / "refs" / "heads" / "v2"));
  fs::create_directories(mine / "kernels-community");
  fs::copy(rotary, mine / "kernels-community" / "rotary", fs::copy_options::recursive);
  fs::remove(mine / "kernels-community" / "rotary" / "refs" / "heads" / "v2");

  setenv("HK_HUB_DIR", (mine.string() + "::" + embedded_hub().string()).c_str(), 1);
  hub::HubConfig config = hub::HubConfig::from_environment();
  unsetenv("HK_HUB_DIR");
  EXPECT_EQ(config.hub_dir, mine);
  ASSERT_EQ(config.extra_hub_dirs.size(), 1u);  // the empty entry is skipped
  EXPECT_EQ(config.extra_hub_dirs[0], embedded_hub());
  config.endpoint.clear();
  config.cache_dir = mine / "cache";
  hub::Hub hub(config);

  // the union of both directories, each repo once
  const auto repos = hub.list_repos();
  EXPECT_EQ(std::count(repos.begin(), repos.end(), "kernels-community/rotary"), 1);
  EXPECT_EQ(std::count(repos.begin(), repos.end(), "kernels-community/rmsnorm"), 1);
  // rmsnorm is only in the embedded hub: found there
  const auto target = hub::Target::for_device(Device::cpu());
  EXPECT_NE(
      hub.resolve("kernels-community/rmsnorm", target).dir.string().find(embedded_hub().string()),
      std::string::npos);
  // rotary is in mine first: it comes from mine, which has no v2 (no fall-through)
  const auto v1 = hub.resolve("kernels-community/rotary", target);
  EXPECT_EQ(v1.dir.string().rfind(mine.string(), 0), 0u) << v1.dir;
  hub::ResolveOptions v2;
  v2.version = 2;
  EXPECT_THROW(hub.resolve("kernels-community/rotary", target, v2), NotFound);
  fs::remove_all(mine);
}

}  // namespace
}  // namespace hk
