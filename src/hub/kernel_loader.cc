// The dlopen loader: opens one kernel library, validates its table, and calls its entries.
//
// Validation happens once, at load, so that a library hk cannot call safely is refused with a
// sentence before any of its functions runs (apart from its static initialisers, which dlopen
// runs — which is why trust is checked by the hub before a file gets here). Calls convert
// TensorViews to hk_tensor with the SDK's conversion (one definition for both sides) and check
// that tensors live on the entry's device, the one mistake that would otherwise crash.
#include "hk/kernel_loader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

#include "core/file_io.h"
#include "hk/error.h"
#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"
#include "hub/sha256.h"

namespace hk {
namespace {

// Closes a handle unless released (for the refusal paths).
struct HandleGuard {
  void* handle;
  ~HandleGuard() {
    if (handle != nullptr) dlclose(handle);
  }
};

std::string describe(const std::filesystem::path& so, const std::string& repo) {
  std::string text = "kernel library " + so.string();
  if (!repo.empty()) text += " (" + repo + ")";
  return text;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string copy_string(const char* s) {
  return s != nullptr ? std::string(s) : std::string();
}

// The first entry field added after ABI 1.0 would go after `layout`; a 1.0 table must hold all.
constexpr size_t kMinEntrySize = offsetof(hk_kernel_entry, layout) + sizeof(const hk_layout*);

}  // namespace

bool KernelEntryInfo::supports_capability(int capability) const {
  if (min_capability > 0 && capability < min_capability) return false;
  if (max_capability > 0 && capability > max_capability) return false;
  return true;
}

std::string KernelEntryInfo::interface_id() const {
  return interface + "@" + std::to_string(interface_version);
}

std::vector<std::string> kernel_mode_names(uint32_t modes) {
  std::vector<std::string> names;
  for (uint32_t bit : {HK_MODE_INFERENCE, HK_MODE_TRAINING, HK_MODE_CAPTURE}) {
    if (modes & bit) names.emplace_back(sdk::mode_bit_name(bit));
  }
  return names;
}

std::vector<std::string> kernel_dtype_names(uint32_t dtypes) {
  std::vector<std::string> names;
  for (int32_t code = 0; code < sdk::kNumDtypeCodes; ++code) {
    if (dtypes & HK_DTYPE_BIT(code)) names.emplace_back(sdk::dtype_code_name(code));
  }
  return names;
}

KernelLibrary::~KernelLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
  if (image_fd_ >= 0) {
    // The loader remembers objects by name ("/proc/self/fd/N"). If the library stays mapped after
    // dlclose (a library can pin itself), keep N open forever so no later image gets that name
    // and is mistaken for this one.
    void* still = dlopen(image_name_.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (still != nullptr) {
      dlclose(still);
    } else {
      ::close(image_fd_);
    }
  }
}

const KernelEntryInfo* KernelLibrary::find_entry(const std::string& name) const {
  for (const KernelEntryInfo& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

KernelFunction KernelLibrary::function(const std::string& entry_name) const {
  const KernelEntryInfo* entry = find_entry(entry_name);
  if (entry == nullptr) {
    std::vector<std::string> names;
    for (const KernelEntryInfo& e : entries_) names.push_back(e.name);
    throw NotFound("kernel library " + path_.string() + " (" + repo_ + " " + version_ +
                   ") has no entry '" + entry_name + "'; it has: " + join(names));
  }
  return KernelFunction(shared_from_this(), entry);
}

// Opens an image with dlopen and validates its table; `so` is what messages and path() show,
// `dlopen_name` what dlopen opens (the file itself, or a private verified image of it).
struct KernelLibraryLoader {
  static std::shared_ptr<const KernelLibrary> open(const std::filesystem::path& so,
                                                   const std::string& dlopen_name, int image_fd,
                                                   const std::string& repo_for_messages);
};

std::shared_ptr<const KernelLibrary> load_kernel_library(const std::filesystem::path& so,
                                                         const std::string& repo_for_messages) {
  const std::string what = describe(so, repo_for_messages);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(so, ec)) {
    throw NotFound(what +
                   " does not exist or is not a file; download the repo again (hk kernels "
                   "download) or check the path");
  }
  return KernelLibraryLoader::open(so, so.string(), -1, repo_for_messages);
}

namespace {

// The bytes of `so`, hashed on the way into a private image that nobody else can change.
struct PrivateImage {
  files::Fd fd;             // memfd (sealed), or -1 for the directory fallback
  std::string dlopen_name;  // "/proc/self/fd/N", or the private copy's path
  std::filesystem::path private_dir;
  std::string sha256;
  ~PrivateImage() {
    if (!private_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(private_dir, ec);  // the mapping outlives the name
    }
  }
};

void copy_hashing(int from, const std::filesystem::path& so, hub::Sha256& sha,
                  const std::function<void(const char*, size_t)>& write) {
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeFailure("cannot read kernel library " + so.string());
    if (n == 0) break;
    sha.update(buffer, static_cast<size_t>(n));
    write(buffer, static_cast<size_t>(n));
  }
}

void write_all(int fd, const char* data, size_t size, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw RuntimeFailure("cannot write a private copy of " + what + ": " + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void make_private_image(const std::filesystem::path& so, const std::string& what,
                        PrivateImage& image) {
  files::Fd source = files::open_regular(so, "kernel library");
  hub::Sha256 sha;
  const bool have_proc = ::access("/proc/self/fd", X_OK) == 0;
  int memfd = have_proc ? ::memfd_create("hk-kernel", MFD_CLOEXEC | MFD_ALLOW_SEALING) : -1;
  if (memfd >= 0) {
    image.fd = files::Fd(memfd);
    copy_hashing(source.get(), so, sha,
                 [&](const char* p, size_t n) { write_all(memfd, p, n, what); });
    // From here on nobody, this process included, can change the image.
    if (::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
      throw RuntimeFailure("cannot seal the private copy of " + what + ": " + std::strerror(errno));
    image.dlopen_name = "/proc/self/fd/" + std::to_string(memfd);
  } else {
    // No memfd (or no /proc): a read-only copy in a fresh directory only this user can enter.
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/hk-kernel-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr)
      throw RuntimeFailure("cannot create a private directory to load " + what + ": " +
                           std::strerror(errno));
    image.private_dir = pattern;
    files::TempFile copy(image.private_dir, ".so", 0500);
    copy_hashing(source.get(), so, sha, [&](const char* p, size_t n) { copy.write(p, n, what); });
    std::filesystem::path final_path = image.private_dir / "image.so";
    copy.commit(final_path);
    image.dlopen_name = final_path.string();
  }
  image.sha256 = sha.hex();
}

}  // namespace

std::shared_ptr<const KernelLibrary> load_verified_kernel_library(
    const std::filesystem::path& so, const std::string& expected_sha256,
    const std::string& repo_for_messages) {
  const std::string what = describe(so, repo_for_messages);
  PrivateImage image;
  try {
    make_private_image(so, what, image);
  } catch (const NotFound&) {
    throw NotFound(what +
                   " does not exist or is not a file; download the repo again (hk kernels "
                   "download) or check the path");
  }
  if (image.sha256 != expected_sha256)
    throw IntegrityError("kernel file " + so.string() + (repo_for_messages.empty() ? "" : " of ") +
                         repo_for_messages + " has sha256 " + image.sha256 +
                         " but metadata.json expects " + expected_sha256 +
                         "; the file is corrupt or was modified — delete it (or the cache entry) "
                         "and fetch the kernel again");
  auto library =
      KernelLibraryLoader::open(so, image.dlopen_name, image.fd.get(), repo_for_messages);
  image.fd.release();  // owned by the library now
  return library;
}

std::shared_ptr<const KernelLibrary> KernelLibraryLoader::open(
    const std::filesystem::path& so, const std::string& dlopen_name, int image_fd,
    const std::string& repo_for_messages) {
  const std::string what = describe(so, repo_for_messages);
  // A name already known to the loader would return that object instead of opening this image.
  if (image_fd >= 0) {
    if (void* stale = dlopen(dlopen_name.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
      dlclose(stale);
      throw RuntimeFailure("cannot load " + what + ": the loader already has an object named " +
                           dlopen_name + "; this should not happen, please report it");
    }
  }
  dlerror();
  HandleGuard guard{dlopen(dlopen_name.c_str(), RTLD_NOW | RTLD_LOCAL)};
  if (guard.handle == nullptr) {
    const char* reason = dlerror();
    throw Error("cannot load " + what + ": " + (reason ? reason : "unknown dlopen error") +
                "; check that it was built for this platform and that its dependencies are "
                "installed");
  }

  auto* symbol =
      reinterpret_cast<hk_kernel_library_fn>(dlsym(guard.handle, HK_KERNEL_LIBRARY_SYMBOL));
  if (symbol == nullptr) {
    // A library of another ABI major exports hk_kernel_library_v<major>: say so precisely.
    for (int major = 2; major <= 9; ++major) {
      const std::string other = "hk_kernel_library_v" + std::to_string(major);
      if (dlsym(guard.handle, other.c_str()) != nullptr) {
        throw Unsupported(what + " was built for hk kernel ABI " + std::to_string(major) +
                          " (it exports " + other + "), this hk speaks " +
                          std::to_string(HK_KERNEL_ABI_MAJOR) +
                          "; rebuild the kernel or use a matching version");
      }
    }
    throw Error(what + " does not export the symbol " HK_KERNEL_LIBRARY_SYMBOL
                       "; it is not an hk kernel library (build it with hk_add_kernel_repo and "
                       "HK_KERNEL_LIBRARY from hk/kernel_sdk.h)");
  }

  const hk_kernel_library* table = symbol();
  if (table == nullptr) throw Error(what + ": " HK_KERNEL_LIBRARY_SYMBOL " returned no table");
  if (table->abi_major != HK_KERNEL_ABI_MAJOR) {
    throw Unsupported(what + " was built for hk kernel ABI " + std::to_string(table->abi_major) +
                      ", this hk speaks " + std::to_string(HK_KERNEL_ABI_MAJOR) +
                      "; rebuild the kernel or use a matching version");
  }
  if (table->num_entries > 0 && (table->entries == nullptr || table->entry_size < kMinEntrySize)) {
    throw Unsupported(what + " has a malformed entry table (entry size " +
                      std::to_string(table->entry_size) + ", expected at least " +
                      std::to_string(kMinEntrySize) + "); rebuild it with hk's kernel SDK");
  }

  std::shared_ptr<KernelLibrary> library(new KernelLibrary());
  library->path_ = so;
  library->image_fd_ = image_fd;
  library->image_name_ = dlopen_name;
  library->repo_ = copy_string(table->repo);
  library->version_ = copy_string(table->version);
  library->build_id_ = copy_string(table->build_id);
  library->abi_major_ = table->abi_major;
  library->abi_minor_ = table->abi_minor;

  const char* base = reinterpret_cast<const char*>(table->entries);
  for (uint32_t i = 0; i < table->num_entries; ++i) {
    const auto* raw =
        reinterpret_cast<const hk_kernel_entry*>(base + size_t{i} * table->entry_size);
    KernelEntryInfo info;
    info.raw = raw;
    info.name = copy_string(raw->name);
    info.interface = copy_string(raw->interface);
    info.interface_version = raw->interface_version;
    info.modes = raw->modes;
    info.device = copy_string(raw->device);
    info.min_capability = raw->min_capability;
    info.max_capability = raw->max_capability;
    info.dtypes = raw->dtypes;
    info.has_backward = raw->backward != nullptr;
    info.has_layout = raw->layout != nullptr;

    const std::string entry = "entry #" + std::to_string(i) +
                              (info.name.empty() ? std::string() : " '" + info.name + "'") +
                              " of " + what;
    if (info.name.empty()) throw Unsupported(entry + " has no name; fix the kernel's entry table");
    if (info.device.empty())
      throw Unsupported(entry + " names no device type; fix the kernel's entry table");
    if (find_interface(info.interface, info.interface_version) == nullptr) {
      std::vector<uint32_t> versions = known_interface_versions(info.interface);
      std::string known;
      if (versions.empty()) {
        std::vector<std::string> names;
        for (const InterfaceInfo& known_info : known_interfaces()) {
          if (names.empty() || names.back() != known_info.name) names.emplace_back(known_info.name);
        }
        known = "hk knows no interface named '" + info.interface + "'; known: " + join(names);
      } else {
        std::vector<std::string> ids;
        for (uint32_t v : versions) ids.push_back(info.interface + "@" + std::to_string(v));
        known = "known versions: " + join(ids);
      }
      throw Unsupported(entry + " implements " + info.interface_id() +
                        ", which this hk does not know (" + known +
                        "); use a kernel version built for this hk, or upgrade hk");
    }
    if (raw->forward == nullptr)
      throw Unsupported(entry + " has no forward function; fix the kernel's entry table");
    if ((info.modes & HK_MODE_TRAINING) && raw->backward == nullptr) {
      throw Unsupported(entry +
                        " claims training mode but has no backward function; training "
                        "kernels must provide backward");
    }
    if (info.min_capability > 0 && info.max_capability > 0 &&
        info.max_capability < info.min_capability) {
      throw Unsupported(entry + " has an empty capability range " +
                        std::to_string(info.min_capability) + ".." +
                        std::to_string(info.max_capability));
    }
    for (const KernelEntryInfo& earlier : library->entries_) {
      if (earlier.name == info.name && earlier.device == info.device) {
        throw Unsupported(entry + " is declared twice for device " + info.device +
                          "; entry names must be unique per device");
      }
    }
    library->entries_.push_back(std::move(info));
  }

  library->handle_ = guard.handle;
  guard.handle = nullptr;
  return library;
}

// ---- KernelFunction -----------------------------------------------------------------------------

KernelFunction::KernelFunction(std::shared_ptr<const KernelLibrary> library,
                               const KernelEntryInfo* entry)
    : library_(std::move(library)), entry_(entry) {}

std::string KernelFunction::qualified_name() const {
  if (!valid()) return "(no kernel)";
  return library_->repo() + ":" + entry_->name + " (" + library_->version() + ")";
}

namespace {

struct PreparedCall {
  std::vector<hk_tensor> inputs, outputs;
  char message[1024] = {};
  hk_call call{};
};

void prepare(PreparedCall& p, const KernelEntryInfo& entry, const std::string& name,
             const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
             const void* attrs, size_t attrs_size, const KernelCallOptions& options) {
  auto convert = [&](const std::vector<TensorView>& views, std::vector<hk_tensor>& out,
                     const char* kind) {
    out.reserve(views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      const TensorView& v = views[i];
      const bool absent = v.data == nullptr && v.ndim == 0;
      if (!absent && entry.device != device_type_name(v.device.type)) {
        throw InvalidArgument("kernel " + name + " runs on " + entry.device + " but " + kind +
                              " #" + std::to_string(i) + " is on " + v.device.str() +
                              "; move the tensors or pick a kernel for that device");
      }
      out.push_back(sdk::to_hk_tensor(v));
    }
  };
  convert(inputs, p.inputs, "input");
  convert(outputs, p.outputs, "output");
  p.call.struct_size = sizeof(hk_call);
  p.call.num_inputs = static_cast<int32_t>(p.inputs.size());
  p.call.inputs = p.inputs.data();
  p.call.num_outputs = static_cast<int32_t>(p.outputs.size());
  p.call.outputs = p.outputs.data();
  p.call.attrs = attrs;
  p.call.attrs_size = attrs != nullptr ? attrs_size : 0;
  p.call.workspace = options.workspace;
  p.call.workspace_size = options.workspace_size;
  p.call.stream = options.stream.handle;
  p.call.error_message = p.message;
  p.call.error_message_size = sizeof(p.message);
}

[[noreturn]] void throw_status(hk_status status, const std::string& name, const char* pass,
                               const char* message) {
  std::string text = "kernel " + name + " " + pass + " failed";
  text += message[0] != '\0' ? std::string(": ") + message : std::string(" without a message");
  switch (status) {
    case HK_STATUS_INVALID_ARGUMENT:
      throw InvalidArgument(text);
    case HK_STATUS_UNSUPPORTED:
      throw Unsupported(text);
    case HK_STATUS_OUT_OF_MEMORY:
      throw RuntimeFailure(text + " (out of memory)");
    default:
      throw RuntimeFailure(text + " (status " + std::to_string(status) + ")");
  }
}

}  // namespace

void KernelFunction::call(hk_kernel_fn fn, const char* pass, const std::vector<TensorView>& inputs,
                          const std::vector<TensorView>& outputs, const void* attrs,
                          size_t attrs_size, const KernelCallOptions& options) const {
  if (!valid()) throw InvalidArgument("call of an empty KernelFunction");
  PreparedCall p;
  prepare(p, *entry_, qualified_name(), inputs, outputs, attrs, attrs_size, options);
  const hk_status status = fn(&p.call);
  if (status != HK_STATUS_OK) throw_status(status, qualified_name(), pass, p.message);
}

void KernelFunction::forward(const std::vector<TensorView>& inputs,
                             const std::vector<TensorView>& outputs, const void* attrs,
                             size_t attrs_size, const KernelCallOptions& options) const {
  if (!valid()) throw InvalidArgument("call of an empty KernelFunction");
  call(entry_->raw->forward, "forward", inputs, outputs, attrs, attrs_size, options);
}

void KernelFunction::backward(const std::vector<TensorView>& inputs,
                              const std::vector<TensorView>& outputs, const void* attrs,
                              size_t attrs_size, const KernelCallOptions& options) const {
  if (!valid()) throw InvalidArgument("call of an empty KernelFunction");
  if (entry_->raw->backward == nullptr) {
    throw Unsupported("kernel " + qualified_name() +
                      " has no backward; use it in inference mode only");
  }
  call(entry_->raw->backward, "backward", inputs, outputs, attrs, attrs_size, options);
}

size_t KernelFunction::workspace_size(bool backward_pass, const std::vector<TensorView>& inputs,
                                      const std::vector<TensorView>& outputs, const void* attrs,
                                      size_t attrs_size) const {
  if (!valid()) throw InvalidArgument("call of an empty KernelFunction");
  if (entry_->raw->workspace_size == nullptr) return 0;
  PreparedCall p;
  prepare(p, *entry_, qualified_name(), inputs, outputs, attrs, attrs_size, {});
  size_t bytes = 0;
  const hk_status status = entry_->raw->workspace_size(
      &p.call, backward_pass ? HK_PASS_BACKWARD : HK_PASS_FORWARD, &bytes);
  if (status != HK_STATUS_OK) throw_status(status, qualified_name(), "workspace query", p.message);
  return bytes;
}

}  // namespace hk
