// Feeds a request's bytes to the transport's parser in reads of `piece` bytes, the way the server
// runs it (src/server/http_transport.cc): Beast's parser with the header limit, then
// check_request_header once the header is in, then the decoding body under the body limit. Shared
// by the unit tests and the fuzz target.
#pragma once

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_body.h"

namespace vlm::http {

struct FedRequest {
  std::optional<HttpError> error;  // from the parser, the header checks or the body
  std::string body;                // when done
  bool done = false;
};

inline FedRequest feed_request(std::string_view wire, const RequestLimits& limits, size_t piece) {
  beast_http::request_parser<DecodedBody> p;
  p.header_limit(limits.max_header_bytes);
  p.body_limit(std::numeric_limits<uint64_t>::max());  // as the server: checked after the header
  FedRequest out;
  auto fail = [&](const boost::system::error_code& ec) {
    out.error = p.get().body().error ? *p.get().body().error : parse_error(ec);
    return out;
  };
  bool checked = false;
  size_t used = 0, received = std::min(wire.size(), piece);  // consumed; "arrived" so far
  boost::system::error_code ec;
  for (;;) {
    const size_t n = p.put(boost::asio::const_buffer(wire.data() + used, received - used), ec);
    used += n;
    if (ec == beast_http::error::need_more) ec = {};
    if (ec) return fail(ec);
    if (p.is_header_done() && !checked) {
      checked = true;
      ContentEncoding encoding;
      if (auto err = check_request_header(p.get().base(), limits, &encoding)) {
        out.error = err;
        return out;
      }
      p.get().body().encoding = encoding;
      p.get().body().limit = limits.max_body_bytes;
      p.body_limit(limits.max_body_bytes);
    }
    if (p.is_done()) break;
    if (n == 0 || used == received) {  // wait for the next read
      if (received == wire.size()) {
        p.put_eof(ec);
        return fail(ec ? ec : beast_http::error::partial_message);
      }
      received = std::min(wire.size(), received + piece);
    }
  }
  out.done = true;
  out.body = std::move(p.get().body().data);
  return out;
}

}  // namespace vlm::http
