// vlm public API: the OpenAI-compatible HTTP server (`vlm serve`).
#pragma once

#include <cstdint>
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
};

class Server {
 public:
  // Loads the model, starts the engine thread and binds the socket (no requests served yet).
  static Result<std::unique_ptr<Server>> create(const ServeOptions& options);
  ~Server();
  int port() const;
  // Serves until stop() (blocking).
  Status run();
  void stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm
