// HubConfig from the environment and the default embedded hub directory.
//
// Environment: HK_ENDPOINT, HK_HUB_DIR (a ':'-separated list), HK_KERNELS_CACHE,
// HF_HUB_OFFLINE / HK_HUB_OFFLINE,
// HK_TRUSTED_ORGS (comma-separated, added to kernels-community), HF_TOKEN, LOCAL_KERNELS.
// Nothing here touches the network or the file system.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "hk/error.h"
#include "hk/hub.h"

namespace hk::hub {
namespace {

std::mutex g_default_mutex;
std::filesystem::path g_default_hub_dir;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_true(const char* name) {
  std::string v = env(name);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "on" || v == "yes" || v == "true";
}

}  // namespace

std::filesystem::path default_hub_dir() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (!g_default_hub_dir.empty()) return g_default_hub_dir;
  // The build puts libhk.so and the embedded hub side by side (<build>/libhk.so, <build>/hub);
  // cmake --install puts the hub under the data dir (HK_INSTALLED_HUB, relative to the libdir).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&default_hub_dir), &info) == 0 || !info.dli_fname)
    return "hub";
  const std::filesystem::path libdir = std::filesystem::path(info.dli_fname).parent_path();
  std::error_code ec;
  if (std::filesystem::is_directory(libdir / "hub", ec)) return libdir / "hub";
#ifdef HK_INSTALLED_HUB
  const std::filesystem::path installed = (libdir / HK_INSTALLED_HUB).lexically_normal();
  if (std::filesystem::is_directory(installed, ec)) return installed;
#endif
  return libdir / "hub";
}

void set_default_hub_dir(const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default_hub_dir = dir;
}

HubConfig HubConfig::from_environment() {
  HubConfig c;
  c.endpoint = env("HK_ENDPOINT");
  // HK_HUB_DIR=a:b:c — the first is hub_dir, the rest are searched after it (empty entries
  // skipped).
  const std::string dirs = env("HK_HUB_DIR");
  for (size_t start = 0; start <= dirs.size();) {
    size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) colon = dirs.size();
    if (colon > start) {
      std::filesystem::path dir = dirs.substr(start, colon - start);
      if (c.hub_dir.empty())
        c.hub_dir = dir;
      else
        c.extra_hub_dirs.push_back(dir);
    }
    start = colon + 1;
  }
  if (c.hub_dir.empty()) c.hub_dir = default_hub_dir();
  if (!env("HK_KERNELS_CACHE").empty()) {
    c.cache_dir = env("HK_KERNELS_CACHE");
  } else if (!env("XDG_CACHE_HOME").empty()) {
    c.cache_dir = std::filesystem::path(env("XDG_CACHE_HOME")) / "hk" / "kernels";
  } else if (!env("HOME").empty()) {
    c.cache_dir = std::filesystem::path(env("HOME")) / ".cache" / "hk" / "kernels";
  } else {
    c.cache_dir = std::filesystem::temp_directory_path() / "hk-kernels-cache";
  }
  c.offline = env_true("HF_HUB_OFFLINE") || env_true("HK_HUB_OFFLINE");
  std::string orgs = env("HK_TRUSTED_ORGS");
  size_t start = 0;
  while (start < orgs.size()) {
    size_t comma = orgs.find(',', start);
    std::string org =
        orgs.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!org.empty()) c.trusted_orgs.push_back(org);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  c.token = env("HF_TOKEN");
  c.local_kernels = parse_local_kernels(env("LOCAL_KERNELS"));
  return c;
}

}  // namespace hk::hub
