// The cache read as a hub, for offline mode: refs as last seen online, and only the variants that
// were downloaded completely. Resolution rules are unchanged; what is missing is a clear NotFound.
#include "hk/error.h"
#include "hk/hub_signing.h"
#include "hk/hub_spec.h"
#include "hub/cache.h"
#include "hub/hub_source.h"

namespace hk::hub {
namespace {

class CacheSource : public HubSource {
 public:
  explicit CacheSource(const KernelCache& cache) : cache_(cache) {}
  std::string describe() const override {
    return "kernel cache " + cache_.root().string() + " (offline mode)";
  }
  bool is_remote() const override { return false; }

  std::vector<std::string> list_repos() override { return cache_.repos(); }

  RefTable refs(const std::string& repo) override {
    auto refs = cache_.load_refs(repo);
    if (!refs)
      throw NotFound("offline mode (HF_HUB_OFFLINE/HK_HUB_OFFLINE) and the kernel cache " +
                     cache_.root().string() + " has nothing for " + repo +
                     "; fetch it once online (e.g. `hk kernels download DIR`) or unset "
                     "HF_HUB_OFFLINE");
    return *refs;
  }

  std::vector<std::string> variant_names(const std::string& repo,
                                         const std::string& commit) override {
    auto names = cache_.variants(repo, commit);
    if (names.empty())
      throw NotFound("offline mode and the kernel cache " + cache_.root().string() +
                     " has no variant of " + repo + " at commit " + commit +
                     "; fetch it once online or unset HF_HUB_OFFLINE");
    return names;
  }

  std::string read_metadata(const std::string& repo, const std::string& commit,
                            const std::string& variant) override {
    return read_text_file(cache_.variant_dir(repo, commit, variant) / "metadata.json", 1 << 20);
  }

  std::optional<std::string> read_signature(const std::string& repo, const std::string& commit,
                                            const std::string& variant) override {
    return read_optional_text_file(cache_.variant_dir(repo, commit, variant) / kSignatureFileName,
                                   1 << 16);
  }

  std::filesystem::path variant_dir(const std::string& repo, const std::string& commit,
                                    const std::string& variant) override {
    return cache_.variant_dir(repo, commit, variant);
  }

  void download(const std::string&, const std::string&, const std::string&, const std::string&, int,
                uint64_t, Deadline) override {
    throw Unsupported("offline mode: nothing can be downloaded");
  }

 private:
  const KernelCache& cache_;
};

}  // namespace

std::unique_ptr<HubSource> make_cache_source(const KernelCache& cache) {
  return std::make_unique<CacheSource>(cache);
}

}  // namespace hk::hub
