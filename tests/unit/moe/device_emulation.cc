// The CUDA runtime entry points the emulated cuda variant calls (see device_emulation.h), with
// fixed answers: device 0, 3 SMs, 1 resident block per SM (persistent kernels then loop), every
// attribute accepted. Linked only into the emulation test, which does not link cudart.
#include <cuda_runtime_api.h>

extern "C" {
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrMultiProcessorCount ? 3 : 0;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) {
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int,
                                                                    size_t) {
  *blocks = 1;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetLastError(void) {
  return cudaSuccess;
}
const char* CUDARTAPI cudaGetErrorString(cudaError_t) {
  return "emulated device: no error";
}
// HK_MEGABLOCKS_TIMING's events: the emulated device runs each launch to completion, so every
// stage takes "0 ms".
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  *event = nullptr;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t) {
  return cudaSuccess;
}
}
