// Hub::load: verify every file's digest (and the lock), then dlopen through the kernel loader.
//
// Memoised per library path, so a library is loaded once per Hub however many layers use it; the
// digests are still checked on every call, because "every load is verified" must also hold for a
// file changed on disk after the first load. Two commits of one repo are two paths, so both load.
#include <mutex>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hub/hub_impl.h"

namespace hk::hub {

namespace {
std::mutex g_loaded_mutex;
// Process-wide: one dlopen per file even across Hub instances (kernelize may make several).
std::map<std::string, std::shared_ptr<const KernelLibrary>>& loaded_libraries() {
  static auto* libs = new std::map<std::string, std::shared_ptr<const KernelLibrary>>();
  return *libs;
}
}  // namespace

std::shared_ptr<const KernelLibrary> Hub::load(const Resolution& res) {
  verify(res);
  std::filesystem::path so = res.dir / res.metadata.library;
  std::error_code ec;
  std::filesystem::path key = std::filesystem::canonical(so, ec);
  if (ec) key = so;
  std::lock_guard<std::mutex> lock(g_loaded_mutex);
  auto& libs = loaded_libraries();
  if (auto it = libs.find(key.string()); it != libs.end()) return it->second;
  std::string label = res.repo.empty() ? res.spec : res.repo + "@" + res.revision;
  auto library = load_kernel_library(so, label);
  libs[key.string()] = library;
  return library;
}

}  // namespace hk::hub
