// hk/dlpack.h — zero-copy exchange with other frameworks through DLPack.
//
// A TensorView maps field-for-field onto DLTensor (shape/strides point into the view, so the
// DLTensor lives only as long as the view it came from). `to_dlpack` hands out a managed tensor
// that keeps the storage alive until the consumer calls its deleter; `from_dlpack` takes
// ownership of one. Devices other than cpu/cuda/rocm and dtypes hk does not know are rejected.
#pragma once

#include <dlpack/dlpack.h>

#include "hk/tensor.h"

namespace hk {

// Borrowed DLTensor over `view` (valid while `view` lives).
DLTensor to_dltensor(const TensorView& view);
// TensorView over a DLTensor (valid while the DLTensor's memory lives). Throws InvalidArgument on
// an unsupported dtype/device or a rank above kMaxDims.
TensorView from_dltensor(const DLTensor& tensor);

DLManagedTensor* to_dlpack(const Tensor& tensor);
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace hk
