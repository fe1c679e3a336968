// libcurl GET for remote hubs (see http_client.h).
#include "hub/http_client.h"

#include <curl/curl.h>
#include <unistd.h>

#include <memory>
#include <mutex>

#include "hk/error.h"

namespace hk::hub {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t write_string(char* data, size_t size, size_t count, void* sink) {
  static_cast<std::string*>(sink)->append(data, size * count);
  return size * count;
}

size_t write_file(char* data, size_t size, size_t count, void* sink) {
  return std::fwrite(data, size, count, static_cast<FILE*>(sink)) * size;
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

HttpClient::HttpClient(std::string endpoint, HttpOptions options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  if (endpoint_.rfind("http://", 0) != 0 && endpoint_.rfind("https://", 0) != 0)
    throw InvalidArgument("hub endpoint '" + endpoint_ +
                          "' must start with http:// or https:// (check HK_ENDPOINT)");
  global_init();
}

std::string HttpClient::get(const std::string& path) const {
  std::string body;
  perform(path, &body, false, {});
  return body;
}

void HttpClient::download(const std::string& path, FILE* out, const std::string& label) const {
  perform(path, out, true, label);
  if (std::fflush(out) != 0) throw RuntimeFailure("cannot write the download of " + label);
}

void HttpClient::perform(const std::string& path, void* sink, bool to_file,
                         const std::string& label) const {
  const std::string url = endpoint_ + path;
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) throw RuntimeFailure("libcurl could not start a request for " + url);
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, options_.connect_timeout_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options_.stall_timeout_s);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "hk-kernels/1");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_file ? &write_file : &write_string);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
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
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
      (rc == CURLE_OPERATION_TIMEDOUT && progress.last_shown <= 0 && !to_file))
    throw RuntimeFailure("cannot reach hub at " + endpoint_ + ": " + curl_easy_strerror(rc) +
                         "; set HF_HUB_OFFLINE=1 to use the cache");
  if (rc != CURLE_OK)
    throw RuntimeFailure("download of " + url + " failed: " + curl_easy_strerror(rc) +
                         (rc == CURLE_OPERATION_TIMEDOUT
                              ? " (no data for " + std::to_string(options_.stall_timeout_s) + " s)"
                              : std::string()));
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status == 404) throw NotFound("the hub at " + endpoint_ + " has no " + path + " (HTTP 404)");
  if (status == 401 || status == 403)
    throw RuntimeFailure("the hub at " + endpoint_ + " refused " + path + " (HTTP " +
                         std::to_string(status) + "); check HF_TOKEN");
  if (status != 200)
    throw RuntimeFailure("the hub at " + endpoint_ + " answered HTTP " + std::to_string(status) +
                         " for " + path);
}

}  // namespace hk::hub
