// The connection layer under cpp-httplib (see guarded_http_server.h): an epoll gate that collects
// request headers without blocking, a fixed worker pool for complete requests, deadlines, a cap.
#include "hub/guarded_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "hk/error.h"

namespace hk::hub {

using Clock = std::chrono::steady_clock;

struct GuardedServer::Connection {
  explicit Connection(int f) : fd(f) {}
  int fd;
  std::string buffer;   // bytes read but not yet consumed by httplib
  size_t consumed = 0;  // httplib has read buffer[0, consumed)
  Clock::time_point deadline;
  size_t requests = 0;

  size_t pending() const { return buffer.size() - consumed; }
  bool has_complete_header() const {
    return buffer.find("\r\n\r\n", consumed) != std::string::npos ||
           buffer.find("\n\n", consumed) != std::string::npos;
  }
  void compact() {
    buffer.erase(0, consumed);
    consumed = 0;
  }
};

namespace {

// httplib's accept loop hands each socket to the task queue; running it inline is right because
// our process_and_close_socket only registers the socket with the gate and returns.
class InlineTaskQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// Best effort, never blocks: a short answer to a connection we are about to close.
void send_and_forget(int fd, const char* response) {
  ::send(fd, response, std::strlen(response), MSG_DONTWAIT | MSG_NOSIGNAL);
}

// Waits for `events` on fd until `deadline`, in slices so a stopping server is noticed.
bool wait_for(int fd, short events, Clock::time_point deadline, const std::atomic<bool>& stopping) {
  for (;;) {
    if (stopping.load()) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 200)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

// The stream httplib parses a request from and writes its response to: the bytes the gate
// already read first, then the socket, with deadlines on every wait.
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(GuardedServer::Connection& c, const ConnectionLimits& limits,
                const std::atomic<bool>& stopping)
      : c_(c),
        limits_(limits),
        stopping_(stopping),
        read_deadline_(Clock::now() + std::chrono::seconds(limits.header_timeout_s)),
        response_deadline_(Clock::now() + std::chrono::seconds(limits.request_timeout_s)) {}

  bool is_readable() const override {
    return c_.pending() > 0 || wait_for(c_.fd, POLLIN, read_deadline_, stopping_);
  }
  bool is_writable() const override {
    return wait_for(c_.fd, POLLOUT, write_deadline(), stopping_);
  }
  ssize_t read(char* ptr, size_t size) override {
    if (c_.pending() > 0) {
      const size_t n = std::min(size, c_.pending());
      std::memcpy(ptr, c_.buffer.data() + c_.consumed, n);
      c_.consumed += n;
      return static_cast<ssize_t>(n);
    }
    for (;;) {
      ssize_t n = ::recv(c_.fd, ptr, size, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!wait_for(c_.fd, POLLIN, read_deadline_, stopping_)) return -1;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      ssize_t n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!wait_for(c_.fd, POLLOUT, write_deadline(), stopping_)) return -1;  // stalled reader
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(c_.fd, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(c_.fd, false, ip, port);
  }
  socket_t socket() const override { return c_.fd; }

 private:
  Clock::time_point write_deadline() const {
    return std::min(Clock::now() + std::chrono::seconds(limits_.write_timeout_s),
                    response_deadline_);
  }
  GuardedServer::Connection& c_;
  const ConnectionLimits& limits_;
  const std::atomic<bool>& stopping_;
  Clock::time_point read_deadline_, response_deadline_;
};

constexpr size_t kMaxRequestsPerConnection = 1000;

}  // namespace

GuardedServer::GuardedServer(const ConnectionLimits& limits) : limits_(limits) {
  new_task_queue = [] { return new InlineTaskQueue(); };
  set_payload_max_length(64 << 10);  // GET only: nothing legitimate sends a body
}

GuardedServer::~GuardedServer() {
  stop_guard();
}

void GuardedServer::start_guard() {
  // httplib listens with a backlog of 5; connections we accept at once need no more, but a burst
  // of connects must not be dropped (a dropped SYN costs the client a 1 s retransmit).
  if (svr_sock_.load() != INVALID_SOCKET) ::listen(svr_sock_.load(), 1024);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0)
    throw RuntimeFailure(std::string("cannot start the hub server: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  gate_ = std::thread([this] { gate_loop(); });
  for (int i = 0; i < std::max(1, limits_.workers); ++i)
    workers_.emplace_back([this] { worker_loop(); });
}

void GuardedServer::stop_guard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_.exchange(true)) return;
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  ready_cv_.notify_all();
  if (gate_.joinable()) gate_.join();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
  for (auto& c : incoming_) close_connection(std::move(c));
  for (auto& c : ready_) close_connection(std::move(c));
  for (auto& [fd, c] : waiting_) close_connection(std::move(c));
  incoming_.clear();
  ready_.clear();
  waiting_.clear();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (stopping_.load() || open_.load() >= limits_.max_connections) {
    send_and_forget(sock,
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    "Connection: close\r\nRetry-After: 1\r\n\r\n");
    ::close(sock);
    return true;
  }
  ++open_;
  ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
  auto c = std::make_unique<Connection>(sock);
  c->deadline = Clock::now() + std::chrono::seconds(limits_.header_timeout_s);
  to_gate(std::move(c));
  return true;
}

void GuardedServer::to_gate(std::unique_ptr<Connection> c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_.load()) {
      incoming_.push_back(std::move(c));
    }
  }
  if (c) {  // the server is stopping
    close_connection(std::move(c));
    return;
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void GuardedServer::close_connection(std::unique_ptr<Connection> c) {
  if (!c) return;
  ::shutdown(c->fd, SHUT_RDWR);
  ::close(c->fd);
  --open_;
}

bool GuardedServer::read_header(Connection& c) {
  char buffer[4096];
  for (;;) {
    ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      c.buffer.append(buffer, static_cast<size_t>(n));
      if (c.has_complete_header()) return true;
      if (c.pending() > limits_.max_header_bytes) {
        send_and_forget(c.fd,
                        "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
                        "Connection: close\r\n\r\n");
        return false;
      }
      continue;
    }
    if (n == 0) return false;  // the client closed
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

void GuardedServer::gate_loop() {
  std::vector<epoll_event> events(64);
  auto dispatch = [this](std::unique_ptr<Connection> c) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(c));
    }
    ready_cv_.notify_one();
  };
  auto forget = [this](int fd) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    auto it = waiting_.find(fd);
    std::unique_ptr<Connection> c = std::move(it->second);
    waiting_.erase(it);
    return c;
  };
  while (!stopping_.load()) {
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    for (const auto& [fd, c] : waiting_) next = std::min(next, c->deadline);
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                         static_cast<int>(std::clamp<long long>(wait_ms.count() + 1, 0, 1000)));
    for (int i = 0; i < std::max(n, 0); ++i) {
      const int fd = events[static_cast<size_t>(i)].data.fd;
      if (fd == wake_fd_) {
        uint64_t drained;
        while (::read(wake_fd_, &drained, sizeof drained) > 0) {
        }
        std::vector<std::unique_ptr<Connection>> arrived;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          arrived.swap(incoming_);
        }
        for (auto& c : arrived) {
          c->compact();
          if (c->has_complete_header()) {  // pipelined: the next request is already here
            dispatch(std::move(c));
            continue;
          }
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
          ev.data.fd = c->fd;
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
          Connection& ref = *c;
          waiting_[c->fd] = std::move(c);
          // Bytes that arrived before the registration raise no edge: read them now.
          if (!read_header(ref)) {
            close_connection(forget(ref.fd));
          } else if (ref.has_complete_header()) {
            dispatch(forget(ref.fd));
          }
        }
        continue;
      }
      auto it = waiting_.find(fd);
      if (it == waiting_.end()) continue;
      if (!read_header(*it->second)) {
        close_connection(forget(fd));
      } else if (it->second->has_complete_header()) {
        dispatch(forget(fd));
      }
    }
    // Deadlines: a header that has not arrived in time, or an idle keep-alive connection.
    const auto now = Clock::now();
    std::vector<int> expired;
    for (const auto& [fd, c] : waiting_)
      if (c->deadline <= now) expired.push_back(fd);
    for (int fd : expired) {
      std::unique_ptr<Connection> c = forget(fd);
      if (c->pending() > 0)
        send_and_forget(fd,
                        "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
                        "Connection: close\r\n\r\n");
      close_connection(std::move(c));
    }
  }
}

void GuardedServer::worker_loop() {
  for (;;) {
    std::unique_ptr<Connection> c;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_cv_.wait(lock, [this] { return stopping_.load() || !ready_.empty(); });
      if (stopping_.load()) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    GuardedStream stream(*c, limits_, stopping_);
    bool connection_closed = false;
    const bool last = c->requests + 1 >= kMaxRequestsPerConnection;
    bool ok = false;
    try {
      ok = process_request(stream, last, connection_closed, nullptr);
    } catch (...) {
      ok = false;  // a handler bug must not take the worker down
    }
    ++c->requests;
    if (ok && !connection_closed && !last) {
      c->deadline = Clock::now() + std::chrono::seconds(limits_.idle_timeout_s);
      to_gate(std::move(c));
    } else {
      close_connection(std::move(c));
    }
  }
}

}  // namespace hk::hub
