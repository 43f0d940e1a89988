#include "server/server_metrics.h"

#include <algorithm>
#include <vector>

namespace vlm {

ServerMetrics::ServerMetrics(const std::string& model_name, bool gpu) {
  // Registration order is the order /metrics lists the families in.
  register_requests();
  register_latencies();
  register_engine(gpu);
  register_vllm(model_name);
}

void ServerMetrics::register_requests() {
  requests = &registry.counter("vlm_requests_total", "Requests by outcome", "outcome");
  pooling_requests = &registry.counter(
      "vlm_pooling_requests_total", "Embedding, score and rerank requests by endpoint", "endpoint");
  pooled_prompts = &registry.counter("vlm_pooled_prompts_total",
                                     "Prompts pooled (prefill-only requests that finished)");
  struct Spec {
    Counter* ServerMetrics::*counter;
    const char* name;
    const char* help;
  };
  // clang-format off
  static constexpr Spec kCounters[] = {
      {&ServerMetrics::prompt_tokens, "vlm_prompt_tokens_total",
       "Prompt tokens (image tokens included)"},
      {&ServerMetrics::generated_tokens, "vlm_generation_tokens_total", "Generated tokens"},
      {&ServerMetrics::image_tokens, "vlm_image_tokens_total",
       "Image tokens among the prompt tokens"},
      {&ServerMetrics::images, "vlm_images_total", "Images in requests"},
      {&ServerMetrics::video_tokens, "vlm_video_tokens_total",
       "Video tokens among the prompt tokens"},
      {&ServerMetrics::videos, "vlm_videos_total", "Videos in requests"},
      {&ServerMetrics::video_frames, "vlm_video_frames_total", "Frames sampled from the videos"},
      {&ServerMetrics::cache_hits, "vlm_vision_cache_hits_total",
       "Images and videos served from the vision-encoder cache"},
      {&ServerMetrics::cache_misses, "vlm_vision_cache_misses_total",
       "Images and videos run through the vision encoder"},
      {&ServerMetrics::preemptions, "vlm_preemptions_total",
       "Requests preempted (KV cache full) and recomputed"},
      {&ServerMetrics::prefix_queries, "vlm_prefix_cache_queries_total",
       "Prompt tokens looked up in the prefix cache"},
      {&ServerMetrics::prefix_hits, "vlm_prefix_cache_hits_total",
       "Prompt tokens found in the prefix cache (not computed)"},
      {&ServerMetrics::prefix_evictions, "vlm_prefix_cache_evictions_total",
       "Cached KV blocks evicted to make room"},
  };
  // clang-format on
  for (const Spec& c : kCounters) this->*c.counter = &registry.counter(c.name, c.help);
  prefix_blocks = &registry.gauge("vlm_prefix_cache_blocks",
                                  "KV blocks holding cached contents (in use or free)");
  conns_rejected = &registry.counter("vlm_http_connections_rejected_total",
                                     "Connections turned away with 503 at --max-connections");
}

void ServerMetrics::register_latencies() {
  const std::vector<double> lat = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  ttft = &registry.histogram("vlm_time_to_first_token_seconds", "Time to first token", lat);
  itl = &registry.histogram("vlm_inter_token_latency_seconds", "Time between tokens", lat);
  e2e = &registry.histogram("vlm_e2e_request_latency_seconds", "End-to-end request latency", lat);
  queue_time = &registry.histogram("vlm_request_queue_time_seconds",
                                   "Submit to first forward pass, image encoding excluded", lat);
  preprocess_time = &registry.histogram(
      "vlm_image_preprocess_seconds", "Image decode + preprocess per request (worker thread)", lat);
  encode_time = &registry.histogram("vlm_vision_encode_seconds",
                                    "Vision encoder time per request (cache misses)", lat);
  video_decode_time = &registry.histogram(
      "vlm_video_decode_seconds",
      "Video reading and frame decoding per request (worker thread; cache misses)", lat);
  step_time = &registry.histogram(
      "vlm_engine_step_seconds", "Engine step wall time (steps that ran the model)",
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  encoder_slices = &registry.histogram(
      "vlm_encoder_slices_per_step",
      "Units of image encoding (row blocks of a vision-tower stage) per engine step that ran any",
      {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128});
  encoder_time = &registry.histogram(
      "vlm_encoder_step_seconds", "Image-encoding time per engine step that ran any",
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
}

void ServerMetrics::register_engine(bool gpu) {
  running = &registry.gauge("vlm_num_requests_running", "Requests in the running batch");
  waiting = &registry.gauge("vlm_num_requests_waiting", "Requests waiting to be scheduled");
  kv_used = &registry.gauge("vlm_kv_cache_blocks_used", "KV cache blocks in use");
  kv_total = &registry.gauge("vlm_kv_cache_blocks_capacity", "KV cache blocks in total");
  kv_tokens_total = &registry.gauge("vlm_kv_cache_tokens_capacity",
                                    "KV cache capacity in tokens (blocks x block size)");
  kv_bytes = &registry.gauge("vlm_kv_cache_memory_bytes",
                             "KV cache memory reserved (K, V and INT8 scales of every layer)");
  state_slots = &registry.gauge("vlm_state_slots",
                                "Hybrid models: linear-attention state slots (one per sequence)");
  state_snapshots = &registry.gauge("vlm_state_snapshots_capacity",
                                    "Hybrid models: state snapshots the prefix cache can keep");
  state_bytes = &registry.gauge("vlm_state_memory_bytes",
                                "Hybrid models: memory of the state slots and snapshots");
  state_snapshots_held = &registry.gauge("vlm_state_snapshots",
                                         "Hybrid models: state snapshots the prefix cache holds");
  state_snapshot_evictions = &registry.counter("vlm_state_snapshot_evictions_total",
                                               "Hybrid models: state snapshots replaced for room");
  conns_open = &registry.gauge("vlm_http_connections_open", "Open HTTP connections");
  process_cpu = &registry.counter("process_cpu_seconds_total",
                                  "Total user and system CPU time spent in seconds.");
  process_rss = &registry.gauge("process_resident_memory_bytes", "Resident memory size in bytes.");
  process_start = &registry.gauge("process_start_time_seconds",
                                  "Start time of the process since unix epoch in seconds.");
  if (gpu) {
    gpu_util = &registry.gauge("vlm_gpu_utilization_percent",
                               "GPU busy share over NVML's last sample period (-1: not reported)");
    gpu_mem_used = &registry.gauge("vlm_gpu_memory_used_bytes",
                                   "GPU memory in use, all processes (-1: not read yet)");
    gpu_mem_total =
        &registry.gauge("vlm_gpu_memory_total_bytes", "GPU memory in total (-1: not read yet)");
    gpu_power = &registry.gauge("vlm_gpu_power_watts", "GPU board power draw (-1: not reported)");
    for (Gauge* g : {gpu_util, gpu_mem_used, gpu_mem_total, gpu_power}) {
      g->set(-1);  // until NVML is first read
    }
  }
}

void ServerMetrics::register_vllm(const std::string& model_name) {
  // vLLM's buckets (its v1 metrics loggers): TTFT; inter-token latency as its time per
  // output token; end-to-end as its request latencies.
  VllmMetrics& v = vllm;
  v.labels = prometheus_labels({{"model_name", model_name}, {"engine", "0"}});
  v.running = &registry.gauge("vllm:num_requests_running",
                              "Number of requests in model execution batches.", v.labels);
  v.waiting = &registry.gauge("vllm:num_requests_waiting",
                              "Number of requests waiting to be processed.", v.labels);
  v.kv_usage = &registry.gauge("vllm:kv_cache_usage_perc",
                               "KV-cache usage. 1 means 100 percent usage.", v.labels);
  v.prefix_queries = &registry.counter(
      "vllm:prefix_cache_queries_total",
      "Prefix cache queries, in terms of number of queried tokens.", "", v.labels);
  v.prefix_hits =
      &registry.counter("vllm:prefix_cache_hits_total",
                        "Prefix cache hits, in terms of number of cached tokens.", "", v.labels);
  v.prompt_tokens = &registry.counter("vllm:prompt_tokens_total",
                                      "Number of prefill tokens processed.", "", v.labels);
  v.generation_tokens = &registry.counter("vllm:generation_tokens_total",
                                          "Number of generation tokens processed.", "", v.labels);
  v.spec_drafts = &registry.counter("vllm:spec_decode_num_drafts_total",
                                    "Number of spec decoding drafts.", "", v.labels);
  v.spec_draft_tokens = &registry.counter("vllm:spec_decode_num_draft_tokens_total",
                                          "Number of draft tokens.", "", v.labels);
  v.spec_accepted = &registry.counter("vllm:spec_decode_num_accepted_tokens_total",
                                      "Number of accepted tokens.", "", v.labels);
  v.spec_accepted_per_pos =
      &registry.counter("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                        "Accepted tokens per draft position.", "position", v.labels);
  v.ttft = &registry.histogram(
      "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
      {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
       1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0},
      v.labels);
  v.itl = &registry.histogram("vllm:inter_token_latency_seconds",
                              "Histogram of inter-token latency in seconds.",
                              {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0},
                              v.labels);
  v.e2e = &registry.histogram(
      "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
      {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
       30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0},
      v.labels);
}

void ServerMetrics::loaded(const Engine::CoreStats& st, bool prefix_caching) {
  kv_tokens_total->set(static_cast<double>(st.kv_blocks_total * st.kv_block_size));
  kv_bytes->set(static_cast<double>(st.kv_cache_bytes));
  state_slots->set(static_cast<double>(st.state_slots));
  state_snapshots->set(static_cast<double>(st.state_snapshots));
  state_bytes->set(static_cast<double>(st.state_memory_bytes));
  // vLLM's info gauge of the cache configuration (a gauge held at 1), known once loaded.
  const std::string block_size = std::to_string(st.kv_block_size);
  const std::string blocks = std::to_string(st.kv_blocks_total);
  registry
      .gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
             prometheus_labels({{"block_size", block_size},
                                {"cache_dtype", kv_cache_dtype_name(st.kv_cache_dtype)},
                                {"enable_prefix_caching", prefix_caching ? "True" : "False"},
                                {"engine", "0"},
                                {"num_gpu_blocks", blocks}}))
      .set(1);
}

void ServerMetrics::observe_ttft(double s) {
  ttft->observe(s);
  vllm.ttft->observe(s);
}

void ServerMetrics::observe_itl(double s) {
  itl->observe(s);
  vllm.itl->observe(s);
}

void ServerMetrics::observe_e2e(double s) {
  e2e->observe(s);
  vllm.e2e->observe(s);
}

void ServerMetrics::record_finished(const RequestStats& st, bool pooled) {
  if (pooled) pooled_prompts->inc();
  prompt_tokens->inc(static_cast<double>(st.prompt_tokens));
  generated_tokens->inc(static_cast<double>(st.completion_tokens));
  vllm.prompt_tokens->inc(static_cast<double>(st.prompt_tokens));
  vllm.generation_tokens->inc(static_cast<double>(st.completion_tokens));
  queue_time->observe(st.queue_ms / 1e3);
  if (st.images > 0) {
    images->inc(static_cast<double>(st.images));
    image_tokens->inc(static_cast<double>(st.vision_tokens - st.video_tokens));
    const double pre = st.image_decode_ms + st.preprocess_ms;
    if (st.images > st.images_cached || pre > 0) preprocess_time->observe(pre / 1e3);
  }
  if (st.videos > 0) {
    videos->inc(static_cast<double>(st.videos));
    video_tokens->inc(static_cast<double>(st.video_tokens));
    video_frames->inc(static_cast<double>(st.video_frames));
    if (st.videos > st.videos_cached) video_decode_time->observe(st.video_decode_ms / 1e3);
  }
  if (st.images > st.images_cached || st.videos > st.videos_cached) {
    encode_time->observe(st.encode_ms / 1e3);
  }
}

void ServerMetrics::scrape(int64_t open_connections, int64_t rejected_connections,
                           const Engine* engine) {
  conns_open->set(static_cast<double>(open_connections));
  {
    std::lock_guard<std::mutex> lock(mirror_mu_);
    conns_rejected->inc(static_cast<double>(rejected_connections - mirrored_rejected_));
    mirrored_rejected_ = rejected_connections;
    const ProcessStats ps = read_process_stats();
    process_cpu->inc(std::max(0.0, ps.cpu_seconds - mirrored_cpu_));
    mirrored_cpu_ = std::max(mirrored_cpu_, ps.cpu_seconds);
    process_rss->set(ps.resident_bytes);
    process_start->set(ps.start_time_seconds);
  }
  if (engine == nullptr) return;  // still loading
  Engine::CoreStats st = engine->core_stats();
  running->set(static_cast<double>(st.running));
  waiting->set(static_cast<double>(st.waiting));
  kv_used->set(static_cast<double>(st.kv_blocks_used));
  kv_total->set(static_cast<double>(st.kv_blocks_total));
  vllm.running->set(static_cast<double>(st.running));
  vllm.waiting->set(static_cast<double>(st.waiting));
  vllm.kv_usage->set(st.kv_blocks_total > 0 ? static_cast<double>(st.kv_blocks_used) /
                                                  static_cast<double>(st.kv_blocks_total)
                                            : 0.0);
  Engine::GpuStats g;
  if (gpu_util != nullptr && engine->gpu_stats(&g)) {  // on "cuda": NVML's view of the device
    gpu_util->set(g.utilization_percent);
    gpu_mem_used->set(static_cast<double>(g.memory_used));
    gpu_mem_total->set(static_cast<double>(g.memory_total));
    gpu_power->set(g.power_watts);
  }
  std::lock_guard<std::mutex> lock(mirror_mu_);
  cache_hits->inc(static_cast<double>(st.vision_cache_hits - mirrored_.vision_cache_hits));
  cache_misses->inc(static_cast<double>(st.vision_cache_misses - mirrored_.vision_cache_misses));
  preemptions->inc(static_cast<double>(st.preemptions - mirrored_.preemptions));
  prefix_queries->inc(
      static_cast<double>(st.prefix_cache_queries - mirrored_.prefix_cache_queries));
  prefix_hits->inc(static_cast<double>(st.prefix_cache_hits - mirrored_.prefix_cache_hits));
  vllm.prefix_queries->inc(
      static_cast<double>(st.prefix_cache_queries - mirrored_.prefix_cache_queries));
  vllm.prefix_hits->inc(static_cast<double>(st.prefix_cache_hits - mirrored_.prefix_cache_hits));
  prefix_evictions->inc(
      static_cast<double>(st.prefix_cache_evictions - mirrored_.prefix_cache_evictions));
  prefix_blocks->set(static_cast<double>(st.prefix_cache_blocks));
  state_snapshots_held->set(static_cast<double>(st.state_snapshots_held));
  state_snapshot_evictions->inc(
      static_cast<double>(st.state_snapshot_evictions - mirrored_.state_snapshot_evictions));
  vllm.spec_drafts->inc(static_cast<double>(st.spec_drafts - mirrored_.spec_drafts));
  vllm.spec_draft_tokens->inc(
      static_cast<double>(st.spec_draft_tokens - mirrored_.spec_draft_tokens));
  vllm.spec_accepted->inc(
      static_cast<double>(st.spec_accepted_tokens - mirrored_.spec_accepted_tokens));
  for (int64_t p = 0; p < st.spec_tokens; ++p) {
    const size_t i = static_cast<size_t>(p);
    vllm.spec_accepted_per_pos->inc(
        std::to_string(p),
        static_cast<double>(st.spec_accepted_per_pos[i] - mirrored_.spec_accepted_per_pos[i]));
  }
  mirrored_ = st;
}

}  // namespace vlm
