// hk/hub.h — the kernel hub client: name a kernel, get a verified variant for a device, load it.
//
//   hk::hub::Hub hub;                                   // configured from the environment
//   auto res = hub.resolve("kernels-community/rmsnorm@>=1.0,<2.0:RMSNorm",
//                          hk::hub::Target::for_device(hk::Device::cpu()));
//   auto lib = hub.load(res);                           // digests checked, then dlopen
//
// Sources: HK_ENDPOINT (an HTTP hub, e.g. `hk hub serve`) or else a local hub directory
// (HK_HUB_DIR, default: the build's embedded hub). Remote files land in the cache
// (HK_KERNELS_CACHE, default
// ~/.cache/hk/kernels) by sha256, verified before they get their final name; offline mode
// (HF_HUB_OFFLINE / HK_HUB_OFFLINE) resolves from the cache alone with the same rules. Trust, the
// lockfile and the variant rules are described in docs/hub.md.
//
// This header does not define the kernel ABI or the loaded library's interface (hk_abi/hk_kernel.h,
// hk/kernel_loader.h) nor which layer uses which kernel (kernelize).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hk/device.h"
#include "hk/hub_lockfile.h"
#include "hk/hub_metadata.h"
#include "hk/hub_signing.h"
#include "hk/hub_spec.h"

namespace hk {
class KernelLibrary;  // hk/kernel_loader.h
}

namespace hk::hub {

// What a variant must run on: the device plus the runtime facts variant rules compare against.
struct Target {
  Device device;
  // CUDA runtime version as cudaRuntimeGetVersion reports it (13000 = 13.0); 0 = no CUDA runtime.
  int cuda_runtime_version = 0;
  // ROCm / XPU runtime version ("6.3"); variants must match it exactly; empty = unknown.
  std::string runtime_version;
  int abi_major = 1;  // the kernel ABI major this hk speaks (HK_KERNEL_ABI_MAJOR)
  std::string os = "linux";
  std::string arch;  // "x86_64", "aarch64"; host_arch() by default

  // The target for a device on this machine (CUDA runtime version queried when built with CUDA).
  static Target for_device(const Device& device);
  std::string str() const;  // "cuda sm_90, CUDA 13.0, ABI 1, x86_64-linux"
};

std::string host_arch();

// One variant's verdict for a target: accepted (with its rank) or rejected with the reason.
struct VariantDecision {
  std::string variant;
  bool accepted = false;
  std::string reason;  // why accepted ("cuda 13.0 ≤ runtime 13.0, arch 90a = sm_90") or rejected
};

// Applies the variant rules (docs/hub.md) to every variant. The result lists accepted variants
// first, best first, then every rejected one; nothing is dropped silently. `entry` (may be empty)
// rejects variants that lack that entry.
std::vector<VariantDecision> select_variants(const std::vector<VariantMetadata>& variants,
                                             const Target& target, const std::string& entry = {});

struct HubConfig {
  std::string endpoint;           // HK_ENDPOINT ("http://127.0.0.1:8080"); empty = hub_dir
  std::filesystem::path hub_dir;  // HK_HUB_DIR's first entry, else default_hub_dir()
  // HK_HUB_DIR's further entries (a ':'-separated list), searched after hub_dir: a repo comes from
  // the first hub directory that has it, so your kernels combine with the embedded ones.
  std::vector<std::filesystem::path> extra_hub_dirs;
  std::filesystem::path cache_dir;  // HK_KERNELS_CACHE, else ~/.cache/hk/kernels
  bool offline = false;             // HF_HUB_OFFLINE / HK_HUB_OFFLINE = 1|ON|YES|TRUE
  std::vector<std::string> trusted_orgs{"kernels-community"};  // plus HK_TRUSTED_ORGS (a,b)
  std::string token;  // HF_TOKEN, sent as a bearer token to remote hubs
  std::map<std::string, std::string> local_kernels;  // LOCAL_KERNELS: repo → directory

  // hk.lock (HK_KERNELS_LOCK=FILE, set_lock_file): honoured and enforced when set. With a lock,
  // a hub repo it does not pin is refused (IntegrityError) unless `allow_unlocked`
  // (HK_ALLOW_UNLOCKED_KERNELS=1).
  std::optional<Lockfile> lock;
  std::filesystem::path lock_file;  // where `lock` came from (for messages); may be empty
  bool allow_unlocked = false;
  // Signed kernels (hk/hub_signing.h): trusted publisher keys per org (HK_PUBLISHER_KEYS=FILE)
  // and whether every hub kernel must be signed (HK_REQUIRE_SIGNED=1).
  PublisherKeys publisher_keys;
  bool require_signed = false;

  // Limits on what a remote hub can make this process do (docs/security.md).
  long connect_timeout_s = 10;           // HK_HUB_CONNECT_TIMEOUT
  long timeout_s = 600;                  // HK_HUB_TIMEOUT: one fetch (a listing, or a variant's
                                         // metadata + files) must finish within this
  long stall_timeout_s = 30;             // HK_HUB_STALL_TIMEOUT: abort a transfer slower than
  long min_speed_bytes_s = 1024;         // HK_HUB_MIN_SPEED bytes/s for this long
  long lock_timeout_s = 900;             // HK_HUB_LOCK_TIMEOUT: wait for another process's
                                         // per-repo cache lock at most this long
  size_t max_body_bytes = 16u << 20;     // HK_HUB_MAX_BODY: refs, listings, metadata, signatures
  uint64_t max_file_bytes = 8ull << 30;  // HK_HUB_MAX_FILE: one kernel file (a size declared in
                                         // metadata.json is the exact bound, and must be below)
  bool progress = true;                  // progress bar on stderr when it is a TTY

