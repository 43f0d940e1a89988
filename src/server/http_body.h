// The request side of the HTTP transport that needs no socket: the checks a request header must
// pass before its body is read, and a Beast body type that decodes Content-Encoding (gzip,
// deflate, br) as the bytes arrive, counting the limit on the decoded size. The server and the
// fuzz target (tests/fuzz) run exactly this code.
#pragma once

#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace vlm::http {

namespace beast_http = boost::beast::http;

// What a request may carry.
struct RequestLimits {
  uint32_t max_header_bytes = 16 << 10;
  int max_header_fields = 100;
  size_t max_body_bytes = size_t{32} << 20;  // after decoding
};

// A refusal: the status and a one-line reason for the client.
struct HttpError {
  int status = 400;
  std::string message;
};

enum class ContentEncoding { kIdentity, kGzip, kDeflate, kBrotli };

// Framing and encoding checks on a parsed header: the field count, exactly one Content-Length of
// digits only and within the limit (413), Transfer-Encoding "chunked" alone (501 otherwise; Beast
// has already refused one beside a Content-Length), and a Content-Encoding this body type decodes
// (415 otherwise). On success *encoding says how to decode the body.
std::optional<HttpError> check_request_header(const beast_http::request_header<>& h,
                                              const RequestLimits& limits,
                                              ContentEncoding* encoding);

// The status for an error the Beast parser (or DecodedBody) reported while reading a request.
HttpError parse_error(const boost::system::error_code& ec);

// A streaming decoder for one Content-Encoding (zlib or brotli state).
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends the decoding of `in` to *out, never letting *out grow past `limit` bytes; false with
  // *error set on corrupt data or when the limit would be exceeded (then *too_large is true).
  virtual bool put(std::string_view in, std::string* out, size_t limit, std::string* error,
                   bool* too_large) = 0;
  // True once the encoded stream has ended properly (checked when the body ends).
  virtual bool finished() const = 0;
  static std::unique_ptr<Decoder> make(ContentEncoding e);  // nullptr for identity
};

// A Beast Body: the request body as a string, decoded as it arrives. Set encoding and limit on
// the value after the header is read and before the body is; errors are left in `error`.
struct DecodedBody {
  struct value_type {
    std::string data;
    ContentEncoding encoding = ContentEncoding::kIdentity;
    size_t limit = size_t{32} << 20;
    std::optional<HttpError> error;  // why reading stopped, when the body was refused
  };

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(beast_http::header<isRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<uint64_t>& content_length, boost::system::error_code& ec);

    template <class ConstBufferSequence>
    size_t put(const ConstBufferSequence& buffers, boost::system::error_code& ec) {
      size_t n = 0;
      for (auto it = boost::asio::buffer_sequence_begin(buffers);
           it != boost::asio::buffer_sequence_end(buffers); ++it) {
        boost::asio::const_buffer b = *it;
        if (!append(std::string_view(static_cast<const char*>(b.data()), b.size()), ec)) return n;
        n += b.size();
      }
      return n;
    }

    void finish(boost::system::error_code& ec);

   private:
    bool append(std::string_view bytes, boost::system::error_code& ec);

    value_type& body_;
    std::unique_ptr<Decoder> decoder_;
  };
};

}  // namespace vlm::http
