// cpp-httplib with a connection layer that slow or idle clients cannot exhaust. Internal to libhk
// (the hub server uses it).
//
// cpp-httplib 0.11 (Debian 12) gives every connection a pool thread for its whole life, including
// the time spent waiting for request headers and for the next keep-alive request, has no deadline
// for a header sent one byte at a time, and listens with a backlog of 5: 16 slow clients stopped
// `hk hub serve` from answering anyone. Its own settings cannot fix that, so this class keeps
// httplib's request parsing, routing and responses (Server::process_request) and replaces only
// what sits under them:
//   - the accept thread hands each new socket to a gate, a single epoll thread that reads request
//     headers without blocking; a connection reaches a worker only once its whole header is there;
//   - header_timeout_s bounds the time from accept (or from the end of the previous response) to
//     a complete header, however slowly it trickles; idle keep-alive connections wait in the gate,
//     not in a worker, and are closed after idle_timeout_s;
//   - a fixed pool of `workers` threads answers complete requests; writes give up after
//     write_timeout_s without progress and request_timeout_s in total;
//   - at most max_connections are open; more are answered 503 and closed at once; headers larger
//     than max_header_bytes get 431.
// Deliberately not here: TLS, per-client quotas, request bodies (GET only; bodies are capped).
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace hk::hub {

struct ConnectionLimits {
  int workers = 16;
  int max_connections = 512;
  long header_timeout_s = 10;
  long idle_timeout_s = 5;
  long write_timeout_s = 30;
  long request_timeout_s = 600;
  size_t max_header_bytes = 16 << 10;
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(const ConnectionLimits& limits);
  ~GuardedServer() override;
  // Starts the gate and the workers; call after bind (it also raises the listen backlog).
  void start_guard();
  // Stops the gate and the workers and closes every connection (after httplib's stop()).
  void stop_guard();
  int open_connections() const { return open_.load(); }

  struct Connection;

 private:
  // Called by httplib's accept loop (inline, see the task queue) for each accepted socket.
  bool process_and_close_socket(socket_t sock) override;

  void gate_loop();
  void worker_loop();
  void to_gate(std::unique_ptr<Connection> c);  // any thread
  void close_connection(std::unique_ptr<Connection> c);
  bool read_header(Connection& c);  // gate: false = close it

  ConnectionLimits limits_;
  std::atomic<int> open_{0};
  std::atomic<bool> stopping_{false};
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::thread gate_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;  // guards incoming_ and ready_
  std::condition_variable ready_cv_;
  std::vector<std::unique_ptr<Connection>> incoming_;   // to be added to the gate
  std::deque<std::unique_ptr<Connection>> ready_;       // complete headers, for the workers
  std::map<int, std::unique_ptr<Connection>> waiting_;  // gate thread only: fd → connection
};

}  // namespace hk::hub
