// A minimal HTTP GET client for remote hubs (libcurl).
//
// It sends HF_TOKEN as a bearer token, follows no redirects off the hub host, shows a progress bar
// only when stderr is a TTY, and turns every failure into one sentence: unreachable hub (with the
// offline hint), HTTP status, or a stalled transfer. It does not retry, cache or verify; the cache
// does that.
#pragma once

#include <cstdio>
#include <string>

namespace hk::hub {

struct HttpOptions {
  std::string token;  // bearer token; empty = none
  long connect_timeout_s = 10;
  long stall_timeout_s = 60;  // abort when no byte moves for this long
  bool progress = false;      // draw a progress bar on stderr (only honoured on a TTY)
};

class HttpClient {
 public:
  HttpClient(std::string endpoint, HttpOptions options);
  // GET endpoint + path into a string. Throws NotFound on 404, RuntimeFailure otherwise.
  std::string get(const std::string& path) const;
  // GET endpoint + path, streaming into `out` (flushed, not closed). Same errors as get().
  void download(const std::string& path, FILE* out, const std::string& label) const;
  const std::string& endpoint() const { return endpoint_; }

 private:
  void perform(const std::string& path, void* sink, bool to_file, const std::string& label) const;
  std::string endpoint_;
  HttpOptions options_;
};

}  // namespace hk::hub
