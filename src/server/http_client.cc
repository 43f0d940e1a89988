#include "server/http_client.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <optional>

namespace vlm::http {

namespace net = boost::asio;
namespace ssl = net::ssl;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

namespace {

struct Url {
  bool https = false;
  std::string host, port, target;
};

bool parse_url(const std::string& url, Url* u, std::string* error) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    *error = "not an absolute URL";
    return false;
  }
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    *error = "unsupported scheme '" + scheme + "'";
    return false;
  }
  u->https = scheme == "https";
  const size_t host_start = scheme_end + 3;
  const size_t path_start = url.find_first_of("/?#", host_start);
  std::string authority = url.substr(host_start, path_start - host_start);
  if (authority.find('@') != std::string::npos) {
    *error = "credentials in the URL are not supported";
    return false;
  }
  u->port = u->https ? "443" : "80";
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) {
      *error = "bad IPv6 host";
      return false;
    }
    u->host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':')
      u->port = authority.substr(close + 2);
  } else {
    const size_t colon = authority.rfind(':');
    u->host = authority.substr(0, colon);
    if (colon != std::string::npos) u->port = authority.substr(colon + 1);
  }
  if (u->host.empty()) {
    *error = "no host";
    return false;
  }
  u->target = path_start == std::string::npos ? "/" : url.substr(path_start);
  if (u->target[0] != '/') u->target = "/" + u->target;
  const size_t fragment = u->target.find('#');
  if (fragment != std::string::npos) u->target.resize(fragment);
  return true;
}

// A redirect's Location against the URL it came from: absolute, or absolute-path.
std::string resolve_location(const Url& from, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  const std::string origin =
      std::string(from.https ? "https://" : "http://") +
      (from.host.find(':') != std::string::npos ? "[" + from.host + "]" : from.host) + ":" +
      from.port;
  if (!location.empty() && location[0] == '/') return origin + location;
  const size_t slash = from.target.rfind('/');
  return origin + from.target.substr(0, slash + 1) + location;
}

// Runs one asynchronous operation on `ioc` to completion and returns its error; `timeout`
// cancels it through `cancel` (for the operations tcp_stream's own timer does not cover).
template <typename Start, typename Cancel>
error_code run_op(net::io_context& ioc, std::chrono::milliseconds timeout, Start start,
                  Cancel cancel) {
  error_code result = net::error::would_block;
  net::steady_timer timer(ioc, timeout);
  bool timed_out = false;
  timer.async_wait([&](error_code ec) {
    if (ec) return;
    timed_out = true;
    cancel();
  });
  start([&](error_code ec, auto&&...) {
    result = ec;
    timer.cancel();
  });
  ioc.restart();
  ioc.run();
  return timed_out ? error_code(net::error::timed_out) : result;
}

template <typename Stream>
FetchResult get(net::io_context& ioc, Stream& stream, const Url& u, size_t max_bytes,
                std::chrono::milliseconds timeout, std::string* location) {
  FetchResult out;
  auto too_large = [&] {
    out.too_large = true;
    out.error = "larger than " + std::to_string(max_bytes) + " bytes";
    return out;
  };
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, u.target, 11};
  req.set(bhttp::field::host, u.host);
  req.set(bhttp::field::user_agent, "vlm");
  req.set(bhttp::field::accept, "*/*");
  req.set(bhttp::field::connection, "close");
  beast::get_lowest_layer(stream).expires_after(timeout);
  error_code ec = run_op(
      ioc, timeout * 2, [&](auto done) { bhttp::async_write(stream, req, done); }, [] {});
  if (ec) {
    out.error = "sending the request: " + ec.message();
    return out;
  }
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::vector_body<uint8_t>> parser;
  parser.body_limit(max_bytes);
  parser.header_limit(64 << 10);
  // tcp_stream's timer covers every read; a slow server gets `timeout` per read, and the whole
  // body is bounded by max_bytes.
  beast::get_lowest_layer(stream).expires_after(timeout);
  ec = run_op(
      ioc, timeout * 2, [&](auto done) { bhttp::async_read_header(stream, buf, parser, done); },
      [] {});
  if (ec == bhttp::error::body_limit) return too_large();  // a Content-Length over the limit
  if (ec) {
    out.error = "reading the response: " + ec.message();
    return out;
  }
  out.status = static_cast<int>(parser.get().result_int());
  if (out.status >= 300 && out.status < 400) {
    auto it = parser.get().find(bhttp::field::location);
    if (it != parser.get().end()) *location = std::string(it->value());
    return out;
  }
  if (out.status != 200) {
    out.error = "HTTP status " + std::to_string(out.status);
    return out;
  }
  for (;;) {
    beast::get_lowest_layer(stream).expires_after(timeout);
    ec = run_op(
        ioc, timeout * 2, [&](auto done) { bhttp::async_read_some(stream, buf, parser, done); },
        [] {});
    if (parser.is_done()) break;
    if (ec == bhttp::error::body_limit) return too_large();
    if (ec) {
      out.error = "reading the body: " + ec.message();
      return out;
    }
  }
  out.body = std::move(parser.get().body());
  out.ok = true;
  return out;
}

FetchResult fetch_once(const Url& u, size_t max_bytes, std::chrono::milliseconds timeout,
                       std::string* location) {
  FetchResult out;
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  tcp::resolver::results_type endpoints;
  error_code ec = run_op(
      ioc, timeout,
      [&](auto done) {
        resolver.async_resolve(u.host, u.port,
                               [&, done](error_code e, tcp::resolver::results_type r) mutable {
                                 endpoints = std::move(r);
                                 done(e);
                               });
      },
      [&] { resolver.cancel(); });
  if (ec) {
    out.error = "cannot resolve " + u.host + ": " + ec.message();
    return out;
  }
  beast::tcp_stream tcp(ioc);
  tcp.expires_after(timeout);
  ec = run_op(
      ioc, timeout * 2, [&](auto done) { tcp.async_connect(endpoints, done); }, [] {});
  if (ec) {
    out.error = "cannot connect to " + u.host + ":" + u.port + ": " + ec.message();
    return out;
  }
  if (!u.https) return get(ioc, tcp, u, max_bytes, timeout, location);

  ssl::context ctx(ssl::context::tls_client);
  ctx.set_default_verify_paths();
  ctx.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> tls(std::move(tcp), ctx);
  if (!SSL_set_tlsext_host_name(tls.native_handle(), u.host.c_str())) {
    out.error = "cannot set the TLS server name";
    return out;
  }
  tls.set_verify_callback(ssl::host_name_verification(u.host));
  beast::get_lowest_layer(tls).expires_after(timeout);
  ec = run_op(
      ioc, timeout * 2, [&](auto done) { tls.async_handshake(ssl::stream_base::client, done); },
      [] {});
  if (ec) {
    out.error = "TLS handshake with " + u.host + " failed: " + ec.message();
    return out;
  }
  return get(ioc, tls, u, max_bytes, timeout, location);
}

}  // namespace

FetchResult fetch_url(const std::string& url, size_t max_bytes, double timeout_s) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string current = url;
  for (int hop = 0; hop <= 5; ++hop) {
    Url u;
    FetchResult out;
    if (!parse_url(current, &u, &out.error)) return out;
    std::string location;
    out = fetch_once(u, max_bytes, timeout, &location);
    if (out.status < 300 || out.status >= 400) return out;
    if (location.empty()) {
      out.error = "HTTP status " + std::to_string(out.status) + " without a Location";
      return out;
    }
    current = resolve_location(u, location);
  }
  FetchResult out;
  out.error = "more than 5 redirects";
  return out;
}

}  // namespace vlm::http
