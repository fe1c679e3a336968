// Fuzz target for the safetensors reader (hk/safetensors.h), through the in-memory entry point
// SafetensorsFile::from_bytes so no file system is involved.
//
// Two readings of the input, chosen by its first byte, so the fuzzer spends time past the
// validator as well as in it. Raw (first byte not 0xff): the input is a whole file. Assembled
// (first byte 0xff): bytes 1-2 are a little-endian data size N and the rest is the header text;
// the harness adds the length prefix and N bytes of patterned data. Random mutations of a raw file
// almost never keep the strict tiling rule, assembled ones often do, reaching load/convert/view.
//
// Valid outcomes for any input: an hk::Error with a non-empty message (rejected), or a file whose
// every loadable tensor can be loaded, converted and viewed with consistent sizes. Anything else
// — a crash, an ASan report, a non-hk exception escaping, an inconsistency — is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hk/error.h"
#include "hk/safetensors.h"

namespace {

std::string assemble(const uint8_t* data, size_t size) {
  const size_t data_size = data[1] | (static_cast<size_t>(data[2]) << 8);
  const uint64_t header_len = size - 3;
  std::string file(reinterpret_cast<const char*>(&header_len), 8);
  file.append(reinterpret_cast<const char*>(data + 3), size - 3);
  for (size_t i = 0; i < data_size; ++i) file.push_back(static_cast<char>(i * 131 + 7));
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string assembled;
  if (size >= 3 && data[0] == 0xff) {
    assembled = assemble(data, size);
    data = reinterpret_cast<const uint8_t*>(assembled.data());
    size = assembled.size();
  }
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
