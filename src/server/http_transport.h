// An event-driven HTTP/1.1 server (Boost.Beast on Boost.Asio): a connection costs a socket, a
// strand and its buffers, never a thread. It enforces the transport's limits and timeouts, asks
// the application about a request before reading its body (route, API key, readiness), decodes
// compressed bodies under a cap, and hands each request to its route's handler, on an I/O thread
// (cheap, never blocking work) or on the worker pool. Handlers answer through an HttpExchange,
// from any thread, at any later time: a whole response, or a stream of chunks (server-sent
// events). A client that goes away before its answer is complete is reported to the exchange's
// close callback. docs/architecture.md describes the policy.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http_body.h"
#include "vlm/status.h"

namespace boost::asio {
class io_context;
}

namespace vlm::http {

// One request as the access log records it, once its answer is out (or the client went away:
// status 499).
struct AccessRecord {
  std::string request_id;  // the client's X-Request-Id, else one made here; sent back as well
  std::string method, path, client;
  int status = 0;
  int64_t prompt_tokens = -1, cached_tokens = -1, completion_tokens = -1;  // -1: not a generation
  double ttft_s = -1;  // the header received → the first token (-1: none)
  double total_s = 0;  // the header received → the answer out
};

struct TransportOptions {
  // Every request, once answered (including the transport's own refusals).
  std::function<void(const AccessRecord&)> on_access;
  RequestLimits limits;
  int io_threads = 2;
  int worker_threads = 8;
  int max_connections = 4096;    // open at once; beyond: 503 and close (trimmed to the fd limit)
  double header_timeout_s = 10;  // from the first byte of a request (or accept) to its header
  double keep_alive_timeout_s = 75;  // an idle connection between requests
  double body_timeout_s = 60;        // the whole body, once the header is in
  double write_timeout_s = 60;       // one response write that makes no progress
  double linger_s = 3;               // discarding the unread body of a refused request
  // How the transport's own refusals (400, 404, 413, 431, 503, ...) are worded; default: the
  // message as text/plain.
  std::function<std::string(int status, const std::string& message)> error_body;
  std::string error_content_type = "text/plain; charset=utf-8";
};

struct HttpHeader {
  std::string name, value;
};

// A response header is added to every answer of one route (e.g. Retry-After).
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<HttpHeader> headers;
  bool close = false;  // ask the client to close the connection (Connection: close)
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent
  std::string path;    // the target without its query
  std::vector<HttpHeader> headers;
  std::string body;  // decoded (Content-Encoding undone)
  // The first value of a header, case-insensitively; "" when absent.
  std::string_view header(std::string_view name) const;
};

class Connection;

// One request and its answer. Thread-safe; every call posts to the connection's strand, so a
// handler may answer from any thread. Calls after the connection closed are ignored.
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  const HttpRequest& request() const { return request_; }

  // A whole response.
  void respond(HttpResponse r);
  // A streamed response (chunked; close-delimited for HTTP/1.0): the header now, then write()
  // pieces in order, then finish().
  void start_stream(int status, std::string content_type, std::vector<HttpHeader> headers = {});
  void write(std::string data);
  void finish();
  // Runs `fn` on the connection's strand (after everything posted before it).
  void post(std::function<void()> fn);
  // Called once, on the strand, when the client goes away (EOF or an I/O error) before the
  // answer is complete; not called once it is. Set it before anything can close.
  void on_close(std::function<void()> fn);
  // True once the client went away or the connection was closed.
  bool closed() const { return closed_.load(); }
  // Keeps `owner` (what is answering, e.g. a request's fan-out) alive until the answer is
  // complete or the connection closes; then it is let go.
  void hold(std::shared_ptr<void> owner);
  // For the access log: a generation's token counts (as its reply's usage says them) and the
  // moment of its first token (the first call counts).
  void set_usage(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens);
  void mark_first_token();
  // Copies them into `r` (the first token's time counted from `t0`).
  void usage(AccessRecord* r, std::chrono::steady_clock::time_point t0);

  HttpExchange(std::shared_ptr<Connection> conn, HttpRequest request);

 private:
  friend class Connection;
  std::weak_ptr<Connection> conn_;
  HttpRequest request_;
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::function<void()> on_close_;                                    // guarded by mu_
  std::shared_ptr<void> held_;                                        // guarded by mu_
  int64_t prompt_ = -1, cached_ = -1, completion_ = -1;               // guarded by mu_
  std::optional<std::chrono::steady_clock::time_point> first_token_;  // guarded by mu_
  void fire_close();
  void complete();  // the answer is out: on_close will not be called
};

using Handler = std::function<void(std::shared_ptr<HttpExchange>)>;

// The id a request is logged and answered under: the client's X-Request-Id when it is 1 to 128
// printable characters, else 16 random hexadecimal digits.
std::string request_id_for(std::string_view given);

// Before a request's body is read: an answer that refuses it (and skips the body), or nothing.
using Gate = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;

enum class RunOn { kIoThread, kWorker };

class HttpServer {
 public:
  explicit HttpServer(TransportOptions opts);
  ~HttpServer();

  // Routes must be added before listen(). A path with no route is 404, a path whose routes have
  // other methods 405 (with Allow). A path "PREFIX/*" takes any one more segment
  // ("/v1/responses/*": "/v1/responses/resp_1").
  void route(std::string method, std::string path, RunOn where, Handler h, Gate gate = nullptr);

  // Binds (SO_REUSEADDR, never SO_REUSEPORT) and listens; port 0 picks a free one. A taken
  // address is an error naming it.
  Status listen(const std::string& host, int port);
  int port() const;
  // Serves on the I/O threads until stop(); returns when they have finished.
  void run();
  // Closes the listener and every connection and makes run() return. Safe from any thread,
  // also before run().
  void stop();
  boost::asio::io_context& io_context();

  // Counts for metrics.
  int64_t open_connections() const;
  int64_t rejected_connections() const;  // turned away at max_connections
  int64_t active_requests() const;       // handed to a handler, answer not yet fully written
  const TransportOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Raises the open-file soft limit to the hard limit; returns the soft limit in force afterwards.
int64_t raise_open_file_limit();

// Equality of two secrets that takes the same time whatever they contain (SHA-256 digests
// compared with CRYPTO_memcmp).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace vlm::http
