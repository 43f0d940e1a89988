// The HTTP responses of the API routes: a JSON body, or an ApiError as OpenAI's error object
// (429 and 503 with Retry-After).
#pragma once

#include <string>
#include <utility>

#include "server/http_transport.h"
#include "server/openai_api.h"

namespace vlm {

inline http::HttpResponse json_response(int status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

inline http::HttpResponse error_response(const ApiError& e) {
  http::HttpResponse r = json_response(e.http_status, api_error_json(e));
  if (e.http_status == 429 || e.http_status == 503) r.headers.push_back({"Retry-After", "1"});
  return r;
}

}  // namespace vlm
