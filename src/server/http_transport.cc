#include "server/http_transport.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <limits>
#include <list>
#include <random>
#include <thread>

#include "vlm/log.h"

namespace vlm::http {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using boost::system::error_code;
using SteadyClock = std::chrono::steady_clock;

namespace {
// The peer of a connection as the access log names it: address:port, an IPv6 address in
// brackets ("" when the socket has none).
std::string peer_address(const tcp::socket& socket) {
  error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  if (ec) return "";
  const std::string a = peer.address().to_string();
  return (peer.address().is_v6() ? "[" + a + "]" : a) + ":" + std::to_string(peer.port());
}
}  // namespace

namespace {

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

struct Route {
  std::string method, path;
  RunOn where;
  Handler handler;
  Gate gate;
};

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const HttpHeader& h : headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return {};
}

struct HttpServer::Impl {
  HttpResponse error_response(const HttpError& e) const {
    HttpResponse r;
    r.status = e.status;
    r.content_type = opts.error_content_type;
    r.body = opts.error_body ? opts.error_body(e.status, e.message) : e.message + "\n";
    return r;
  }

  explicit Impl(TransportOptions o)
      : opts(std::move(o)),
        ioc(std::make_unique<net::io_context>(std::max(1, opts.io_threads))),
        workers(std::make_unique<net::thread_pool>(
            static_cast<size_t>(std::max(1, opts.worker_threads)))),
        acceptor(std::make_unique<tcp::acceptor>(net::make_strand(*ioc))),
        retry_timer(std::make_unique<net::steady_timer>(acceptor->get_executor())) {}
  ~Impl() {
    workers->stop();
    workers->join();
    // Destroying the io_context destroys the connections its pending handlers hold; they still
    // reach into this object (counters, the registry), so it goes first.
    retry_timer.reset();
    acceptor.reset();
    ioc.reset();
  }

  void accept();
  void on_accept(const error_code& ec, tcp::socket socket);
  void reject(tcp::socket socket);
  const Route* find(const std::string& method, const std::string& path, std::string* allow) const;

  TransportOptions opts;
  std::unique_ptr<net::io_context> ioc;
  std::unique_ptr<net::thread_pool> workers;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<net::steady_timer> retry_timer;  // accept retries after EMFILE
  std::vector<Route> routes;
  int port = 0;
  int max_connections = 0;
  std::atomic<int64_t> open{0}, rejected{0}, rejecting{0};
  std::atomic<int64_t> active{0};  // requests handed to a handler and not yet fully answered
  std::atomic<bool> stopping{false};
  std::string busy_response;  // the whole 503 a connection over the limit gets
  std::mutex conns_mu;
  std::list<std::weak_ptr<Connection>> conns;  // to close them all on stop()
};

// One TCP connection: reads requests one after another, answers each through its exchange.
// Everything below runs on the connection's strand.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Impl& srv, tcp::socket socket)
      : srv_(srv), stream_(std::move(socket)), buf_(64 << 10) {}
  ~Connection() {
    std::lock_guard<std::mutex> lock(srv_.conns_mu);
    srv_.conns.erase(self_in_registry_);
    --srv_.open;
  }

