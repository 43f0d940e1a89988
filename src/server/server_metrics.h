// The metrics `vlm serve` exports on /metrics (and /dashboard/metrics): its own vlm_* families,
// the same signals under vLLM's names, and the process_* ones. The request path records into
// them as replies progress; the engine's counters are mirrored at scrape time.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "server/metrics.h"
#include "vlm/engine.h"
#include "vlm/request.h"

namespace vlm {

struct ServerMetrics {
  // Registers every family; `gpu` adds the vlm_gpu_* gauges (held at -1 until NVML is read).
  ServerMetrics(const std::string& model_name, bool gpu);
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Once the engine is loaded: the KV cache's size, and vLLM's cache_config_info.
  void loaded(const Engine::CoreStats& st, bool prefix_caching);
  // A request's first token came `s` seconds after it arrived.
  void observe_ttft(double s);
  // A choice's token came `s` seconds after its previous one.
  void observe_itl(double s);
  // A request's reply is complete, `s` seconds after it arrived.
  void observe_e2e(double s);
  // A choice ended: its token counts, queue time, and its images' and videos' work.
  void record_finished(const RequestStats& st, bool pooled = false);
  // At scrape time: the connections, the process, and (with `engine`, once loaded) the engine
  // core's gauges and the counters it keeps, mirrored as increments since the last scrape.
  void scrape(int64_t open_connections, int64_t rejected_connections, const Engine* engine);

  MetricsRegistry registry;
  Counter* requests = nullptr;  // by outcome
  // Pooling requests by endpoint ("embeddings", "score", "rerank"), each counted once however many
  // prompts it pools.
  Counter* pooling_requests = nullptr;
  Counter* pooled_prompts = nullptr;  // the prompts pooled (prefill-only requests finished)
  Counter* prompt_tokens = nullptr;
  Counter* generated_tokens = nullptr;
  Counter* image_tokens = nullptr;
  Counter* images = nullptr;
  Counter* video_tokens = nullptr;
  Counter* videos = nullptr;
  Counter* video_frames = nullptr;
  Histogram* video_decode_time = nullptr;
  Counter* cache_hits = nullptr;
  Counter* cache_misses = nullptr;
  Counter* preemptions = nullptr;
  Counter* prefix_queries = nullptr;
  Counter* prefix_hits = nullptr;
  Counter* prefix_evictions = nullptr;
  Counter* conns_rejected = nullptr;
  Histogram* ttft = nullptr;
  Histogram* itl = nullptr;
  Histogram* e2e = nullptr;
  Histogram* queue_time = nullptr;
  Histogram* preprocess_time = nullptr;
  Histogram* encode_time = nullptr;
  Histogram* step_time = nullptr;
  Histogram* encoder_slices = nullptr;  // per step that ran part of an image encode
  Histogram* encoder_time = nullptr;
  // The same signals under vLLM's names, types, units and buckets, labelled model_name and
  // engine as vLLM labels them: what routers and gateways read (the endpoint picker of the
  // Gateway API Inference Extension, vLLM's production-stack router, SGLang's gateway).
  struct VllmMetrics {
    std::string labels;  // model_name="...",engine="0"
    Gauge* running = nullptr;
    Gauge* waiting = nullptr;
    Gauge* kv_usage = nullptr;  // 0..1
    Counter* prefix_queries = nullptr;
    Counter* prefix_hits = nullptr;
    Counter* prompt_tokens = nullptr;
    Counter* generation_tokens = nullptr;
    Histogram* ttft = nullptr;
    Histogram* itl = nullptr;
    Histogram* e2e = nullptr;
    // Speculative decoding (its spec_decode family): drafts verified (per request and step),
    // tokens proposed and accepted, and acceptances by position (label "position", from 0).
    Counter* spec_drafts = nullptr;
    Counter* spec_draft_tokens = nullptr;
    Counter* spec_accepted = nullptr;
    Counter* spec_accepted_per_pos = nullptr;
  } vllm;
  Gauge* running = nullptr;
  Gauge* waiting = nullptr;
  Gauge* kv_used = nullptr;
  Gauge* kv_total = nullptr;
  Gauge* kv_tokens_total = nullptr;
  Gauge* kv_bytes = nullptr;
  Gauge* prefix_blocks = nullptr;
  // A hybrid model's (Qwen3.5) linear-attention state: slots and snapshots, their bytes, the
  // snapshots held now and those replaced.
  Gauge* state_slots = nullptr;
  Gauge* state_snapshots = nullptr;
  Gauge* state_bytes = nullptr;
  Gauge* state_snapshots_held = nullptr;
  Counter* state_snapshot_evictions = nullptr;
  Gauge* conns_open = nullptr;
  Gauge* gpu_util = nullptr;  // these four: only with a GPU
  Gauge* gpu_mem_used = nullptr;
  Gauge* gpu_mem_total = nullptr;
  Gauge* gpu_power = nullptr;
  Counter* process_cpu = nullptr;  // the process_* metrics of Prometheus' client libraries
  Gauge* process_rss = nullptr;
  Gauge* process_start = nullptr;

 private:
  void register_requests();
  void register_latencies();
  void register_engine(bool gpu);
  void register_vllm(const std::string& model_name);

  std::mutex mirror_mu_;  // counters mirrored from Engine::CoreStats at scrape time
  Engine::CoreStats mirrored_;
  int64_t mirrored_rejected_ = 0;
  double mirrored_cpu_ = 0;
};

}  // namespace vlm
