// hk/hub_server.h — serve a hub tree over HTTP on loopback (`hk hub serve`).
//
// Serves the tree's files (GET /<org>/<repo>/...) and the listings the client needs:
//   GET /api/repos, GET /api/<org>/<repo>/refs, GET /api/<org>/<repo>/<commit>/variants.
// Paths are validated component by component and must stay under the root (no "..", no dot
// files, symlinks leaving the root refused — in listings too). Slow or idle clients cannot take it
// down: request headers are collected by one non-blocking thread with a deadline and only
// complete requests reach the worker pool; connections are capped (see
// src/hub/guarded_http_server.h). It is a development / test server: no TLS, no auth (optionally
// one shared bearer token), no uploads.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

namespace hk::hub {

struct HubServerOptions {
  std::filesystem::path root;
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = an ephemeral port chosen by the OS
  // > 0: send files at most this fast (tests of interrupted downloads).
  long throttle_bytes_per_s = 0;
  // Non-empty: every request needs "Authorization: Bearer <require_token>" (else HTTP 401).
  std::string require_token;
  // Connection limits (`hk hub serve` flags of the same names).
  int workers = 16;            // threads answering complete requests
  int max_connections = 512;   // open connections; more get 503 and are closed
  long header_timeout_s = 10;  // from connect (or the previous response) to a complete header
  long idle_timeout_s = 5;     // an idle keep-alive connection is closed after this
};

class HubServer {
 public:
  explicit HubServer(HubServerOptions options);  // binds; throws RuntimeFailure / NotFound
  ~HubServer();
  int port() const;
  std::string url() const;  // "http://127.0.0.1:PORT"
  void run();               // serves until stop()
  void stop();              // thread-safe

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hk::hub
