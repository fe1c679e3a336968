// clock_probe.cu — one thread spins ~100 µs reading %globaltimer and clock64 at both ends; cycles
// over nanoseconds is the SM clock while the GPU is in the state the work before it left (the
// power manager moves the clock on a millisecond scale, so a probe launched microseconds after a
// timed loop reads the clock that loop ran at). The spin itself is one SM of light work: it does
// not move the clock. Not a timer (events time the kernels), not the memory clock.
#include "clock_probe.h"

#include <cuda_runtime.h>

namespace {

__global__ void spin_probe(unsigned long long spin_ns, unsigned long long* out) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < spin_ns);
  const long long c1 = clock64();
  out[0] = static_cast<unsigned long long>(c1 - c0);
  out[1] = t1 - t0;
}

}  // namespace

double sm_clock_mhz() {
  static unsigned long long* dev = nullptr;  // kept for the process: a benchmark calls this often
  if (dev == nullptr && cudaMalloc(&dev, 2 * sizeof(unsigned long long)) != cudaSuccess) {
    dev = nullptr;  // tried again at the next call
    return 0.0;
  }
  spin_probe<<<1, 1>>>(100000ull, dev);
  unsigned long long host[2] = {0, 0};
  if (cudaGetLastError() != cudaSuccess ||
      cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost) != cudaSuccess || host[1] == 0)
    return 0.0;
  return static_cast<double>(host[0]) * 1000.0 / static_cast<double>(host[1]);
}