  void start() {
    header_deadline_ = SteadyClock::now() + ms(srv_.opts.header_timeout_s);
    client_ = peer_address(stream_.socket());
    error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);  // each SSE chunk is its own write
    read_request();
  }

  // From any thread.
  void close_from_outside() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // ---- called on the strand by HttpExchange ----
  void do_respond(const std::shared_ptr<HttpExchange>& ex, HttpResponse r) {
    if (ex != ex_ || answered_ || closed_) return;
    answered_ = true;
    write_response(std::move(r), /*body_unread=*/false);
  }
  void do_start_stream(const std::shared_ptr<HttpExchange>& ex, int status, std::string type,
                       std::vector<HttpHeader> headers) {
    if (ex != ex_ || answered_ || closed_) return;
    answered_ = streaming_ = true;
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection does
    auto& res = stream_res_.emplace(static_cast<beast_http::status>(status), version_);
    res.set(beast_http::field::server, "vlm");
    res.set(beast_http::field::content_type, type);
    res.set(beast_http::field::cache_control, "no-cache");
    res.set("X-Request-Id", request_id_);
    status_ = status;
    for (const HttpHeader& h : headers) res.set(h.name, h.value);
    if (chunked_) res.chunked(true);
    res.keep_alive(keep_alive_);
    stream_sr_.emplace(res);
    writing_ = true;
    stream_.expires_after(ms(srv_.opts.write_timeout_s));
    beast_http::async_write_header(
        stream_, *stream_sr_,
        beast::bind_front_handler(&Connection::on_stream_written, shared_from_this()));
  }
  void do_write(const std::shared_ptr<HttpExchange>& ex, std::string data) {
    if (ex != ex_ || !streaming_ || closed_ || finish_queued_) return;
    queued_bytes_ += data.size();
    if (queued_bytes_ > kMaxQueuedBytes) {  // the client does not read: treat it as gone
      close();
      return;
    }
    outq_.push_back(std::move(data));
    pump();
  }
  void do_finish(const std::shared_ptr<HttpExchange>& ex) {
    if (ex != ex_ || !streaming_ || closed_) return;
    finish_queued_ = true;
    pump();
  }
  void do_post(const std::shared_ptr<HttpExchange>& ex, const std::function<void()>& fn) {
    if (ex == ex_ && !closed_) fn();
  }
  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  static constexpr size_t kMaxQueuedBytes = size_t{64} << 20;

  // ---- reading a request ----
  void read_request() {
    parser_.emplace();
    parser_->header_limit(srv_.opts.limits.max_header_bytes);
    // Checked after the header, once the gate has passed (not boost::none: Beast 1.74 compares a
    // Content-Length against an empty limit as if it were exceeded).
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    answered_ = streaming_ = finish_queued_ = finish_sent_ = false;
    queued_bytes_ = 0;
    outq_.clear();
    stream_res_.reset();
    stream_sr_.reset();
    if (buf_.size() > 0) {  // a pipelined request is already here
      if (!first_) header_deadline_ = SteadyClock::now() + ms(srv_.opts.header_timeout_s);
      read_header();
      return;
    }
    // Wait for the first byte: the idle keep-alive timeout, or for the first request the header
    // deadline counted from accept.
    if (first_) {
      stream_.expires_at(header_deadline_);
    } else {
      stream_.expires_after(ms(srv_.opts.keep_alive_timeout_s));
    }
    stream_.async_read_some(
        buf_.prepare(4096),
        beast::bind_front_handler(&Connection::on_first_bytes, shared_from_this()));
  }

  void on_first_bytes(error_code ec, size_t n) {
    if (closed_) return;
    if (ec) return close();
    buf_.commit(n);
    if (!first_) header_deadline_ = SteadyClock::now() + ms(srv_.opts.header_timeout_s);
    read_header();
  }

  void read_header() {
    stream_.expires_at(header_deadline_);
    beast_http::async_read_header(
        stream_, buf_, *parser_,
        beast::bind_front_handler(&Connection::on_header, shared_from_this()));
  }

  void on_header(error_code ec, size_t) {
    if (closed_) return;
    stream_.expires_never();
    if (ec == beast_http::error::end_of_stream || ec == net::error::eof ||
        ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset) {
      return close();
    }
    first_ = false;
    begin_request();
    if (ec) return refuse(srv_.error_response(parse_error(ec)), /*body_unread=*/true);
    auto& msg = parser_->get();
    version_ = msg.version();
    keep_alive_ = msg.keep_alive();
    head_ = HttpRequest{};
    head_.method = std::string(msg.method_string());
    head_.target = std::string(msg.target());
    head_.path = head_.target.substr(0, head_.target.find('?'));
    for (const auto& f : msg)
      head_.headers.push_back({std::string(f.name_string()), std::string(f.value())});
    request_id_ = request_id_for(head_.header("X-Request-Id"));
    access_method_ = head_.method;
    access_path_ = head_.path;
    const bool body_unread = !parser_->is_done();

    ContentEncoding encoding = ContentEncoding::kIdentity;
    if (auto err = check_request_header(msg.base(), srv_.opts.limits, &encoding)) {
      return refuse(srv_.error_response(*err), body_unread);
    }
    std::string allow;
    route_ = srv_.find(head_.method, head_.path, &allow);
    if (route_ == nullptr) {
      HttpResponse r = srv_.error_response(
          allow.empty() ? HttpError{404, "no route " + head_.path}
                        : HttpError{405, head_.method + " is not allowed on " + head_.path});
      if (!allow.empty()) r.headers.push_back({"Allow", allow});
      return refuse(std::move(r), body_unread);
    }
    if (route_->gate) {
      if (std::optional<HttpResponse> no = route_->gate(head_))
        return refuse(std::move(*no), body_unread);
    }
    if (!body_unread) return dispatch();
    msg.body().encoding = encoding;
    msg.body().limit = srv_.opts.limits.max_body_bytes;
    parser_->body_limit(srv_.opts.limits.max_body_bytes);  // wire bytes of a chunked body
    if (version_ >= 11 && iequals(head_.header("Expect"), "100-continue")) {
      stream_.expires_after(ms(srv_.opts.write_timeout_s));
      net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                       [self = shared_from_this()](error_code ec, size_t) {
                         if (self->closed_) return;
                         if (ec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    stream_.expires_after(ms(srv_.opts.body_timeout_s));
    beast_http::async_read(stream_, buf_, *parser_,
                           beast::bind_front_handler(&Connection::on_body, shared_from_this()));
  }

  void on_body(error_code ec, size_t) {
    if (closed_) return;
    stream_.expires_never();
    if (ec) {
      if (ec == beast::error::timeout || ec == net::error::eof ||
          ec == beast_http::error::partial_message || ec == net::error::connection_reset ||
          ec == net::error::operation_aborted) {
        return close();
      }
      const auto& body_error = parser_->get().body().error;
      return refuse(srv_.error_response(body_error ? *body_error : parse_error(ec)),
                    /*body_unread=*/true);
    }
    head_.body = std::move(parser_->get().body().data);
    dispatch();
  }

  void dispatch() {
    ex_ = std::make_shared<HttpExchange>(shared_from_this(), std::move(head_));
    ++srv_.active;
    watch();
    const Route* route = route_;
    auto run = [route, ex = ex_, srv = &srv_] {
      try {
        route->handler(ex);
      } catch (const std::exception& e) {
        ex->respond(
            srv->error_response(HttpError{500, std::string("internal error: ") + e.what()}));
      }
    };
    if (route->where == RunOn::kIoThread) {
      run();
    } else {
      net::post(*srv_.workers, std::move(run));
    }
  }

  // While a request is answered, a readable socket means the client closed it (EOF) or sent the
  // next request early (pipelining: then stop watching and leave the bytes for later).
  void watch() {
    watching_ = true;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        beast::bind_front_handler(&Connection::on_watch, shared_from_this()));
  }

  void on_watch(error_code ec) {
    watching_ = false;
    if (closed_) return;
    // Set when the answer completed and cancelled this wait: read the next request now.
    const bool next = std::exchange(next_after_watch_, false);
    if (ec && ec != net::error::operation_aborted) return close();
    if (!ec) {
      char c;
      const ssize_t n = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return close();
      if (n < 0 && !next) return watch();  // a spurious wake-up
    }
    if (next) read_request();
  }

  // ---- writing ----
  beast_http::response<beast_http::string_body> make_response(HttpResponse r) {
    status_ = r.status;
    beast_http::response<beast_http::string_body> res{static_cast<beast_http::status>(r.status),
                                                      version_};
    res.set(beast_http::field::server, "vlm");
    res.set(beast_http::field::content_type, r.content_type);
    res.set("X-Request-Id", request_id_);
    for (const HttpHeader& h : r.headers) res.set(h.name, h.value);
    res.keep_alive(keep_alive_ && !r.close);
    res.body() = std::move(r.body);
    res.prepare_payload();
    return res;
  }

  void write_response(HttpResponse r, bool body_unread) {
    if (body_unread || r.close) keep_alive_ = false;
    res_ = std::make_shared<beast_http::response<beast_http::string_body>>(
        make_response(std::move(r)));
    stream_.expires_after(ms(srv_.opts.write_timeout_s));
    beast_http::async_write(stream_, *res_,
                            [self = shared_from_this(), body_unread](error_code ec, size_t) {
                              self->stream_.expires_never();
                              self->res_.reset();
                              if (self->closed_) return;
                              if (ec) return self->close();
                              self->answer_complete(body_unread);
                            });
  }

  // A request answered before (or instead of) its body: the answer, then a lingering close when
  // a body may still be on its way.
  void refuse(HttpResponse r, bool body_unread) {
    answered_ = true;
    write_response(std::move(r), body_unread);
  }

  void pump() {
    if (writing_ || closed_) return;
    if (!outq_.empty()) {
      cur_.clear();
      for (std::string& s : outq_) cur_ += s;
      outq_.clear();
      queued_bytes_ = 0;
      writing_ = true;
      stream_.expires_after(ms(srv_.opts.write_timeout_s));
      auto done = beast::bind_front_handler(&Connection::on_stream_written, shared_from_this());
      if (chunked_) {
        net::async_write(stream_, beast_http::make_chunk(net::buffer(cur_)), std::move(done));
      } else {
        net::async_write(stream_, net::buffer(cur_), std::move(done));
      }
      return;
    }
    if (finish_queued_ && !finish_sent_) {
      finish_sent_ = true;
      if (!chunked_) return answer_complete(false);
      writing_ = true;
      stream_.expires_after(ms(srv_.opts.write_timeout_s));
      net::async_write(stream_, beast_http::make_chunk_last(),
                       [self = shared_from_this()](error_code ec, size_t) {
                         self->writing_ = false;
                         self->stream_.expires_never();
                         if (self->closed_) return;
                         if (ec) return self->close();
                         self->answer_complete(false);
                       });
    }
  }

  void on_stream_written(error_code ec, size_t) {
    writing_ = false;
    stream_.expires_never();
    if (closed_) return;
    if (ec) return close();
    pump();
  }

  // The whole answer is out: forget the exchange, then the next request or the close.
  void answer_complete(bool body_unread) {
    log_access(status_);
    if (ex_) {
      ex_->complete();
      ex_.reset();
      --srv_.active;
    }
    if (body_unread) return linger();
    if (!keep_alive_) return graceful_close();
    if (watching_) {  // the next read starts once the watch is cancelled
      next_after_watch_ = true;
      error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    read_request();
  }

  // Half-close and discard what the client still sends for a few seconds, so that it reads the
  // answer instead of a reset.
  void linger() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    buf_.consume(buf_.size());
    stream_.expires_after(ms(srv_.opts.linger_s));
    discard();
  }
  void discard() {
    stream_.async_read_some(buf_.prepare(16384),
                            [self = shared_from_this()](error_code ec, size_t) {
                              if (self->closed_) return;
                              if (ec) return self->close();
                              self->discard();
                            });
  }

  void graceful_close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    close();
  }

  // Closes the connection; an answer still in progress is reported to its exchange (the client
  // went away, a write failed or timed out, or the server is stopping).
  void close() {
    if (closed_) return;
    closed_ = true;
    log_access(499);  // a request in progress: the client went away (or the server stopped)
    if (ex_) {
      auto ex = std::move(ex_);
      --srv_.active;
      ex->fire_close();
    }
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  // ---- the access log ----
  void begin_request() {
    request_id_ = request_id_for("");
    access_method_.clear();
    access_path_.clear();
    access_t0_ = SteadyClock::now();
    status_ = 0;
    logged_ = false;
  }

  // Once per request: what was asked, the answer's status, the generation's figures.
  void log_access(int status) {
    if (logged_ || request_id_.empty() || !srv_.opts.on_access) return;
    logged_ = true;
    AccessRecord r;
    r.request_id = request_id_;
    r.method = access_method_;
    r.path = access_path_;
    r.client = client_;
    r.status = status;
    const auto now = SteadyClock::now();
    r.total_s = std::chrono::duration<double>(now - access_t0_).count();
    if (ex_) ex_->usage(&r, access_t0_);
    srv_.opts.on_access(r);
  }

  HttpServer::Impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::string client_;  // the peer's address:port
  std::string request_id_, access_method_, access_path_;
  SteadyClock::time_point access_t0_{};
  int status_ = 0;
  bool logged_ = true;  // nothing to log before a request's header

 public:
  std::list<std::weak_ptr<Connection>>::iterator self_in_registry_;  // set before start()

 private:
  std::optional<beast_http::request_parser<DecodedBody>> parser_;
  HttpRequest head_;
  const Route* route_ = nullptr;
  std::shared_ptr<HttpExchange> ex_;
  SteadyClock::time_point header_deadline_;
  unsigned version_ = 11;
  bool first_ = true;
  bool keep_alive_ = true;
  bool closed_ = false;
  bool watching_ = false, next_after_watch_ = false;
  bool answered_ = false;
  // A whole response being written, or a stream's state.
  std::shared_ptr<beast_http::response<beast_http::string_body>> res_;
  bool streaming_ = false, chunked_ = true, writing_ = false, finish_queued_ = false,
       finish_sent_ = false;
  std::optional<beast_http::response<beast_http::empty_body>> stream_res_;
  std::optional<beast_http::response_serializer<beast_http::empty_body>> stream_sr_;
  std::deque<std::string> outq_;
  size_t queued_bytes_ = 0;
  std::string cur_;
};

// ---- HttpExchange ----

HttpExchange::HttpExchange(std::shared_ptr<Connection> conn, HttpRequest request)
    : conn_(conn), request_(std::move(request)) {}

namespace {
template <typename F>
void on_strand(const std::weak_ptr<Connection>& weak, F&& f) {
  if (auto c = weak.lock())
    net::post(c->executor(), [c, f = std::forward<F>(f)]() mutable { f(*c); });
}
}  // namespace

// The client's X-Request-Id when it is 1 to 128 printable characters, else 16 random hex digits.
std::string request_id_for(std::string_view given) {
  const bool usable =
      !given.empty() && given.size() <= 128 &&
      std::all_of(given.begin(), given.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  if (usable) return std::string(given);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

void HttpExchange::set_usage(int64_t prompt_tokens, int64_t cached_tokens,
                             int64_t completion_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_ = prompt_tokens;
  cached_ = cached_tokens;
  completion_ = completion_tokens;
}

void HttpExchange::mark_first_token() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!first_token_) first_token_ = std::chrono::steady_clock::now();
}

void HttpExchange::usage(AccessRecord* r, std::chrono::steady_clock::time_point t0) {
  std::lock_guard<std::mutex> lock(mu_);
  r->prompt_tokens = prompt_;
  r->cached_tokens = cached_;
  r->completion_tokens = completion_;
  if (first_token_) r->ttft_s = std::chrono::duration<double>(*first_token_ - t0).count();
}

void HttpExchange::respond(HttpResponse r) {
  on_strand(conn_, [self = shared_from_this(), r = std::move(r)](Connection& c) mutable {
    c.do_respond(self, std::move(r));
  });
}

void HttpExchange::start_stream(int status, std::string content_type,
                                std::vector<HttpHeader> headers) {
  on_strand(conn_, [self = shared_from_this(), status, t = std::move(content_type),
                    h = std::move(headers)](Connection& c) mutable {
    c.do_start_stream(self, status, std::move(t), std::move(h));
  });
}

void HttpExchange::write(std::string data) {
  on_strand(conn_, [self = shared_from_this(), d = std::move(data)](Connection& c) mutable {
    c.do_write(self, std::move(d));
  });
}

void HttpExchange::finish() {
  on_strand(conn_, [self = shared_from_this()](Connection& c) { c.do_finish(self); });
}

void HttpExchange::post(std::function<void()> fn) {
  on_strand(conn_, [self = shared_from_this(), fn = std::move(fn)](Connection& c) {
    c.do_post(self, fn);
  });
}

void HttpExchange::on_close(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) on_close_ = std::move(fn);
}

