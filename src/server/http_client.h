// Fetching an http(s) URL for the server's remote images (Boost.Beast; TLS through OpenSSL with
// the system's certificates and host-name verification). Blocking: the server calls it on a
// worker thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vlm::http {

struct FetchResult {
  bool ok = false;
  int status = 0;             // the final HTTP status (0: no response)
  std::vector<uint8_t> body;  // with ok: the body of a 200
  bool too_large = false;     // the body is longer than max_bytes
  std::string error;          // without ok: why, in a few words
};

// GETs `url` (http:// or https://), following at most 5 redirects. Resolving, connecting, the
// TLS handshake and each read must each finish within `timeout_s`; the body may be at most
// `max_bytes`. Only a 200 is ok.
FetchResult fetch_url(const std::string& url, size_t max_bytes, double timeout_s);

}  // namespace vlm::http
