#include "server/web_ui.h"

#include <string>

namespace vlm {

http::HttpResponse web_asset_response(const WebAsset& asset) {
  http::HttpResponse r;
  r.content_type = std::string(asset.content_type);
  r.body = std::string(asset.body);
  r.headers = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "media-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      {"X-Frame-Options", "DENY"},
      {"Cache-Control", "no-cache"},
  };
  return r;
}

}  // namespace vlm
