// hk/stream.h — streams and events: the ordering handles every op takes.
//
// A Stream is a plain handle (for CUDA a cudaStream_t, stored as void* so this header stays free of
// CUDA). The default-constructed Stream means "the device's default stream". Nothing here blocks
// the host except `synchronize()` calls, which say so. CPU ops ignore streams and run inline.
#pragma once

#include "hk/device.h"

namespace hk {

struct Stream {
  void* handle = nullptr;  // cudaStream_t for CUDA; nullptr = default stream
};

// An owned, non-blocking CUDA stream on the current device. Movable, not copyable.
class OwnedStream {
 public:
  explicit OwnedStream(Device device);
  ~OwnedStream();
  OwnedStream(OwnedStream&& other) noexcept;
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }
  operator Stream() const { return stream_; }

 private:
  Stream stream_;
  Device device_;
};

// Blocks the host until all work queued on `stream` has finished. No-op for CPU.
void synchronize(Device device, Stream stream = {});
// Blocks the host until the whole device is idle. No-op for CPU.
void synchronize_device(Device device);

// A CUDA event for ordering and timing. Created with timing enabled.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream stream = {});
  void wait(Stream stream = {}) const;  // make `stream` wait for this event (no host block)
  void synchronize() const;             // host blocks
  // Milliseconds between two recorded events; synchronises on `end`.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void* event_ = nullptr;
};

}  // namespace hk
