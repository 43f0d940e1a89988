// The built-in web pages of `vlm serve`: the chat page at / and the live dashboard at
// /dashboard. Their files (web/ in the source tree, plus Chart.js and markdown-it from Debian's
// libjs-chart.js and libjs-markdown-it) are embedded in the binary at build time, so the server
// needs nothing on disk and the pages load nothing from any other host.
#pragma once

#include <string_view>
#include <vector>

#include "server/http_transport.h"

namespace vlm {

struct WebAsset {
  std::string_view path;  // "/", "/dashboard", "/static/chat.js", ...
  std::string_view content_type;
  std::string_view body;
};

// Every embedded file (defined by the source CMake generates from the asset list).
const std::vector<WebAsset>& web_assets();

// An asset as a response with the pages' headers: a Content-Security-Policy that allows
// scripts, styles and connections to this server only (no inline script, no eval) and images
// from it or data:/blob: URLs, X-Content-Type-Options: nosniff, no referrer, no framing.
http::HttpResponse web_asset_response(const WebAsset& asset);

}  // namespace vlm