void HttpExchange::hold(std::shared_ptr<void> owner) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) held_ = std::move(owner);
}

void HttpExchange::fire_close() {
  std::function<void()> fn;
  std::shared_ptr<void> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    fn = std::move(on_close_);
    on_close_ = nullptr;
    held = std::move(held_);
  }
  if (fn) fn();
}  // `held` goes here, after the callback

void HttpExchange::complete() {
  std::shared_ptr<void> held;
  std::lock_guard<std::mutex> lock(mu_);
  on_close_ = nullptr;  // answered: nothing to cancel any more
  held = std::move(held_);
}

// ---- HttpServer ----

void HttpServer::Impl::accept() {
  acceptor->async_accept(net::make_strand(*ioc),
                         [this](error_code ec, tcp::socket s) { on_accept(ec, std::move(s)); });
}

void HttpServer::Impl::on_accept(const error_code& ec, tcp::socket socket) {
  if (stopping || !acceptor->is_open()) return;
  if (ec) {
    // Out of file descriptors (or similar): try again shortly instead of spinning.
    retry_timer->expires_after(std::chrono::milliseconds(50));
    retry_timer->async_wait([this](error_code e) {
      if (!e && !stopping) accept();
    });
    return;
  }
  if (open.load() >= max_connections) {
    ++rejected;
    reject(std::move(socket));
  } else {
    ++open;
    auto c = std::make_shared<Connection>(*this, std::move(socket));
    {
      std::lock_guard<std::mutex> lock(conns_mu);
      c->self_in_registry_ = conns.insert(conns.end(), c);
    }
    net::post(c->executor(), [c] { c->start(); });
  }
  accept();
}

