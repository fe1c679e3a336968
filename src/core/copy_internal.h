// Internal to core: the device halves of copy_view and zero-fill. The CUDA half is in
// copy_cuda.cu and only exists in CUDA builds.
#pragma once

#include "hk/tensor.h"

namespace hk::detail {

// Strided element copy between two same-shape, same-dtype views on one CUDA device.
void cuda_strided_copy(const TensorView& dst, const TensorView& src, Stream stream);
// Host<->device or device<->device copy of `bytes` contiguous bytes (synchronises `stream` when
// host memory is involved, because host buffers are not pinned).
void cuda_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                 Stream stream);
// Sets every byte of a contiguous view to zero.
void zero_contiguous(const TensorView& v, Stream stream);

}  // namespace hk::detail
