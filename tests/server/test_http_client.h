// A blocking HTTP/1.1 client for the server tests (Boost.Beast), one connection per request, with
// a 60 s socket timeout so that a hung server fails the test instead of hanging it.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <optional>
#include <string>

namespace vlm::test_http {

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names as sent
};

class Client {
 public:
  explicit Client(int port, std::string host = "127.0.0.1") : host_(std::move(host)), port_(port) {}

  std::optional<Reply> Get(const std::string& path) { return send("GET", path, "", ""); }
  std::optional<Reply> Post(const std::string& path, const std::string& body,
                            const std::string& type) {
    return send("POST", path, body, type);
  }
  // Extra request headers (e.g. Authorization) for the calls that follow.
  void set_header(const std::string& name, const std::string& value) { extra_[name] = value; }

 private:
  std::optional<Reply> send(const std::string& method, const std::string& path,
                            const std::string& body, const std::string& type) {
    namespace beast = boost::beast;
    namespace http = beast::http;
    try {
      boost::asio::io_context ioc;
      boost::asio::ip::tcp::socket sock(ioc);
      sock.connect({boost::asio::ip::make_address(host_), static_cast<unsigned short>(port_)});
      timeval tv{60, 0};
      setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(sock.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      http::request<http::string_body> req{http::string_to_verb(method), path, 11};
      req.set(http::field::host, host_);
      req.set(http::field::connection, "close");
      if (!type.empty()) req.set(http::field::content_type, type);
      for (const auto& [k, v] : extra_) req.set(k, v);
      req.body() = body;
      req.prepare_payload();
      http::write(sock, req);
      beast::flat_buffer buf;
      http::response_parser<http::string_body> parser;
      parser.body_limit(size_t{1} << 30);
      http::read(sock, buf, parser);
      Reply r;
      r.status = static_cast<int>(parser.get().result_int());
      r.body = std::move(parser.get().body());
      for (const auto& f : parser.get())
        r.headers[std::string(f.name_string())] = std::string(f.value());
      return r;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  std::string host_;
  int port_;
  std::map<std::string, std::string> extra_;
};

}  // namespace vlm::test_http