// A connection over the limit: one 503, a half-close, what the client still sends discarded for
// at most a second, then the close. At most 64 at a time (beyond that the socket is just closed).
class Rejection : public std::enable_shared_from_this<Rejection> {
 public:
  Rejection(HttpServer::Impl& srv, tcp::socket s)
      : srv_(srv), socket_(std::move(s)), timer_(socket_.get_executor(), std::chrono::seconds(1)) {}
  ~Rejection() { --srv_.rejecting; }
  void start() {
    timer_.async_wait([self = shared_from_this()](error_code) {
      error_code ignored;
      self->socket_.close(ignored);
    });
    // The prepared 503 with this rejection's request id, logged as the other answers are.
    const std::string id = request_id_for("");
    response_ = srv_.busy_response;
    response_.insert(response_.find("\r\n") + 2, "X-Request-Id: " + id + "\r\n");
    if (srv_.opts.on_access) {
      AccessRecord r;
      r.request_id = id;
      r.status = 503;
      r.client = peer_address(socket_);
      srv_.opts.on_access(r);
    }
    net::async_write(socket_, net::buffer(response_),
                     [self = shared_from_this()](error_code ec, size_t) {
                       if (ec) return self->done();
                       error_code ignored;
                       self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
                       self->discard();
                     });
  }

