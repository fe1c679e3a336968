// A hostile HTTP hub for tests: a raw socket server on 127.0.0.1 whose every answer a test
// chooses — endless or oversized bodies, bytes trickled at 2 B/s, redirects, lies about sizes —
// with a hub tree on disk behind it for the answers that should be normal. One thread per
// connection, each connection answers one request and closes. Header-only, test-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/hub_source.h"
#include "hub_test_util.h"

namespace hk::hub::testing {

struct HostileResponse {
  int status = 200;
  std::string extra_headers;               // "Location: ...\r\n"
  std::string body;                        // sent first
  uint64_t filler_bytes = 0;               // then this many bytes of filler
  std::optional<uint64_t> content_length;  // claimed length; nullopt: close-delimited
  double bytes_per_second = 0;             // > 0: trickle the whole body at this rate
};

class HostileServer {
 public:
  using Handler = std::function<std::optional<HostileResponse>(const std::string& path)>;

  // `handler` answers first; when it returns nullopt the hub tree at `root` answers normally.
  HostileServer(fs::path root, Handler handler)
      : root_(std::move(root)), handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 64) != 0)
      throw std::runtime_error("hostile server: cannot listen");
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~HostileServer() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& t : connections_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  uint64_t bytes_sent() const { return sent_.load(); }
  int requests(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    int n = 0;
    for (const auto& p : paths_) n += p == path;
    return n;
  }

 private:
  void accept_loop() {
    while (!stop_) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stop_) return;
        continue;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      connections_.emplace_back([this, fd] { serve(fd); });
    }
  }

  std::optional<HostileResponse> from_tree(const std::string& path) const {
    HostileResponse r;
    auto json_of = [&](const nlohmann::json& j) {
      r.body = j.dump();
      r.content_length = r.body.size();
      return r;
    };
    if (path == "/api/repos") return json_of({{"repos", list_repo_dirs(root_)}});
    std::vector<std::string> parts;
    for (size_t start = 1; start <= path.size();) {
      size_t slash = path.find('/', start);
      parts.push_back(
          path.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    if (parts.size() == 4 && parts[0] == "api" && parts[3] == "refs")
      return json_of(
          nlohmann::json::parse(serialize_refs_json(read_refs_dir(root_ / parts[1] / parts[2]))));
    if (parts.size() == 5 && parts[0] == "api" && parts[4] == "variants")
      return json_of({{"variants", list_variant_dirs(root_ / parts[1] / parts[2] / parts[3])}});
    fs::path file = root_;
    for (const auto& p : parts) {
      if (p.empty() || p == "..") return std::nullopt;
      file /= p;
    }
    if (!fs::is_regular_file(file)) return std::nullopt;
    r.body = read_file(file);
    r.content_length = r.body.size();
    return r;
  }

  void serve(int fd) {
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 65536) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    const size_t sp1 = request.find(' '), sp2 = request.find(' ', sp1 + 1);
    const std::string path =
        sp1 == std::string::npos ? "/" : request.substr(sp1 + 1, sp2 - sp1 - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      paths_.push_back(path);
    }
    std::optional<HostileResponse> r = handler_(path);
    if (!r) r = from_tree(path);
    if (!r) {
      r = HostileResponse{};
      r->status = 404;
      r->body = "{}";
      r->content_length = 2;
    }
    std::string head = "HTTP/1.1 " + std::to_string(r->status) + " X\r\n" + r->extra_headers;
    if (r->content_length) head += "Content-Length: " + std::to_string(*r->content_length) + "\r\n";
    head += "Connection: close\r\n\r\n";
    bool ok = send_all(fd, head, 0);
    if (ok) ok = send_all(fd, r->body, r->bytes_per_second);
    std::string filler(64 << 10, 'x');
    for (uint64_t left = r->filler_bytes; ok && left > 0 && !stop_;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, filler.size()));
      ok = send_all(fd, std::string_view(filler).substr(0, n), r->bytes_per_second);
      left -= n;
    }
    ::shutdown(fd, SHUT_WR);
    ::close(fd);
  }

  bool send_all(int fd, std::string_view data, double rate) {
    const size_t step = rate > 0 ? 1 : data.size();
    for (size_t done = 0; done < data.size() && !stop_;) {
      const size_t n = std::min(step, data.size() - done);
      ssize_t w = ::send(fd, data.data() + done, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      done += static_cast<size_t>(w);
      sent_ += static_cast<uint64_t>(w);
      if (rate > 0) std::this_thread::sleep_for(std::chrono::duration<double>(1.0 / rate));
    }
    return !stop_;
  }

  fs::path root_;
  Handler handler_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread acceptor_;
  std::mutex mutex_;
  std::vector<std::thread> connections_;
  std::vector<std::string> paths_;
};

}  // namespace hk::hub::testing
