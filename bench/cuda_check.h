// bench/cuda_check.h — CK(call): a benchmark program's check of a CUDA runtime call; prints the
// file, line, call and CUDA's message and exits 1 on an error. Host code only (benchmarks built
// by the host compiler include it as well as the .cu ones).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
