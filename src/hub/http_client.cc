// libcurl GET for remote hubs (see http_client.h).
#include "hub/http_client.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "hk/error.h"

namespace hk::hub {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Progress {
  std::string label;
  curl_off_t last_shown = -1;
};

int draw_progress(void* p, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  auto* progress = static_cast<Progress*>(p);
  if (now == progress->last_shown) return 0;
  progress->last_shown = now;
  if (total > 0) {
    int width = 30, filled = static_cast<int>(width * now / total);
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%", progress->label.c_str(), filled,
                 "##############################", width - filled, "",
                 static_cast<int>(100 * now / total));
  } else {
    std::fprintf(stderr, "\r%s %lld bytes", progress->label.c_str(), static_cast<long long>(now));
  }
  std::fflush(stderr);
  return 0;
}

}  // namespace

// Where the bytes of one response go, and how many may come.
struct HttpClient::Sink {
  std::string* body = nullptr;  // get()
  int fd = -1;                  // download()
  uint64_t limit = 0;
  uint64_t received = 0;
  bool over_limit = false;
  int write_errno = 0;

  static size_t write(char* data, size_t size, size_t count, void* self) {
    auto& sink = *static_cast<Sink*>(self);
    const size_t n = size * count;
    if (n > sink.limit - sink.received) {  // would pass the limit: stop the transfer here
      sink.over_limit = true;
      return 0;
    }
    sink.received += n;
    if (sink.body) {
      sink.body->append(data, n);
      return n;
    }
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::write(sink.fd, data + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        sink.write_errno = errno ? errno : EIO;
        return 0;
      }
      done += static_cast<size_t>(w);
    }
    return n;
  }
};

HttpClient::HttpClient(std::string endpoint, HttpOptions options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  if (endpoint_.rfind("http://", 0) != 0 && endpoint_.rfind("https://", 0) != 0)
    throw InvalidArgument("hub endpoint '" + endpoint_ +
                          "' must start with http:// or https:// (check HK_ENDPOINT)");
  global_init();
}

std::string HttpClient::get(const std::string& path, std::optional<Deadline> deadline) const {
  std::string body;
  Sink sink;
  sink.body = &body;
  sink.limit = options_.max_body_bytes;
  perform(path, sink, {}, deadline);
  return body;
}

void HttpClient::download(const std::string& path, int fd, uint64_t max_bytes,
                          const std::string& label, std::optional<Deadline> deadline) const {
  Sink sink;
  sink.fd = fd;
  sink.limit = max_bytes;
  perform(path, sink, label, deadline);
}

void HttpClient::perform(const std::string& path, Sink& sink, const std::string& label,
                         std::optional<Deadline> deadline) const {
  const std::string url = endpoint_ + path;
  const bool to_file = sink.fd >= 0;
  const auto start = std::chrono::steady_clock::now();
  const Deadline end = deadline.value_or(start + std::chrono::seconds(options_.timeout_s));
  const long long budget_ms = std::min<long long>(
      options_.timeout_s * 1000LL,
      std::chrono::duration_cast<std::chrono::milliseconds>(end - start).count());
  if (budget_ms <= 0)
    throw RuntimeFailure("the hub at " + endpoint_ + ": no time left to fetch " + path +
                         " (the fetch did not finish within HK_HUB_TIMEOUT = " +
                         std::to_string(options_.timeout_s) + " s)");

  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) throw RuntimeFailure("libcurl could not start a request for " + url);
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, options_.connect_timeout_s);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(budget_ms));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, options_.min_speed_bytes_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options_.stall_timeout_s);
  // A Content-Length above the limit fails before any byte is stored.
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE,
                   static_cast<curl_off_t>(std::min<uint64_t>(sink.limit, INT64_MAX)));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "hk-kernels/1");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Sink::write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(nullptr, &curl_slist_free_all);
  if (!options_.token.empty()) {
    std::string auth = "Authorization: Bearer " + options_.token;
    headers.reset(curl_slist_append(nullptr, auth.c_str()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  }
  Progress progress{label};
  bool show = to_file && options_.progress && isatty(STDERR_FILENO);
  if (show) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &draw_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &progress);
  }
  CURLcode rc = curl_easy_perform(c);
  if (show) std::fprintf(stderr, "\n");
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (sink.over_limit || rc == CURLE_FILESIZE_EXCEEDED) {
    const std::string limit = std::to_string(sink.limit);
    if (to_file)
      throw IntegrityError("the hub at " + endpoint_ + " sent more than the " + limit +
                           " bytes expected for " + label +
                           " (the size its metadata.json declares, or HK_HUB_MAX_FILE); the "
                           "download was stopped there and nothing was cached");
    throw RuntimeFailure("the hub at " + endpoint_ + " sent more than " + limit + " bytes for " +
                         path +
                         " (HK_HUB_MAX_BODY); a listing or metadata file is never that "
                         "large — refusing the rest");
  }
  if (rc == CURLE_WRITE_ERROR && sink.write_errno)
    throw RuntimeFailure("cannot write the download of " + label + ": " +
                         std::strerror(sink.write_errno) + " (is the disk full?)");
  double connect_time = 0;
  curl_easy_getinfo(c, CURLINFO_CONNECT_TIME, &connect_time);
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
      (rc == CURLE_OPERATION_TIMEDOUT && connect_time <= 0))
    throw RuntimeFailure("cannot reach hub at " + endpoint_ + ": " + curl_easy_strerror(rc) +
                         "; set HF_HUB_OFFLINE=1 to use the cache");
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    // Both the deadline and the minimum speed end in this code; the elapsed time tells which.
    if (elapsed_s * 1000 >= static_cast<double>(budget_ms) - 500)
      throw RuntimeFailure("download of " + url + " did not finish within " +
                           std::to_string((budget_ms + 999) / 1000) +
                           " s (HK_HUB_TIMEOUT = " + std::to_string(options_.timeout_s) +
                           " s for one fetch); the hub is too slow or stalled");
    throw RuntimeFailure("download of " + url + " was slower than " +
                         std::to_string(options_.min_speed_bytes_s) + " bytes/s for " +
                         std::to_string(options_.stall_timeout_s) +
                         " s (HK_HUB_MIN_SPEED / HK_HUB_STALL_TIMEOUT); the hub is too slow");
  }
  if (rc != CURLE_OK)
    throw RuntimeFailure("download of " + url + " failed: " + curl_easy_strerror(rc));
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status == 404) throw NotFound("the hub at " + endpoint_ + " has no " + path + " (HTTP 404)");
  if (status == 401 || status == 403)
    throw RuntimeFailure("the hub at " + endpoint_ + " refused " + path + " (HTTP " +
                         std::to_string(status) + "); check HF_TOKEN");
  if (status >= 300 && status < 400) {
    char* location = nullptr;
    curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &location);
    std::string where = location ? escape_control_bytes(std::string(location).substr(0, 200))
                                 : std::string("(no Location)");
    throw RuntimeFailure("the hub at " + endpoint_ + " answered HTTP " + std::to_string(status) +
                         " for " + path + ", a redirect to " + where +
                         "; hk does not follow redirects — set HK_ENDPOINT to the hub's real "
                         "address");
  }
  if (status != 200)
    throw RuntimeFailure("the hub at " + endpoint_ + " answered HTTP " + std::to_string(status) +
                         " for " + path);
}

}  // namespace hk::hub
