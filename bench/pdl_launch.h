// bench/pdl_launch.h — launch_pdl(...): a benchmark program's kernel launch with programmatic
// dependent launch allowed (the attribute the decode kernels are launched with), so a chain of
// such launches overlaps each one's start with its predecessor's tail. CUDA host code only; it
// checks the launch with CK and exits on an error, as the benchmarks do.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.h"

template <class... KernelArgs, class... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KernelArgs>(args)...));
}