 private:
  void discard() {
    socket_.async_read_some(net::buffer(buf_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->done();
      self->discard();
    });
  }
  void done() {
    error_code ignored;
    socket_.close(ignored);
    timer_.cancel();
  }

  HttpServer::Impl& srv_;
  tcp::socket socket_;
  std::string response_;  // the 503, with its request id
  net::steady_timer timer_;
  std::array<char, 4096> buf_;
};

void HttpServer::Impl::reject(tcp::socket socket) {
  if (rejecting.load() >= 64) return;  // the socket closes here
  ++rejecting;
  std::make_shared<Rejection>(*this, std::move(socket))->start();
}

const Route* HttpServer::Impl::find(const std::string& method, const std::string& path,
                                    std::string* allow) const {
  for (const Route& r : routes) {
    // "PREFIX/*": one more path segment, not empty.
    const bool wildcard = r.path.ends_with("/*");
    const std::string_view prefix = std::string_view(r.path).substr(0, r.path.size() - 1);
    if (wildcard ? !(path.size() > prefix.size() && path.starts_with(prefix) &&
                     path.find('/', prefix.size()) == std::string::npos)
                 : r.path != path) {
      continue;
    }
    if (r.method == method) return &r;
    *allow += (allow->empty() ? "" : ", ") + r.method;
  }
  return nullptr;
}

