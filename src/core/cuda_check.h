// Internal: turn CUDA runtime errors into hk::RuntimeFailure with the call that failed.
// Only included by files compiled with HK_HAVE_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "hk/error.h"

namespace hk::detail {
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what) {
  throw RuntimeFailure(std::string("CUDA call ") + what + " failed: " + cudaGetErrorName(err) +
                       " (" + cudaGetErrorString(err) + ")");
}
}  // namespace hk::detail

#define HK_CUDA_CHECK(call)                                              \
  do {                                                                   \
    cudaError_t hk_err_ = (call);                                        \
    if (hk_err_ != cudaSuccess) ::hk::detail::throw_cuda_error(hk_err_, #call); \
  } while (0)

// After a kernel launch: report launch-configuration errors without synchronising.
#define HK_CUDA_CHECK_LAUNCH() HK_CUDA_CHECK(cudaGetLastError())