  // Every field above from its environment variable (unset = the default shown). A malformed
  // value (HK_HUB_TIMEOUT=soon, an unreadable HK_KERNELS_LOCK) is an InvalidArgument naming it.
  static HubConfig from_environment();
  // The same plus what LoadOptions or command-line flags add: a lock file (when non-empty) and the
  // two opt-ins, each OR-ed with its environment variable.
  static HubConfig from_environment(const std::filesystem::path& lock_file, bool allow_unlocked,
                                    bool require_signed);
  // Loads `path` as the lock (NotFound / InvalidArgument when it is missing or malformed).
  void set_lock_file(const std::filesystem::path& path);
};

// The embedded hub directory used when HK_HUB_DIR is unset, for the library and the CLI alike:
// set_default_hub_dir's, else <dir of libhk.so>/hub (a build tree), else the installed
// <prefix>/share/hk/hub next to <prefix>/lib (cmake --install puts it there).
std::filesystem::path default_hub_dir();
void set_default_hub_dir(const std::filesystem::path& dir);

struct ResolveOptions {
  std::optional<int> version;           // branch v<version>; default 1 when nothing else pins
  std::optional<std::string> revision;  // tag / branch / commit (a spec's @rev wins over this)
  bool trust_remote_code = false;       // allow repos outside the trusted orgs
  bool fetch = true;                    // download the selected variant into the cache
};

struct Resolution {
  std::string spec;           // the spec as given
  std::string repo;           // "org/repo" (empty for local kernels outside any repo)
  std::string revision;       // what selected the commit: "v1", "v1.2.0", ">=1.0,<2.0", "lock", ...
  std::string commit;         // 40 hex (from metadata for local kernels)
  std::string entry;          // requested entry, may be empty
  std::string variant;        // chosen variant name
  std::filesystem::path dir;  // the variant directory (metadata.json + files)
  VariantMetadata metadata;
  std::vector<VariantDecision> decisions;  // every variant with its verdict
  bool local = false;                      // from a local path / LOCAL_KERNELS
  std::string source;                      // where it came from, for messages
};

class Hub {
 public:
  explicit Hub(HubConfig config = HubConfig::from_environment());
  ~Hub();
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;

  // Spec → commit → variant for the target (→ fetched into the cache when remote). Throws
  // InvalidArgument (bad spec, untrusted org), NotFound (no repo / version / variant: the message
  // lists what exists or why each variant was rejected), RuntimeFailure (hub unreachable).
  Resolution resolve(std::string_view spec, const Target& target,
                     const ResolveOptions& options = {});
  // The same steps without fetching and without throwing when no variant fits: `decisions` says
  // why (what `hk kernels explain` prints). `variant` is empty when none fits.
  Resolution explain(std::string_view spec, const Target& target,
                     const ResolveOptions& options = {});

  // Re-reads metadata.json from the variant directory, checks it against the resolution, the
  // lockfile and the signature policy, checks every file's sha256, and loads the library from one
  // sealed private copy of the bytes it hashed (hk/kernel_loader.h), so nothing that changes the
  // directory meanwhile can change what runs. Memoised per library digest: loading the same bytes
  // twice returns the same library (the digests are still checked on every call). The library's
  // own table must name the repo (and version) that was resolved. Throws IntegrityError naming the
  // file and both digests, the lock, or the key.
  std::shared_ptr<const KernelLibrary> load(const Resolution& resolution);
  // The checks of load() without loading; returns how metadata.json is signed ("signed by
  // publisher key … of org …", "unsigned (trusted by org name)", "local kernel").
  std::string verify(const Resolution& resolution) const;
  // With a lock (and no allow_unlocked): throws IntegrityError unless the lock pins `repo`.
  // resolve() calls it; kernelize calls it first, so an unlocked kernel is an error, not a
  // silent fallback.
  void check_locked(const std::string& repo) const;

  // Listings (through the same source as resolve: remote, hub dir, or cache when offline).
  std::vector<std::string> list_repos();
  RefTable refs(const std::string& repo);
  std::vector<SemVer> versions(const std::string& repo);  // vX.Y.Z tags, ascending
  // Repo + options (+ optional range) → commit, with the pin's name in `revision_out`.
  std::string resolve_commit(const std::string& repo, const ResolveOptions& options,
                             const std::optional<VersionRange>& range = {},
                             std::string* revision_out = nullptr);
  std::vector<VariantMetadata> variants(const std::string& repo, const std::string& commit);
  // The variant's directory, downloading it into the cache first when the source is remote.
  std::filesystem::path fetch_variant(const std::string& repo, const std::string& commit,
                                      const VariantMetadata& metadata);

  const HubConfig& config() const;
  bool is_trusted(const std::string& repo) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// sha256 of a regular file as lower-case hex (OpenSSL EVP). Throws NotFound / InvalidArgument
// (not a regular file) / RuntimeFailure.
std::string sha256_file(const std::filesystem::path& path);
// sha256 of everything in an open file, read from offset 0 (the position is not used).
std::string sha256_fd(int fd, const std::filesystem::path& path_for_messages);
// Verifies every file metadata lists in `dir` (and, when given, against the locked digests).
void verify_variant_dir(const std::filesystem::path& dir, const VariantMetadata& metadata,
                        const std::map<std::string, std::string>* locked = nullptr);

}  // namespace hk::hub
