// vlm public API: the OpenAI-compatible HTTP server (`vlm serve`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm {

// KV events published over ZeroMQ in vLLM's wire format, for a KV-aware router (docs/deploy.md).
struct KvEventsOptions {
  // The PUB socket's endpoint ("" = no events). Bound when it has a wildcard ("tcp://*:5557",
  // "tcp://[::]:5557") or is ipc:// or inproc://, else connected to ("tcp://router:5557").
  std::string endpoint;
  // A ROUTER socket (bound) where a subscriber that missed batches asks for them again by their
  // sequence number ("" = none).
  std::string replay_endpoint;
  std::string topic;             // the first frame of every message
  int64_t buffer_steps = 10000;  // batches kept for replay
  int32_t hwm = 100000;          // the PUB socket's high-water mark (messages)
};

// What a server does with its model: generate (the chat and completion routes), embed
// (/v1/embeddings; /v1/score and /v1/rerank by cosine similarity) or rerank (/v1/score,
// /v1/rerank). kAuto: embed when the checkpoint is a sentence-transformers model pooling the
// last token (modules.json), rerank when its config names a sequence classifier reading the
// "no" and "yes" tokens (vLLM's hf_overrides for Qwen rerankers), else generate.
enum class ServeTask { kAuto, kGenerate, kEmbed, kRerank };
const char* serve_task_name(ServeTask t);  // "auto", "generate", "embed", "rerank"
Result<ServeTask> parse_serve_task(std::string_view name);
// The task a checkpoint's files say (kGenerate when they say nothing); an error for a
// sentence-transformers model that pools otherwise than by the last token.
Result<ServeTask> detect_serve_task(const std::string& model_dir);

struct ServeOptions {
  EngineOptions engine;
  ServeTask task = ServeTask::kAuto;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see Server::port())
  // The names requests may give as `model`, all listed by /v1/models; the first is the one
  // replies and the metrics' model_name label carry. Default: the model directory's name.
  std::vector<std::string> model_names;
  // The prefix cache's KV events (needs engine.batching.prefix_caching).
  KvEventsOptions kv_events;
  std::string api_key;              // when set, requests need "Authorization: Bearer <key>"
  std::string allowed_media_path;   // file:// image URLs are served only from under this folder
  bool allow_remote_media = false;  // fetch http(s):// image URLs (off: they are refused)
  int remote_media_timeout_s = 10;  // per fetch: connect and read timeouts
  // Per image: a request's min_pixels / max_pixels above it are refused (400). The default is the
  // Qwen3-VL processor's own largest budget (16,384 tokens).
  int64_t max_image_pixels = 16777216;
  // The HTTP transport (docs/architecture.md, "Serving").
  int http_threads = 8;              // workers: JSON, chat template, tokenizer, image decoding
  int io_threads = 2;                // sockets, /health, /metrics, writing replies
  int max_connections = 4096;        // open at once; beyond: 503 and close
  double header_timeout_s = 10;      // a request's header, from its first byte (or the connection)
  double keep_alive_timeout_s = 75;  // an idle connection between requests
  double body_timeout_s = 60;        // a request's whole body
  double write_timeout_s = 60;       // a reply write that makes no progress
  double health_timeout_s = 30;      // /health is 503 when the engine loop has not beaten for this
  double shutdown_timeout_s = 30;    // draining: how long running requests may still take
  bool webui = true;                 // the chat page at / and the dashboard at /dashboard
  // The Responses API's stored responses (store, previous_response_id, GET / DELETE
  // /v1/responses/{id}): at most this many, and this many MiB of their JSON, in memory; the
  // least recently used go first. 0 responses: none are kept.
  int64_t responses_store = 1000;
  int64_t responses_store_mib = 256;
  bool handle_signals = false;  // SIGTERM / SIGINT drain the server (run() then returns ok)
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
  // Serves until stop() or the end of a drain (blocking); returns the load error if the model
  // fails to load.
  Status run();
  // Stops at once: every connection is closed, unfinished requests are cancelled.
  void stop();
  // Drains: /health turns 503, new API requests get 503, running requests finish (cancelled
  // after shutdown_timeout_s), then run() returns. What SIGTERM does with handle_signals.
  void drain();

 private:
  friend struct ServerAccess;  // the server's own sources (src/server/http_server.cc)
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm
