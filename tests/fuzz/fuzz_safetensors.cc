// Fuzz target for the safetensors reader (hk/safetensors.h), through the in-memory entry point
// SafetensorsFile::from_bytes so no file system is involved.
//
// Valid outcomes for any input: an hk::Error with a non-empty message (rejected), or a file whose
// every loadable tensor can be loaded, converted and viewed with consistent sizes. Anything else
// — a crash, an ASan report, a non-hk exception escaping, an inconsistency — is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "hk/error.h"
#include "hk/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const hk::SafetensorsFile file = hk::SafetensorsFile::from_bytes(data, size, "fuzz-input");
    uint64_t covered = 0;
    for (const hk::TensorInfo& t : file.tensors()) {
      if (file.find(t.name) != &t) std::abort();
      covered += t.nbytes();
      if (!t.dtype || t.shape.size() > static_cast<size_t>(hk::kMaxDims)) continue;
      const hk::Tensor loaded = file.load(t.name);
      if (loaded.nbytes() != t.nbytes()) std::abort();
      const hk::Tensor as_f32 = file.load(t.name, hk::Device::cpu(), hk::DType::F32);
      if (as_f32.numel() != t.numel()) std::abort();
      try {
        const hk::TensorView view = file.view(t.name);
        if (t.nbytes() && std::memcmp(view.ptr(), loaded.view().ptr(), t.nbytes()) != 0)
          std::abort();
      } catch (const hk::Unsupported&) {  // unaligned data: load() is the way
      }
    }
    if (covered != file.data_bytes()) std::abort();  // tensors must tile the buffer
  } catch (const hk::Error& e) {
    if (e.what()[0] == '\0') std::abort();
  }
  return 0;
}