HttpServer::HttpServer(TransportOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(std::string method, std::string path, RunOn where, Handler h, Gate gate) {
  impl_->routes.push_back(
      Route{std::move(method), std::move(path), where, std::move(h), std::move(gate)});
}

Status HttpServer::listen(const std::string& host, int port) {
  Impl& m = *impl_;
  const std::string where = host + ":" + std::to_string(port);
  error_code ec;
  tcp::resolver resolver(*m.ioc);
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty())
    return invalid_argument("cannot resolve " + where + ": " + ec.message());
  const tcp::endpoint ep = results.begin()->endpoint();
  m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  if (!ec) m.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) return invalid_argument("cannot listen on " + where + ": " + ec.message());
  m.port = m.acceptor->local_endpoint().port();
  {
    const HttpResponse busy = m.error_response(HttpError{503, "too many open connections"});
    m.busy_response =
        "HTTP/1.1 503 Service Unavailable\r\nServer: vlm\r\nContent-Type: " + busy.content_type +
        "\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
        std::to_string(busy.body.size()) + "\r\n\r\n" + busy.body;
  }
  // Keep some descriptors for the model files, images and the engine.
  const int64_t fds = raise_open_file_limit();
  m.max_connections =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(m.opts.max_connections, fds - 128)));
  if (m.max_connections < m.opts.max_connections) {
    log_printf(LogLevel::kWarn, "at most %d connections (the open-file limit is %lld)",
               m.max_connections, static_cast<long long>(fds));
  }
  return ok_status();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::run() {
  Impl& m = *impl_;
  if (m.stopping) return;
  net::post(m.acceptor->get_executor(), [&m] { m.accept(); });
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, m.opts.io_threads); ++i)
    threads.emplace_back([&m] { m.ioc->run(); });
  m.ioc->run();
  for (auto& t : threads) t.join();
  m.workers->join();  // handlers that were running finish (they may still answer: ignored)
}

