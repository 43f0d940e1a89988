// vlm public API: the OpenAI-compatible HTTP server (`vlm serve`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm {

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (see Server::port())
  std::string model_name;           // reported by /v1/models; default: the model directory's name
  std::string api_key;              // when set, requests need "Authorization: Bearer <key>"
  std::string allowed_media_path;   // file:// image URLs are served only from under this folder
  bool allow_remote_media = false;  // fetch http(s):// image URLs (off: they are refused)
  int remote_media_timeout_s = 10;  // per fetch: connect and read timeouts
  BatchingOptions batching;         // max_batched_tokens ≤ engine.prefill_chunk; a full queue → 429
  int http_threads = 16;
  // Called on the loading thread before the model loads (tests hold loading with it to see the
  // 503s); empty by default.
  std::function<void()> before_load;
};

class Server {
 public:
  // Binds the socket and starts loading the model on a background thread (no requests served
  // until run()). While the model loads, /health and every API route answer 503.
  static Result<std::unique_ptr<Server>> create(const ServeOptions& options);
  ~Server();
  int port() const;
  // Blocks until the model is loaded (ok) or failed to load (its error).
  Status wait_until_loaded();
  // Serves until stop() (blocking); returns the load error if the model fails to load.
  Status run();
  void stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm
