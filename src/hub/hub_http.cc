// HTTP to the hub through libcurl (Debian's): proxies from the environment (HTTPS_PROXY,
// NO_PROXY), the system's TLS roots, redirects to the hub's CDN (the token stays with the hub's
// own host: curl drops Authorization on a redirect to another host or port).
#include <curl/curl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "hub/hub_internal.h"

namespace vlm::hub {
namespace {

#ifndef VLM_VERSION
#define VLM_VERSION "dev"
#endif

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One answer's header lines; a new status line (a redirect's next answer) starts over.
size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<HttpResult*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {
    r->headers.clear();
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string value = line.substr(colon + 1);
  value.erase(0, value.find_first_not_of(" \t"));
  r->headers[ascii_lower(line.substr(0, colon))] = value;
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// The CA bundle the Python tools honour (requests, httpx), when one is set.
std::string ca_bundle_from_env() {
  for (const char* var : {"CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"}) {
    const char* v = std::getenv(var);
    if (v && *v) return v;
  }
  return "";
}

struct DownloadState {
  HttpClient::Download* out;
  CURL* curl;
  int fd;
  int64_t offset;  // where the file's bytes written so far end
  int64_t limit;   // the file's size: more is refused
  const std::function<void(const void*, size_t)>* sink;
  const std::function<void()>* restart;
  const std::atomic<bool>* cancel;
  bool first = true;
};

size_t on_download(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<DownloadState*>(user);
  const size_t bytes = size * n;
  if (s->cancel && s->cancel->load()) {
    s->out->cancelled = true;
    return 0;
  }
  long status = 0;
  curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 300) return bytes;  // an error page: not written (the caller reads the status)
  if (s->first) {
    s->first = false;
    if (status == 200 && s->offset > 0) {  // the server ignored the Range: start over
      if (::ftruncate(s->fd, 0) != 0) {
        s->out->write_errno = errno;
        return 0;
      }
      s->offset = 0;
      (*s->restart)();
    }
  }
  if (s->offset + static_cast<int64_t>(bytes) > s->limit) {  // more than the listing says
    s->out->overflow = true;
    return 0;
  }
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::write(s->fd, data + done, bytes - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      s->out->write_errno = errno;
      return 0;
    }
    done += static_cast<size_t>(w);
  }
  s->offset += static_cast<int64_t>(bytes);
  (*s->sink)(data, bytes);
  return bytes;
}

}  // namespace

HttpClient::HttpClient(const HubOptions& options) : curl_(nullptr), headers_(nullptr) {
  global_init();
  CURL* c = curl_easy_init();
  curl_ = c;
  curl_slist* h = nullptr;
  const std::string agent = std::string("User-Agent: vlm/") + VLM_VERSION + "; " + curl_version();
  h = curl_slist_append(h, agent.c_str());
  h = curl_slist_append(h, "Accept-Encoding: identity");
  if (!options.token.empty()) {
    h = curl_slist_append(h, ("Authorization: Bearer " + options.token).c_str());
  }
  headers_ = h;
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  // A transfer that moves less than 1 byte/s for 60 s is cut (and retried from where it was).
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  const std::string ca = ca_bundle_from_env();
  if (!ca.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca.c_str());
}

HttpClient::~HttpClient() {
  curl_easy_cleanup(static_cast<CURL*>(curl_));
  curl_slist_free_all(static_cast<curl_slist*>(headers_));
}

HttpResult HttpClient::get(const std::string& url, int timeout_s) {
  CURL* c = static_cast<CURL*>(curl_);
  HttpResult r;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(c, CURLOPT_RANGE, nullptr);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, static_cast<long>(timeout_s));
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  const CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    r.transport_error = curl_easy_strerror(rc);
    r.status = 0;
    return r;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  return r;
}

HttpClient::Download HttpClient::download(const std::string& url, int fd, int64_t offset,
                                          int64_t size,
                                          const std::function<void(const void*, size_t)>& sink,
                                          const std::function<void()>& restart,
                                          const std::atomic<bool>* cancel) {
  CURL* c = static_cast<CURL*>(curl_);
  Download d;
  DownloadState s{&d, c, fd, offset, size, &sink, &restart, cancel};
  const std::string range = std::to_string(offset) + "-";
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(c, CURLOPT_RANGE, offset > 0 ? range.c_str() : nullptr);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 0L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &d.result);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_download);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
  const CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &d.result.status);
  if (rc != CURLE_OK) d.result.transport_error = curl_easy_strerror(rc);
  return d;
}

Status hub_error(const HttpResult& r, const std::string& repo_id, const std::string& what,
                 const HubOptions& options) {
  const std::string page = options.endpoint + "/" + repo_id;
  if (r.status == 0) {
    return unavailable("cannot reach " + options.endpoint + " (" + r.transport_error + ") for " +
                       what + "; check the network, or a proxy in HTTPS_PROXY");
  }
  auto header = [&](const char* name) {
    auto it = r.headers.find(name);
    return it == r.headers.end() ? std::string() : it->second;
  };
  const std::string code = header("x-error-code");
  const std::string status = "HTTP " + std::to_string(r.status);
  if (code == "GatedRepo") {
    const std::string how = options.token.empty()
                                ? "then pass a token of that account: --hf-token TOKEN, HF_TOKEN, "
                                  "or `hf auth login`"
                                : "the token given has no access to it yet";
    return invalid_argument(repo_id + " is a gated model (" + status + "): ask for access at " +
                            page + " with your Hugging Face account, " + how);
  }
  if (code == "RevisionNotFound") return not_found(repo_id + " has no " + what);
  if (code == "EntryNotFound") return not_found(what + " not found in " + repo_id);
  if (code == "RepoNotFound" || r.status == 404 || (r.status == 401 && options.token.empty())) {
    return not_found("model " + repo_id + " not found on " + options.endpoint + " (" + status +
                     (options.token.empty() ? "; if it is private, pass a token: --hf-token or "
                                              "HF_TOKEN)"
                                            : ")"));
  }
  if (r.status == 403)
    return invalid_argument("the hub refused access to " + page + " (" + status + ")");
  if (r.status == 401) {
    return invalid_argument("the hub refused the token (" + status +
                            "): check --hf-token, HF_TOKEN or $HF_HOME/token");
  }
  if (r.status == 429) {
    return unavailable("the hub is rate-limiting requests (" + status +
                       "); try again later, or pass a token");
  }
  std::string msg = header("x-error-message");
  return unavailable("the hub answered " + status + " for " + what + " of " + repo_id +
                     (msg.empty() ? "" : ": " + msg));
}

}  // namespace vlm::hub
