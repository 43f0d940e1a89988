// The request checks and the decoding body of the HTTP transport, without sockets: Beast's parser
// fed the bytes a client would send, then check_request_header and DecodedBody as the server runs
// them.
#include "server/http_body.h"

#include <brotli/encode.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <string>

#include "http_feed.h"

namespace vlm::http {
namespace {

std::string zlib_compress(const std::string& in, bool gzip) {
  z_stream z{};
  EXPECT_EQ(
      deflateInit2(&z, 9, Z_DEFLATED, gzip ? 16 + MAX_WBITS : MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
      Z_OK);
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string brotli_compress(const std::string& in) {
  size_t n = BrotliEncoderMaxCompressedSize(in.size());
  std::string out(n, '\0');
  EXPECT_TRUE(BrotliEncoderCompress(
      BROTLI_DEFAULT_QUALITY, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, in.size(),
      reinterpret_cast<const uint8_t*>(in.data()), &n, reinterpret_cast<uint8_t*>(out.data())));
  out.resize(n);
  return out;
}

using Parsed = FedRequest;

Parsed parse(const std::string& wire, size_t limit = 1 << 20, size_t piece = 7) {
  RequestLimits limits;
  limits.max_body_bytes = limit;
  return feed_request(wire, limits, piece);
}

std::string post(const std::string& headers, const std::string& body, bool length = true) {
  return "POST /v1/x HTTP/1.1\r\nHost: h\r\n" + headers +
         (length ? "Content-Length: " + std::to_string(body.size()) + "\r\n" : "") + "\r\n" + body;
}

std::string chunked(const std::string& body, size_t chunk = 1000) {
  std::string out;
  for (size_t i = 0; i < body.size(); i += chunk) {
    const std::string part = body.substr(i, chunk);
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", part.size());
    out += size + part + "\r\n";
  }
  return out + "0\r\n\r\n";
}

std::string text(size_t n) {
  std::mt19937 rng(7);
  std::string s(n, ' ');
  for (char& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

TEST(HttpBody, PlainAndChunkedBodiesArriveWhole) {
  const std::string body = text(5000);
  for (size_t piece : {1, 7, 4096}) {
    Parsed a = parse(post("", body), 1 << 20, piece);
    ASSERT_TRUE(a.done) << (a.error ? a.error->message : "");
    EXPECT_EQ(a.body, body);
    Parsed b = parse(post("Transfer-Encoding: chunked\r\n", chunked(body), false), 1 << 20, piece);
    ASSERT_TRUE(b.done) << (b.error ? b.error->message : "");
    EXPECT_EQ(b.body, body);
  }
}

TEST(HttpBody, CompressedBodiesAreDecoded) {
  const std::string body = text(100000);
  struct Case {
    const char* name;
    std::string data;
  } cases[] = {{"gzip", zlib_compress(body, true)},
               {"x-gzip", zlib_compress(body, true)},
               {"deflate", zlib_compress(body, false)},
               {"br", brotli_compress(body)},
               {"GZip", zlib_compress(body, true)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Parsed a = parse(post(std::string("Content-Encoding: ") + c.name + "\r\n", c.data));
    ASSERT_TRUE(a.done) << (a.error ? a.error->message : "");
    EXPECT_EQ(a.body, body);
    Parsed b = parse(
        post(std::string("Content-Encoding: ") + c.name + "\r\nTransfer-Encoding: chunked\r\n",
             chunked(c.data, 333), false));
    ASSERT_TRUE(b.done) << (b.error ? b.error->message : "");
    EXPECT_EQ(b.body, body);
  }
  // gzip members one after another decode as one body, as gunzip does.
  Parsed two = parse(
      post("Content-Encoding: gzip\r\n", zlib_compress("abc", true) + zlib_compress("def", true)));
  ASSERT_TRUE(two.done);
  EXPECT_EQ(two.body, "abcdef");
}

TEST(HttpBody, TheLimitCountsDecodedBytes) {
  const std::string zeros(10 << 20, '\0');
  for (const char* enc : {"gzip", "deflate", "br"}) {
    SCOPED_TRACE(enc);
    const std::string data = std::string(enc) == "br"
                                 ? brotli_compress(zeros)
                                 : zlib_compress(zeros, std::string(enc) == "gzip");
    ASSERT_LT(data.size(), size_t{64} << 10);  // a bomb: 10 MiB from a few KiB
    Parsed p = parse(post(std::string("Content-Encoding: ") + enc + "\r\n", data), 1 << 20, 4096);
    ASSERT_TRUE(p.error.has_value());
    EXPECT_EQ(p.error->status, 413);
    EXPECT_NE(p.error->message.find("decoded from"), std::string::npos) << p.error->message;
  }
  // Exactly at the limit passes; one byte more does not.
  EXPECT_TRUE(
      parse(post("Content-Encoding: gzip\r\n", zlib_compress(text(1000), true)), 1000).done);
  Parsed over = parse(post("Content-Encoding: gzip\r\n", zlib_compress(text(1001), true)), 1000);
  ASSERT_TRUE(over.error.has_value());
  EXPECT_EQ(over.error->status, 413);
  // Plain and chunked bodies: the same limit.
  EXPECT_EQ(parse(post("", text(1001)), 1000).error->status, 413);
  EXPECT_EQ(parse(post("Transfer-Encoding: chunked\r\n", chunked(text(1001), 100), false), 1000)
                .error->status,
            413);
  EXPECT_TRUE(
      parse(post("Transfer-Encoding: chunked\r\n", chunked(text(1000), 100), false), 1000).done);
}

TEST(HttpBody, CorruptOrTruncatedCompressedBodiesAre400) {
  const std::string gz = zlib_compress(text(5000), true);
  struct Case {
    std::string headers, body;
  } cases[] = {
      {"Content-Encoding: gzip\r\n", "this is not gzip"},
      {"Content-Encoding: gzip\r\n", gz.substr(0, gz.size() - 10)},  // truncated
      {"Content-Encoding: deflate\r\n", gz},                         // gzip where zlib is due
      {"Content-Encoding: br\r\n", "\xff\xff\xff\xff garbage"},
      {"Content-Encoding: deflate\r\n", zlib_compress("abc", false) + "trailing"},
  };
  for (const Case& c : cases) {
    Parsed p = parse(post(c.headers, c.body));
    ASSERT_TRUE(p.error.has_value()) << c.headers;
    EXPECT_EQ(p.error->status, 400) << c.headers << p.error->message;
  }
}

TEST(HttpBody, HeaderChecks) {
  struct Case {
    std::string wire;
    int status;
    const char* needle;
  } cases[] = {
      {post("Content-Length: 3\r\n", "abc"), 400, "more than one Content-Length"},  // twice
      {"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\nabc", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc", 400, "digits only"},
      {"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\nabc", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
       "Transfer-Encoding"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
       "Transfer-Encoding"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 501, "Transfer-Encoding"},
      {post("Content-Encoding: zstd\r\n", "abc"), 415, "zstd"},
      {post("Content-Encoding: gzip, br\r\n", "abc"), 415, "not supported"},
      {post("Content-Encoding: gzip\r\nContent-Encoding: br\r\n", "abc"), 415, "more than one"},
      {post("", std::string(2 << 20, 'x')), 413, "larger than"},
      {"GET / HTTP/1.1\r\nX: " + std::string(20 << 10, 'a') + "\r\n\r\n", 431, "too large"},
  };
  for (const Case& c : cases) {
    Parsed p = parse(c.wire);
    ASSERT_TRUE(p.error.has_value()) << c.wire.substr(0, 120);
    EXPECT_EQ(p.error->status, c.status) << c.wire.substr(0, 120) << " → " << p.error->message;
    EXPECT_NE(p.error->message.find(c.needle), std::string::npos) << p.error->message;
  }
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 101; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  Parsed p = parse(many + "\r\n");
  ASSERT_TRUE(p.error.has_value());
  EXPECT_EQ(p.error->status, 431);
  // Tolerated: surrounding spaces, identity, and a header of 100 fields.
  EXPECT_TRUE(parse("POST / HTTP/1.1\r\nContent-Length:  3 \r\n\r\nabc").done);
  EXPECT_TRUE(parse(post("Content-Encoding: identity\r\n", "abc")).done);
  std::string hundred = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 100; ++i) hundred += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_TRUE(parse(hundred + "\r\n").done);
}

}  // namespace
}  // namespace vlm::http
