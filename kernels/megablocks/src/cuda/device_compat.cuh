// device_compat.cuh — the few constructs of the cuda variant that a CPU emulation of the device
// replaces: kernel launches (MB_LAUNCH), dynamic shared memory (MB_EXTERN_SHARED) and the PTX
// wrappers (ptx.cuh). A normal nvcc build gets the real ones. With MEGABLOCKS_DEVICE_EMULATION set
// to a header path, the sources compile as host C++ against that header instead, which runs the
// kernels on emulated threads and warps (tests/unit/moe/device_emulation.h: the CPU test of the
// cuda variant's logic).
#pragma once

#if defined(MEGABLOCKS_DEVICE_EMULATION)
#include MEGABLOCKS_DEVICE_EMULATION
#else
#include <cuda_runtime.h>

#define MB_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define MB_EXTERN_SHARED(type, name) extern __shared__ __align__(16) type name[]
#include "ptx.cuh"
#endif