void HttpServer::stop() {
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return;
  net::post(m.acceptor->get_executor(), [&m] {
    error_code ignored;
    m.acceptor->close(ignored);
    m.retry_timer->cancel();
  });
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> lock(m.conns_mu);
    for (auto& w : m.conns) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) c->close_from_outside();
  live.clear();
  m.workers->stop();
  // The closes above run first (they cancel what the connections were answering), then the
  // I/O threads stop.
  auto timer = std::make_shared<net::steady_timer>(*m.ioc, std::chrono::milliseconds(50));
  timer->async_wait([&m, timer](error_code) { m.ioc->stop(); });
}

boost::asio::io_context& HttpServer::io_context() { return *impl_->ioc; }
int64_t HttpServer::open_connections() const { return impl_->open.load(); }
int64_t HttpServer::rejected_connections() const { return impl_->rejected.load(); }
int64_t HttpServer::active_requests() const { return impl_->active.load(); }
const TransportOptions& HttpServer::options() const { return impl_->opts; }

int64_t raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  return rl.rlim_cur == RLIM_INFINITY ? int64_t{1} << 20 : static_cast<int64_t>(rl.rlim_cur);
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char da[EVP_MAX_MD_SIZE], db[EVP_MAX_MD_SIZE];
  unsigned int la = 0, lb = 0;
  if (EVP_Digest(a.data(), a.size(), da, &la, EVP_sha256(), nullptr) != 1 ||
      EVP_Digest(b.data(), b.size(), db, &lb, EVP_sha256(), nullptr) != 1 || la != lb) {
    return false;
  }
  return CRYPTO_memcmp(da, db, la) == 0;
}

}  // namespace vlm::http
