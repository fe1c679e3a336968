// A minimal HTTP GET client for remote hubs (libcurl).
//
// It sends HF_TOKEN as a bearer token, follows no redirects (a 3xx is an error naming where it
// pointed), speaks http and https only, shows a progress bar only when stderr is a TTY, and turns
// every failure into one sentence: unreachable hub (with the offline hint), HTTP status, a body
// or file larger than allowed, a transfer slower than the minimum speed, or one that did not
// finish by its deadline. Everything a hub sends is bounded here — in memory (bodies), on disk
// (downloads stop at their limit, normally the size metadata.json declares) and in time. It does
// not retry, cache or verify; the cache does that.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace hk::hub {

struct HttpOptions {
  std::string token;  // bearer token; empty = none
  long connect_timeout_s = 10;
  long timeout_s = 600;               // a request (or a caller's deadline) ends after this
  long stall_timeout_s = 30;          // abort when slower than min_speed_bytes_s for this long
  long min_speed_bytes_s = 1024;      //
  size_t max_body_bytes = 16u << 20;  // get(): larger bodies are refused
  bool progress = false;              // draw a progress bar on stderr (only honoured on a TTY)
};

using Deadline = std::chrono::steady_clock::time_point;

class HttpClient {
 public:
  HttpClient(std::string endpoint, HttpOptions options);
  // GET endpoint + path into a string of at most max_body_bytes. Throws NotFound on 404,
  // RuntimeFailure otherwise. `deadline` (default: now + timeout_s) bounds the whole request.
  std::string get(const std::string& path, std::optional<Deadline> deadline = {}) const;
  // GET endpoint + path, appending to the file descriptor `fd`. More than `max_bytes` bytes is an
  // IntegrityError (the hub serves more than it declared); the transfer stops there, so at most
  // max_bytes + one network chunk is ever written. Same errors as get() otherwise.
  void download(const std::string& path, int fd, uint64_t max_bytes, const std::string& label,
                std::optional<Deadline> deadline = {}) const;
  const std::string& endpoint() const { return endpoint_; }
  const HttpOptions& options() const { return options_; }

 private:
  struct Sink;
  void perform(const std::string& path, Sink& sink, const std::string& label,
               std::optional<Deadline> deadline) const;
  std::string endpoint_;
  HttpOptions options_;
};

}  // namespace hk::hub
