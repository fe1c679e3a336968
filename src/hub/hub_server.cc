// The loopback HTTP hub server (see hk/hub_server.h): cpp-httplib's routing and responses on
// hk's guarded connection layer (header deadlines, a worker pool, a connection cap).
//
// Files are streamed in chunks (optionally throttled) so big kernels never sit in memory and a
// client can be interrupted half-way in tests. Listings are computed from the tree on each
// request; there is no index to go stale, and nothing whose real path leaves the root is listed.
#include "hk/hub_server.h"

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "hk/error.h"
#include "hk/hub_metadata.h"
#include "hk/hub_spec.h"
#include "hub/guarded_http_server.h"
#include "hub/hub_source.h"

namespace fs = std::filesystem;

namespace hk::hub {
namespace {

// Splits a URL path into components, refusing anything that could leave the root.
bool safe_components(const std::string& path, std::vector<std::string>& out) {
  size_t start = 1;
  if (path.empty() || path.front() != '/') return false;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string part =
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (!is_safe_file_name(part) || part.front() == '.') return false;
    out.push_back(part);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return !out.empty();
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(nlohmann::json{{"error", message}}.dump() + "\n", "application/json");
}

}  // namespace

ConnectionLimits limits_of(const HubServerOptions& o) {
  ConnectionLimits l;
  l.workers = o.workers;
  l.max_connections = o.max_connections;
  l.header_timeout_s = o.header_timeout_s;
  l.idle_timeout_s = o.idle_timeout_s;
  return l;
}

struct HubServer::Impl {
  explicit Impl(const HubServerOptions& o) : options(o), server(limits_of(o)) {}
  HubServerOptions options;
  fs::path root;
  GuardedServer server;
  int port = 0;

  void serve_file(const httplib::Request& req, httplib::Response& res) {
    std::vector<std::string> parts;
    if (!safe_components(req.path, parts)) return send_error(res, 400, "bad path");
    fs::path path = root;
    for (const auto& p : parts) path /= p;
    std::error_code ec;
    fs::path real = fs::canonical(path, ec);
    if (ec || !fs::is_regular_file(real)) return send_error(res, 404, "not found");
    auto rel = real.lexically_relative(root);
    if (rel.empty() || *rel.begin() == "..") return send_error(res, 403, "outside the hub root");
    auto size = fs::file_size(real, ec);
    if (ec) return send_error(res, 404, "not found");
    // A range that starts at or past the end cannot be satisfied (RFC 9110: 416).
    for (const auto& [first, last] : req.ranges) {
      const bool suffix = first < 0;
      if ((suffix && last == 0) || (!suffix && static_cast<uint64_t>(first) >= size)) {
        res.status = 416;
        res.set_header("Content-Range", "bytes */" + std::to_string(size));
        return;
      }
    }
    auto file = std::make_shared<std::ifstream>(real, std::ios::binary);
    long throttle = options.throttle_bytes_per_s;
    res.set_content_provider(
        static_cast<size_t>(size), "application/octet-stream",
        [file, throttle](size_t offset, size_t length, httplib::DataSink& sink) {
          size_t chunk = throttle > 0 ? std::max<size_t>(1024, throttle / 20) : (1u << 16);
          std::vector<char> buffer(std::min(length, chunk));
          file->seekg(static_cast<std::streamoff>(offset));
          file->read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
          auto got = file->gcount();
          if (got <= 0) return false;
          if (throttle > 0)
            std::this_thread::sleep_for(std::chrono::microseconds(1000000LL * got / throttle));
          return sink.write(buffer.data(), static_cast<size_t>(got));
        });
  }

  // The repo directory a listing names; empty when it does not exist inside the root.
  fs::path repo_dir(const httplib::Request& req) {
    std::string repo = req.matches[1].str() + "/" + req.matches[2].str();
    auto [org, name] = parse_repo_name(repo);  // throws InvalidArgument on anything odd
    fs::path dir = root / org / name;
    return is_within(root, dir) ? dir : fs::path();
  }
};

HubServer::HubServer(HubServerOptions options) : impl_(std::make_unique<Impl>(options)) {
  Impl& s = *impl_;
  std::error_code ec;
  s.root = fs::canonical(s.options.root, ec);
  if (ec || !fs::is_directory(s.root))
    throw NotFound("hub root " + s.options.root.string() + " is not a directory");
  if (!s.options.require_token.empty()) {
    s.server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.get_header_value("Authorization") == "Bearer " + impl_->options.require_token)
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, 401, "a bearer token is required");
      return httplib::Server::HandlerResponse::Handled;
    });
  }

  s.server.Get("/api/repos", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        nlohmann::json{{"repos", list_repo_dirs(impl_->root, /*confine=*/true)}}.dump() + "\n",
        "application/json");
  });
  s.server.Get(R"(/api/([^/]+)/([^/]+)/refs)", [this](const httplib::Request& req,
                                                      httplib::Response& res) {
    try {
      fs::path dir = impl_->repo_dir(req);
      if (dir.empty() || !fs::is_directory(dir / "refs") || !is_within(impl_->root, dir / "refs"))
        return send_error(res, 404, "no such repo");
      res.set_content(serialize_refs_json(read_refs_dir(dir, &impl_->root)), "application/json");
    } catch (const Error& e) {
      send_error(res, 400, e.what());
    }
  });
  s.server.Get(
      R"(/api/([^/]+)/([^/]+)/([0-9a-f]{40})/variants)",
      [this](const httplib::Request& req, httplib::Response& res) {
        try {
          fs::path repo = impl_->repo_dir(req);
          fs::path dir = repo.empty() ? repo : repo / req.matches[3].str();
          if (dir.empty() || !fs::is_directory(dir) || !is_within(impl_->root, dir))
            return send_error(res, 404, "no such commit");
          res.set_content(
              nlohmann::json{{"variants", list_variant_dirs(dir, &impl_->root)}}.dump() + "\n",
              "application/json");
        } catch (const Error& e) {
          send_error(res, 400, e.what());
        }
      });
  s.server.Get(R"(/api/.*)", [](const httplib::Request&, httplib::Response& res) {
    send_error(res, 404, "unknown listing");
  });
  s.server.Get(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
    impl_->serve_file(req, res);
  });

  if (s.options.port == 0) {
    s.port = s.server.bind_to_any_port(s.options.host.c_str());
  } else {
    s.port = s.server.bind_to_port(s.options.host.c_str(), s.options.port) ? s.options.port : -1;
  }
  if (s.port <= 0)
    throw RuntimeFailure("cannot listen on " + s.options.host + ":" +
                         std::to_string(s.options.port) + " (port in use? try --port 0)");
  s.server.start_guard();
}

HubServer::~HubServer() {
  stop();
}
int HubServer::port() const {
  return impl_->port;
}
std::string HubServer::url() const {
  return "http://" + impl_->options.host + ":" + std::to_string(impl_->port);
}
void HubServer::run() {
  impl_->server.listen_after_bind();
}
void HubServer::stop() {
  impl_->server.stop();
  impl_->server.stop_guard();
}

}  // namespace hk::hub
