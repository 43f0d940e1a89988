// libFuzzer target: arbitrary bytes as an HTTP request, through exactly what the server runs on
// them before a handler sees them: Beast's request parser with the server's limits, the header
// checks (framing, Content-Length, encodings) and the decoding body (gzip, deflate, br under a
// cap). The input is fed in pieces whose sizes come from its first byte, as a socket would.
// Build and run: scripts/fuzz.sh http_request SECONDS (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "http_feed.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;  // bytes per read: 1..64
  vlm::http::RequestLimits limits;
  limits.max_body_bytes = 1 << 20;  // small, so that bombs reach the cap quickly
  const vlm::http::FedRequest r = vlm::http::feed_request(
      std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), limits, piece);
  // What the server relies on afterwards.
  if (r.done && r.body.size() > limits.max_body_bytes) __builtin_trap();
  if (r.error && (r.error->status < 400 || r.error->status > 599 || r.error->message.empty()))
    __builtin_trap();
  return 0;
}
