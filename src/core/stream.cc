// Streams and events over the CUDA runtime; CPU variants are no-ops so callers need no branches.
#include "hk/stream.h"

#include "hk/error.h"
#ifdef HK_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace hk {

#ifdef HK_HAVE_CUDA
OwnedStream::OwnedStream(Device device) : device_(device) {
  if (!device.is_cuda()) return;
  HK_CUDA_CHECK(cudaSetDevice(device.index));
  cudaStream_t s;
  HK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_.handle = s;
}
OwnedStream::~OwnedStream() {
  if (stream_.handle) cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
}
void synchronize(Device device, Stream stream) {
  if (!device.is_cuda()) return;
  HK_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
}
void synchronize_device(Device device) {
  if (!device.is_cuda()) return;
  HK_CUDA_CHECK(cudaSetDevice(device.index));
  HK_CUDA_CHECK(cudaDeviceSynchronize());
}
Event::Event() {
  cudaEvent_t e;
  HK_CUDA_CHECK(cudaEventCreate(&e));
  event_ = e;
}
Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
void Event::record(Stream stream) {
  HK_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_),
                                static_cast<cudaStream_t>(stream.handle)));
}
void Event::wait(Stream stream) const {
  HK_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle),
                                    static_cast<cudaEvent_t>(event_), 0));
}
void Event::synchronize() const {
  HK_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}
float Event::elapsed_ms(const Event& start, const Event& end) {
  end.synchronize();
  float ms = 0;
  HK_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                     static_cast<cudaEvent_t>(end.event_)));
  return ms;
}
#else
OwnedStream::OwnedStream(Device device) : device_(device) {
  if (device.is_cuda()) throw Unsupported("hk was built without CUDA; cannot create a CUDA stream");
}
OwnedStream::~OwnedStream() = default;
void synchronize(Device, Stream) {}
void synchronize_device(Device) {}
Event::Event() { throw Unsupported("hk was built without CUDA; events need a CUDA build"); }
Event::~Event() = default;
void Event::record(Stream) {}
void Event::wait(Stream) const {}
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&, const Event&) { return 0; }
#endif

OwnedStream::OwnedStream(OwnedStream&& other) noexcept
    : stream_(other.stream_), device_(other.device_) {
  other.stream_.handle = nullptr;
}
OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  std::swap(stream_, other.stream_);
  std::swap(device_, other.device_);
  return *this;
}

}  // namespace hk
