#include "server/http_body.h"

#include <brotli/decode.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>

namespace vlm::http {

namespace {

using boost::system::error_code;

std::string lower_trimmed(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A short, printable copy of a client's header value for an error message.
std::string quoted(std::string_view v) {
  std::string s = "'";
  for (char c : v.substr(0, 64)) s += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s + (v.size() > 64 ? "...'" : "'");
}

error_code bad_message() {
  return boost::system::errc::make_error_code(boost::system::errc::bad_message);
}

// zlib's inflate for gzip (concatenated members allowed, as gunzip does) and deflate (the zlib
// format HTTP's "deflate" names).
class ZlibDecoder final : public Decoder {
 public:
  explicit ZlibDecoder(bool gzip) : gzip_(gzip) {
    ok_ = inflateInit2(&z_, gzip ? 16 + MAX_WBITS : MAX_WBITS) == Z_OK;
  }
  ~ZlibDecoder() override {
    if (ok_) inflateEnd(&z_);
  }

  bool put(std::string_view in, std::string* out, size_t limit, std::string* error,
           bool* too_large) override {
    const char* name = gzip_ ? "gzip" : "deflate";
    if (!ok_) {
      *error = std::string("cannot start the ") + name + " decoder";
      return false;
    }
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z_.avail_in = static_cast<uInt>(in.size());
    char buf[16384];
    for (;;) {
      if (ended_ && z_.avail_in > 0) {
        if (!gzip_) {
          *error = "data after the end of the deflate stream";
          return false;
        }
        inflateReset(&z_);  // the next gzip member
        ended_ = false;
      }
      if (z_.avail_in == 0 && !pending_) return true;
      z_.next_out = reinterpret_cast<Bytef*>(buf);
      z_.avail_out = sizeof(buf);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      const size_t produced = sizeof(buf) - z_.avail_out;
      if (produced > limit - std::min(limit, out->size())) {
        *too_large = true;
        *error = "the decoded body exceeds the limit";
        return false;
      }
      out->append(buf, produced);
      pending_ = z_.avail_out == 0;  // the output was full: more may be waiting
      if (rc == Z_STREAM_END) {
        ended_ = true;
        pending_ = false;
      } else if (rc == Z_BUF_ERROR) {
        if (z_.avail_in == 0 && !pending_) return true;  // needs more input
      } else if (rc != Z_OK) {
        *error =
            std::string("corrupt ") + name + " data" + (z_.msg ? std::string(": ") + z_.msg : "");
        return false;
      }
    }
  }

  bool finished() const override { return ended_; }

 private:
  bool gzip_;
  bool ok_ = false;
  bool ended_ = false;
  bool pending_ = false;
  z_stream z_{};
};

class BrotliDecoder final : public Decoder {
 public:
  BrotliDecoder() : s_(BrotliDecoderCreateInstance(nullptr, nullptr, nullptr)) {}
  ~BrotliDecoder() override {
    if (s_ != nullptr) BrotliDecoderDestroyInstance(s_);
  }

  bool put(std::string_view in, std::string* out, size_t limit, std::string* error,
           bool* too_large) override {
    if (s_ == nullptr) {
      *error = "cannot start the brotli decoder";
      return false;
    }
    size_t avail_in = in.size();
    const uint8_t* next_in = reinterpret_cast<const uint8_t*>(in.data());
    uint8_t buf[16384];
    for (;;) {
      if (ended_) {
        if (avail_in == 0) return true;
        *error = "data after the end of the brotli stream";
        return false;
      }
      size_t avail_out = sizeof(buf);
      uint8_t* next_out = buf;
      const BrotliDecoderResult r =
          BrotliDecoderDecompressStream(s_, &avail_in, &next_in, &avail_out, &next_out, nullptr);
      const size_t produced = sizeof(buf) - avail_out;
      if (produced > limit - std::min(limit, out->size())) {
        *too_large = true;
        *error = "the decoded body exceeds the limit";
        return false;
      }
      out->append(reinterpret_cast<const char*>(buf), produced);
      switch (r) {
        case BROTLI_DECODER_RESULT_SUCCESS:
          ended_ = true;
          break;
        case BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT:
          return true;
        case BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT:
          break;
        default:
          *error = std::string("corrupt brotli data: ") +
                   BrotliDecoderErrorString(BrotliDecoderGetErrorCode(s_));
          return false;
      }
    }
  }

  bool finished() const override { return ended_; }

 private:
  BrotliDecoderState* s_;
  bool ended_ = false;
};

const char* encoding_name(ContentEncoding e) {
  switch (e) {
    case ContentEncoding::kGzip:
      return "gzip";
    case ContentEncoding::kDeflate:
      return "deflate";
    case ContentEncoding::kBrotli:
      return "br";
    case ContentEncoding::kIdentity:
      break;
  }
  return "identity";
}

}  // namespace

std::unique_ptr<Decoder> Decoder::make(ContentEncoding e) {
  switch (e) {
    case ContentEncoding::kGzip:
      return std::make_unique<ZlibDecoder>(true);
    case ContentEncoding::kDeflate:
      return std::make_unique<ZlibDecoder>(false);
    case ContentEncoding::kBrotli:
      return std::make_unique<BrotliDecoder>();
    case ContentEncoding::kIdentity:
      break;
  }
  return nullptr;
}

std::optional<HttpError> check_request_header(const beast_http::request_header<>& h,
                                              const RequestLimits& limits,
                                              ContentEncoding* encoding) {
  *encoding = ContentEncoding::kIdentity;
  int fields = 0;
  int content_lengths = 0, transfer_encodings = 0, content_encodings = 0;
  std::string_view length, transfer, content;
  for (const auto& f : h) {
    ++fields;
    switch (f.name()) {
      case beast_http::field::content_length:
        ++content_lengths;
        length = std::string_view(f.value().data(), f.value().size());
        break;
      case beast_http::field::transfer_encoding:
        ++transfer_encodings;
        transfer = std::string_view(f.value().data(), f.value().size());
        break;
      case beast_http::field::content_encoding:
        ++content_encodings;
        content = std::string_view(f.value().data(), f.value().size());
        break;
      default:
        break;
    }
  }
  if (fields > limits.max_header_fields) {
    return HttpError{431, "the request has " + std::to_string(fields) + " header fields (at most " +
                              std::to_string(limits.max_header_fields) + ")"};
  }
  if (content_lengths > 1) return HttpError{400, "more than one Content-Length header"};
  if (content_lengths == 1) {
    if (length.empty() || length.size() > 19 ||
        !std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return HttpError{400, "Content-Length must be digits only, got " + quoted(length)};
    }
    if (std::stoull(std::string(length)) > limits.max_body_bytes) {
      return HttpError{413, "the request body is larger than " +
                                std::to_string(limits.max_body_bytes) + " bytes"};
    }
  }
  if (transfer_encodings > 1 || (transfer_encodings == 1 && lower_trimmed(transfer) != "chunked")) {
    return HttpError{501,
                     "Transfer-Encoding " + quoted(transfer) + " is not supported (only chunked)"};
  }
  if (content_encodings > 1) return HttpError{415, "more than one Content-Encoding header"};
  if (content_encodings == 1) {
    const std::string e = lower_trimmed(content);
    if (e == "gzip" || e == "x-gzip") {
      *encoding = ContentEncoding::kGzip;
    } else if (e == "deflate") {
      *encoding = ContentEncoding::kDeflate;
    } else if (e == "br") {
      *encoding = ContentEncoding::kBrotli;
    } else if (e != "identity" && !e.empty()) {
      return HttpError{415, "Content-Encoding " + quoted(content) +
                                " is not supported (gzip, deflate, br or identity)"};
    }
  }
  return std::nullopt;
}

HttpError parse_error(const error_code& ec) {
  if (ec == beast_http::error::header_limit)
    return HttpError{431, "the request header is too large"};
  if (ec == beast_http::error::body_limit) return HttpError{413, "the request body is too large"};
  if (ec == beast_http::error::bad_content_length) return HttpError{400, "bad Content-Length"};
  if (ec == beast_http::error::bad_transfer_encoding) {
    return HttpError{400, "bad Transfer-Encoding (or one together with Content-Length)"};
  }
  return HttpError{400, "malformed HTTP request: " + ec.message()};
}

void DecodedBody::reader::init(const boost::optional<uint64_t>& content_length, error_code& ec) {
  ec = {};
  if (content_length && *content_length > body_.limit) {
    body_.error =
        HttpError{413, "the request body is larger than " + std::to_string(body_.limit) + " bytes"};
    ec = beast_http::error::body_limit;
    return;
  }
  decoder_ = Decoder::make(body_.encoding);
  // One allocation: a body of known length gets exactly that; a decoded or chunked one the whole
  // limit, of which only the pages written become resident. Growing by doubling instead would
  // hold the old and the new copy at once (near the limit: up to twice the limit resident).
  body_.data.reserve(!decoder_ && content_length ? static_cast<size_t>(*content_length)
                                                 : body_.limit);
}

bool DecodedBody::reader::append(std::string_view bytes, error_code& ec) {
  if (!decoder_) {
    if (bytes.size() > body_.limit - std::min(body_.limit, body_.data.size())) {
      body_.error = HttpError{
          413, "the request body is larger than " + std::to_string(body_.limit) + " bytes"};
      ec = beast_http::error::body_limit;
      return false;
    }
    body_.data.append(bytes);
    return true;
  }
  std::string why;
  bool too_large = false;
  if (decoder_->put(bytes, &body_.data, body_.limit, &why, &too_large)) return true;
  if (too_large) {
    body_.error = HttpError{413, std::string("the request body, decoded from ") +
                                     encoding_name(body_.encoding) + ", is larger than " +
                                     std::to_string(body_.limit) + " bytes"};
    ec = beast_http::error::body_limit;
  } else {
    body_.error = HttpError{400, why};
    ec = bad_message();
  }
  return false;
}

void DecodedBody::reader::finish(error_code& ec) {
  ec = {};
  if (decoder_ && !decoder_->finished()) {
    body_.error = HttpError{400, std::string("the ") + encoding_name(body_.encoding) +
                                     " body ends before its compressed stream does"};
    ec = bad_message();
  }
}

}  // namespace vlm::http
