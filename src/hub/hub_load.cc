// Hub::verify and Hub::load: what is on disk now is checked — metadata.json against the
// resolution, the lockfile and the signature policy, every file against its digest — and the
// library is loaded from a sealed private copy of the very bytes that were hashed
// (load_verified_kernel_library), so a writer racing the check cannot change what runs.
//
// Memoised per library digest, process-wide: the same bytes load once however many layers or Hub
// instances use them, and two versions of one repo (two digests) load side by side. The digests
// are still checked on every call, because "every load is verified" must also hold for a file
// changed on disk after the first load.
#include <map>
#include <mutex>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hub/hub_impl.h"
#include "hub/hub_source.h"

namespace fs = std::filesystem;

namespace hk::hub {

namespace {

std::mutex g_loaded_mutex;
// sha256 of the library file → the library loaded from those bytes.
std::map<std::string, std::shared_ptr<const KernelLibrary>>& loaded_libraries() {
  static auto* libs = new std::map<std::string, std::shared_ptr<const KernelLibrary>>();
  return *libs;
}

std::string lock_name(const HubConfig& config) {
  return config.lock_file.empty() ? std::string("hk.lock") : config.lock_file.string();
}

}  // namespace

void Hub::check_locked(const std::string& repo) const {
  const HubConfig& c = impl_->config;
  if (!c.lock || c.allow_unlocked || c.lock->find(repo)) return;
  throw IntegrityError("the lockfile " + lock_name(c) + " does not pin kernel repo " + repo +
                       ", so hk will not load it; add it to hk-kernels.json and run `hk kernels "
                       "lock DIR`, or allow kernels outside the lock (HK_ALLOW_UNLOCKED_KERNELS=1, "
                       "--allow-unlocked-kernels, LoadOptions::allow_unlocked_kernels)");
}

std::string Hub::verify(const Resolution& res) const {
  if (res.dir.empty())
    throw InvalidArgument("kernel " + res.spec +
                          " was resolved without fetching; nothing to verify");
  const HubConfig& c = impl_->config;
  // Re-read metadata.json from the directory: what is on disk now is what will be loaded.
  fs::path meta_path = res.dir / "metadata.json";
  const std::string text = read_text_file(meta_path, c.max_body_bytes);
  VariantMetadata on_disk = parse_variant_metadata(text, meta_path.string());
  if (on_disk.sha256 != res.metadata.sha256 || on_disk.library != res.metadata.library ||
      (!res.local &&
       (on_disk.repo != res.repo || on_disk.id != res.commit || on_disk.variant != res.variant)))
    throw IntegrityError("metadata.json of " + res.repo + " in " + res.dir.string() +
                         " changed since the kernel was resolved; resolve it again");
  std::string signature = "local kernel (named by path; not subject to signatures)";
  const std::map<std::string, std::string>* locked_files = nullptr;
  if (!res.local) {
    check_locked(res.repo);
    const LockedRepo* locked = c.lock ? c.lock->find(res.repo) : nullptr;
    if (locked) {
      if (locked->commit != on_disk.id)
        throw IntegrityError("hk.lock pins " + res.repo + " to commit " + locked->commit +
                             " but the kernel in " + res.dir.string() + " is commit " + on_disk.id);
      auto v = locked->variants.find(on_disk.variant);
      if (v == locked->variants.end())
        throw IntegrityError("hk.lock does not pin variant " + on_disk.variant + " of " + res.repo +
                             "; run `hk kernels lock DIR` again");
      locked_files = &v->second;
    }
    signature = check_metadata_signature(
        res.repo, text, read_optional_text_file(res.dir / kSignatureFileName, 1 << 16),
        c.publisher_keys, c.require_signed);
  }
  verify_variant_dir(res.dir, on_disk, locked_files);
  return signature;
}

std::shared_ptr<const KernelLibrary> Hub::load(const Resolution& res) {
  verify(res);  // metadata, lock, signature, every file's digest
  const fs::path so = res.dir / res.metadata.library;
  const std::string& expected = res.metadata.sha256.at(res.metadata.library);
  const std::string label = res.repo.empty() ? res.spec : res.repo + "@" + res.revision;
  std::shared_ptr<const KernelLibrary> library;
  {
    std::lock_guard<std::mutex> lock(g_loaded_mutex);
    auto& libs = loaded_libraries();
    if (auto it = libs.find(expected); it != libs.end()) {
      // Already loaded from verified bytes; the file must still hash to them.
      const std::string actual = sha256_file(so);
      if (actual != expected)
        throw IntegrityError("kernel file " + so.string() + " of " + label + " has sha256 " +
                             actual + " but metadata.json expects " + expected +
                             "; the file was modified — delete it (or the cache entry) and fetch "
                             "the kernel again");
      library = it->second;
    } else {
      library = load_verified_kernel_library(so, expected, label);
      libs[expected] = library;
    }
  }
  // The library's own table must describe what was resolved: a file swapped for another
  // (validly signed, validly hashed) kernel of some other repo is refused here.
  const std::string& want_repo = res.local ? res.metadata.repo : res.repo;
  if (library->repo() != want_repo)
    throw IntegrityError("kernel library " + so.string() + " says it is repo " + library->repo() +
                         " but was resolved as " + want_repo + "; refusing to use it");
  if (!res.metadata.version.empty() && library->version() != res.metadata.version)
    throw IntegrityError("kernel library " + so.string() + " says it is version " +
                         library->version() + " of " + want_repo + " but metadata.json says " +
                         res.metadata.version + "; refusing to use it");
  return library;
}

}  // namespace hk::hub
