// hk's TCP transport (tcp_socket.h): non-blocking sockets driven by poll() so that every wait
// has a deadline, TCP_NODELAY for the small messages of the rendezvous and barriers.
#include "train/distributed/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "hk/error.h"

namespace hk::dist::tcp {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

int ms_until(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_options(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

// Waits for `events` on fd; false on timeout.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_until(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw RuntimeFailure("poll failed: " + errno_text(errno));
  }
}

// A peer that exited or crashed: an orderly close (EOF), or a reset when it died with data
// unread (or we wrote after it died). One message for all of them.
bool peer_went_away(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

Socket::~Socket() {
  close();
}
Socket::Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) {
  o.fd_ = -1;
}
Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

RuntimeFailure Socket::closed_by_peer(const char* what) const {
  return RuntimeFailure(std::string(what) + ": " + peer_ +
                        " closed the connection (the process exited or crashed)");
}

void Socket::send_all(const void* data, size_t bytes, Deadline deadline, const char* what) {
  if (fd_ < 0)
    throw RuntimeFailure(std::string(what) + ": the connection to " + peer_ +
                         " is closed (an earlier error broke it)");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd_, POLLOUT, deadline))
        throw RuntimeFailure(std::string(what) + ": timed out sending to " + peer_ +
                             " (it stopped reading: is it stuck or much slower?)");
      continue;
    }
    if (peer_went_away(errno)) throw closed_by_peer(what);
    throw RuntimeFailure(std::string(what) + ": the connection to " + peer_ +
                         " failed while sending (" + errno_text(errno) +
                         "); that process probably exited or crashed");
  }
}

void Socket::recv_all(void* data, size_t bytes, Deadline deadline, const char* what) {
  if (fd_ < 0)
    throw RuntimeFailure(std::string(what) + ": the connection to " + peer_ +
                         " is closed (an earlier error broke it)");
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd_, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0 || peer_went_away(errno)) throw closed_by_peer(what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd_, POLLIN, deadline))
        throw RuntimeFailure(std::string(what) + ": timed out waiting for " + peer_ +
                             " (it is stuck, much slower, or running other collectives)");
      continue;
    }
    throw RuntimeFailure(std::string(what) + ": the connection to " + peer_ +
                         " failed while receiving (" + errno_text(errno) +
                         "); that process probably exited or crashed");
  }
}

void Socket::send_string(const std::string& s, Deadline d, const char* what) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  send_value(n, d, what);
  if (n) send_all(s.data(), n, d, what);
}

std::string Socket::recv_string(Deadline d, const char* what, size_t max_bytes) {
  const uint32_t n = recv_value<uint32_t>(d, what);
  if (n > max_bytes)
    throw RuntimeFailure(std::string(what) + ": " + peer_ + " sent a " + std::to_string(n) +
                         "-byte message (at most " + std::to_string(max_bytes) +
                         "); is something other than an hk rank listening on this port?");
  std::string s(n, '\0');
  if (n) recv_all(s.data(), n, d, what);
  return s;
}

Listener::Listener(const std::string& host, int port) : host_(host) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw RuntimeFailure("cannot create a TCP socket: " + errno_text(errno));
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = is_loopback(host) ? htonl(INADDR_LOOPBACK) : htonl(INADDR_ANY);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EADDRINUSE)
      throw RuntimeFailure("rank 0 cannot listen on port " + std::to_string(port) +
                           ": the address is already in use (another job, or an earlier run "
                           "still exiting); pick another --master-port / MASTER_PORT");
    throw RuntimeFailure("rank 0 cannot listen on " + host + ":" + std::to_string(port) + ": " +
                         errno_text(err));
  }
  if (::listen(fd_, 1024) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw RuntimeFailure("rank 0 cannot listen on port " + std::to_string(port) + ": " +
                         errno_text(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  set_nonblocking(fd_);
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

Socket Listener::accept(Deadline deadline) {
  for (;;) {
    if (!wait_for(fd_, POLLIN, deadline)) return Socket();
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED)
        continue;
      throw RuntimeFailure("rank 0: accepting a connection on port " + std::to_string(port_) +
                           " failed: " + errno_text(errno));
    }
    set_nonblocking(fd);
    set_options(fd);
    char ip[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
    return Socket(fd, std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port)));
  }
}

Socket connect(const std::string& host, int port, Deadline deadline, const std::string& what) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr)
    throw RuntimeFailure(what + ": cannot resolve MASTER_ADDR '" + host + "' (" +
                         ::gai_strerror(rc) + "); set MASTER_ADDR to the host of rank 0");
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  std::string last_error = "no answer";
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw RuntimeFailure("cannot create a TCP socket: " + errno_text(errno));
    set_nonblocking(fd);
    int r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int err = r == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      if (wait_for(fd, POLLOUT, deadline)) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) {
      set_options(fd);
      return Socket(fd, "rank 0 (" + where + ")");
    }
    ::close(fd);
    last_error = errno_text(err);
    if (Clock::now() >= deadline)
      throw RuntimeFailure(what + ": could not connect to rank 0 at " + where + " (" + last_error +
                           ") before the timeout; is rank 0 running, and are MASTER_ADDR / "
                           "MASTER_PORT the same for every rank?");
    // Refused / unreachable: rank 0 may not listen yet.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int free_port() {
  Listener l("127.0.0.1", 0);
  return l.port();
}

}  // namespace hk::dist::tcp
