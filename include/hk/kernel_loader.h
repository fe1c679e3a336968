// hk/kernel_loader.h — opening a kernel library (.so) and calling its entries.
//
// `load_kernel_library` dlopens one file with RTLD_NOW | RTLD_LOCAL, reads the table returned by
// `hk_kernel_library_v1` (hk_abi/hk_kernel.h) and validates it before anything is called: ABI
// major equal to ours, every entry naming a known layer interface at a known version (see
// hk/layer_interfaces.h), a forward function, and a backward for entries that claim training.
// Anything wrong is refused with an hk::Error naming the file, the entry and what to do; nothing is
// left loaded. The handle is shared: the library is dlclose'd when the last KernelLibrary /
// KernelFunction referring to it goes. Two versions of one repo (two files) load side by side.
//
// `load_verified_kernel_library` is the form the hub uses: it loads a file only if its bytes hash
// to an expected sha256, from a sealed private copy of exactly the bytes it hashed, so nothing
// that changes the file between the check and dlopen can change what runs. Which digest to expect
// (metadata.json, hk.lock, signatures) and trust are the hub's business; this layer does not find,
// download or check trust. It does not choose among entries either: callers (kernelize) pick an
// entry by name, device, capability, dtype and mode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hk/stream.h"
#include "hk/tensor.h"
#include "hk_abi/hk_kernel.h"

namespace hk {

// Modes as in hk_kernel_entry.modes.
enum KernelMode : uint32_t {
  kKernelModeInference = HK_MODE_INFERENCE,
  kKernelModeTraining = HK_MODE_TRAINING,
  kKernelModeCapture = HK_MODE_CAPTURE,
};

// A validated copy of one hk_kernel_entry (strings copied; `raw` points into the library).
struct KernelEntryInfo {
  std::string name;
  std::string interface;
  uint32_t interface_version = 0;
  uint32_t modes = 0;
  std::string device;
  int min_capability = 0;
  int max_capability = 0;  // 0 = no upper bound
  uint32_t dtypes = 0;     // HK_DTYPE_BIT(...) bits
  bool has_backward = false;
  bool has_layout = false;
  const hk_kernel_entry* raw = nullptr;

  bool supports_mode(uint32_t mode_bits) const { return (modes & mode_bits) == mode_bits; }
  bool supports_dtype(DType dtype) const {
    return (dtypes & HK_DTYPE_BIT(static_cast<uint32_t>(dtype))) != 0;
  }
  // True when `capability` (e.g. 90) lies in [min_capability, max_capability or ∞).
  bool supports_capability(int capability) const;
  std::string interface_id() const;  // "rms_norm@1"
};

// Modes / dtypes as the names used in metadata.json ("inference", "bf16", ...).
std::vector<std::string> kernel_mode_names(uint32_t modes);
std::vector<std::string> kernel_dtype_names(uint32_t dtypes);

class KernelFunction;

// One loaded, validated kernel library. Immutable; shared by everyone using its entries.
class KernelLibrary : public std::enable_shared_from_this<KernelLibrary> {
 public:
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::string& repo() const { return repo_; }  // as the table says
  const std::string& version() const { return version_; }
  const std::string& build_id() const { return build_id_; }
  uint32_t abi_major() const { return abi_major_; }
  uint32_t abi_minor() const { return abi_minor_; }
  const std::vector<KernelEntryInfo>& entries() const { return entries_; }

  // Entry by name, or nullptr.
  const KernelEntryInfo* find_entry(const std::string& name) const;
  // Callable for an entry; throws NotFound listing the entries the library has.
  KernelFunction function(const std::string& entry_name) const;

 private:
  friend struct KernelLibraryLoader;
  KernelLibrary() = default;
  void* handle_ = nullptr;
  int image_fd_ = -1;  // the sealed private image it was loaded from (verified loads)
  std::string image_name_;
  std::filesystem::path path_;
  std::string repo_, version_, build_id_;
  uint32_t abi_major_ = 0, abi_minor_ = 0;
  std::vector<KernelEntryInfo> entries_;
};

// Loads and validates `so`. `repo_for_messages` (e.g. "kernels-community/rmsnorm@v1") only makes
// error messages say which repo the file came from; may be empty. Throws:
//   NotFound    — the file does not exist;
//   Error       — dlopen fails (message includes dlerror), or the file lacks hk_kernel_library_v1;
//   Unsupported — a different ABI major, an unknown interface or interface version, a missing
//                 forward, or training claimed without backward.
std::shared_ptr<const KernelLibrary> load_kernel_library(const std::filesystem::path& so,
                                                         const std::string& repo_for_messages = {});

// Loads `so` only if its bytes hash to `expected_sha256` (64 lower-case hex). The file is opened
// once (a regular file, never a FIFO), read through that one descriptor into a private image — a
// memfd sealed against writing, or where memfds are unavailable a 0500 copy in a private 0700
// directory — while hashing, and that image is what dlopen maps. Renaming, replacing or rewriting
// `so` at any moment can make the load fail (IntegrityError naming both digests), never make
// unverified code run. `path()` of the result is `so`. Otherwise the same checks and errors as
// load_kernel_library. Not memoised: every call maps a new copy (Hub::load memoises by digest).
std::shared_ptr<const KernelLibrary> load_verified_kernel_library(
    const std::filesystem::path& so, const std::string& expected_sha256,
    const std::string& repo_for_messages = {});

// Optional pieces of a call.
struct KernelCallOptions {
  Stream stream;
  void* workspace = nullptr;  // device scratch (see KernelFunction::workspace_size)
  size_t workspace_size = 0;
};

// A callable entry. Holds the library alive. Converts TensorViews to hk_tensor (absent optional
// tensors: a default TensorView), calls the kernel and turns a non-OK status into
// hk::RuntimeFailure (or InvalidArgument / Unsupported for those statuses) carrying the kernel's
// own sentence, the entry and the repo.
class KernelFunction {
 public:
  KernelFunction() = default;
  KernelFunction(std::shared_ptr<const KernelLibrary> library, const KernelEntryInfo* entry);

  bool valid() const { return entry_ != nullptr; }
  const KernelEntryInfo& entry() const { return *entry_; }
  const std::shared_ptr<const KernelLibrary>& library() const { return library_; }
  std::string qualified_name() const;  // "kernels-community/rmsnorm:RMSNorm (1.2.0)"

  void forward(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
               const void* attrs, size_t attrs_size, const KernelCallOptions& options = {}) const;
  // Throws Unsupported when the entry has no backward.
  void backward(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                const void* attrs, size_t attrs_size, const KernelCallOptions& options = {}) const;
  // Bytes of workspace the call needs (0 when the entry has no workspace query).
  size_t workspace_size(bool backward_pass, const std::vector<TensorView>& inputs,
                        const std::vector<TensorView>& outputs, const void* attrs,
                        size_t attrs_size) const;

  template <class Attrs>
  void forward(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
               const Attrs& attrs, const KernelCallOptions& options = {}) const {
    forward(inputs, outputs, &attrs, sizeof(Attrs), options);
  }
  template <class Attrs>
  void backward(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                const Attrs& attrs, const KernelCallOptions& options = {}) const {
    backward(inputs, outputs, &attrs, sizeof(Attrs), options);
  }

 private:
  void call(hk_kernel_fn fn, const char* pass, const std::vector<TensorView>& inputs,
            const std::vector<TensorView>& outputs, const void* attrs, size_t attrs_size,
            const KernelCallOptions& options) const;
  std::shared_ptr<const KernelLibrary> library_;
  const KernelEntryInfo* entry_ = nullptr;
};

}  // namespace hk
