// hk/hub_server.h — serve a hub tree over HTTP on loopback (`hk hub serve`).
//
// Serves the tree's files (GET /<org>/<repo>/...) and the listings the client needs:
//   GET /api/repos, GET /api/<org>/<repo>/refs, GET /api/<org>/<repo>/<commit>/variants.
// Paths are validated component by component and must stay under the root (no "..", no dot
// files, symlinks leaving the root refused). It is a development / test server: no TLS, no auth
// (optionally one shared bearer token), no uploads.
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
