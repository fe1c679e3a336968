// Internal: hk's TCP transport for the process group — blocking sockets with deadlines. Used by
// the rendezvous (every backend) and by the TCP process group's collectives (CPU ranks).
//
// Every call that waits takes a deadline and throws hk::RuntimeFailure when it passes, naming
// the peer and the operation; a peer that closes its end (it exited or crashed) is an error
// too, never a hang. No TLS, no authentication: the rendezvous address is meant for the job's own
// hosts (loopback for one node). Not a general networking library.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "hk/error.h"

namespace hk::dist::tcp {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~Socket();
  Socket(Socket&& o) noexcept;
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  bool valid() const { return fd_ >= 0; }
  // Who is at the other end, for messages ("rank 1 (127.0.0.1:40312)").
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }

  // Sends / receives exactly `bytes`; `what` names the operation in errors.
  void send_all(const void* data, size_t bytes, Deadline deadline, const char* what);
  void recv_all(void* data, size_t bytes, Deadline deadline, const char* what);
  template <class T>
  void send_value(const T& v, Deadline d, const char* what) {
    send_all(&v, sizeof v, d, what);
  }
  template <class T>
  T recv_value(Deadline d, const char* what) {
    T v;
    recv_all(&v, sizeof v, d, what);
    return v;
  }
  void send_string(const std::string& s, Deadline d, const char* what);
  std::string recv_string(Deadline d, const char* what, size_t max_bytes = 1 << 16);
  // Wakes any thread blocked on this socket and makes the peer see the connection close.
  void shutdown();
  void close();

 private:
  RuntimeFailure closed_by_peer(const char* what) const;

  int fd_ = -1;
  std::string peer_;
};

class Listener {
 public:
  // Listens on `port` of the interface for `host`: the loopback interface when `host` is a
  // loopback name or address, every interface otherwise (other nodes must reach it). Throws with
  // a sentence when the port is taken.
  Listener(const std::string& host, int port);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  // The port actually bound (port 0 picks a free one).
  int port() const { return port_; }
  // Waits for one connection until `deadline`; returns an invalid Socket on timeout.
  Socket accept(Deadline deadline);

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string host_;
};

// Connects to host:port, retrying refused connections until `deadline` (the listener may start
// later). Throws with a sentence (unknown host, unreachable, timed out).
Socket connect(const std::string& host, int port, Deadline deadline, const std::string& what);

// A free TCP port on the loopback interface (the kernel's choice), for single-node launches.
int free_port();

}  // namespace hk::dist::tcp
