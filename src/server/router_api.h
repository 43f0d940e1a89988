// What routers read from a replica besides the OpenAI API and /metrics: SGLang's GET
// /server_info, GET /model_info and GET /v1/loads, which the Shepherd Model Gateway (smg,
// formerly SGLang's router) asks for when it registers a worker and polls for load balancing.
// Pure functions from plain values to JSON; the HTTP layer serves them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlm {

// What does not change while the server runs.
struct ReplicaInfo {
  std::string model_path;                  // the model directory as given to `vlm serve`
  std::string served_model_name;           // the first --served-model-name
  std::string model_type;                  // config.json's ("qwen3_vl")
  std::vector<std::string> architectures;  // config.json's
  std::string version;                     // "vlm X.Y.Z"
  bool has_vision = true;
  int64_t context_length = 0;        // tokens a request may hold
  int64_t max_total_tokens = 0;      // KV cache capacity in tokens
  int64_t max_running_requests = 0;  // --max-num-seqs
};

// The engine's load now.
struct ReplicaLoad {
  int64_t running = 0, waiting = 0;
  int64_t used_tokens = 0;    // KV blocks in use × block size
  double gen_throughput = 0;  // generated tokens per second since the previous poll
  double cache_hit_rate = 0;  // prefix-cache hit prompt tokens ÷ those looked up, so far
};

// Reads model_type and architectures from the model directory's config.json (left empty when
// it cannot be read: the server is already loaded from it).
void read_model_config(const std::string& model_dir, ReplicaInfo* info);

std::string server_info_json(const ReplicaInfo& info);
std::string model_info_json(const ReplicaInfo& info);
// One data-parallel rank's load, as SGLang's /v1/loads reports it; `timestamp` in ISO 8601.
std::string loads_json(const ReplicaInfo& info, const ReplicaLoad& load,
                       const std::string& timestamp);

}  // namespace vlm
