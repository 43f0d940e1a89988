// KV events (include/vlm/engine.h: KvEvent, handed over by the engine) published over ZeroMQ in
// vLLM's wire format (vllm/distributed/kv_events.py), so that a KV-aware router — the Gateway API
// Inference Extension's precise prefix scorer (llm-d), Dynamo's KV router — keeps an index of which
// replica holds which prefix.
//
// Wire format: each message is three frames, (topic, sequence number as 8 bytes big-endian,
// payload); the payload is a msgpack map {"ts": float seconds, "events": [...],
// "data_parallel_rank": 0}; each event a map whose first key "type" names it:
//   BlockStored    {block_hashes, parent_block_hash, token_ids, block_size, lora_id: nil,
//                   medium: "GPU", lora_name: nil, extra_keys}
//   BlockRemoved   {block_hashes, medium: "GPU"}
//   AllBlocksCleared {}
// A block hash is sent as vLLM sends it by default: the low 64 bits of the digest (its last 8
// bytes, big-endian) as an unsigned integer. extra_keys has one entry per stored block: nil, or
// a list of the SHA-256 (hex) of every image whose tokens the block covers. "GPU" is vLLM's name
// for the engine's own KV cache, whatever the device.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "vlm/engine.h"
#include "vlm/server.h"
#include "vlm/status.h"

namespace vlm {

// The msgpack payload of one batch.
std::string encode_kv_event_batch(double ts, std::span<const KvEvent> events, int32_t block_size,
                                  int32_t data_parallel_rank = 0);

// The ZeroMQ side: a PUB socket (and an optional ROUTER for replays) owned by one thread that
// sends what publish() queues, numbering the messages 0, 1, 2, ... publish() never blocks: past
// kMaxQueue batches waiting, a batch is dropped (the first drop is reported on stderr; a
// subscriber sees the gap in the sequence numbers).
class KvEventPublisher {
 public:
  // Opens the sockets (a bind that fails — address in use, bad endpoint — is an error here).
  static Result<std::unique_ptr<KvEventPublisher>> start(const KvEventsOptions& opts);
  ~KvEventPublisher();  // sends what is queued (up to a second), then closes

  // Queues one batch (BatchingOptions::on_kv_events); the publisher's thread encodes it
  // (encode_kv_event_batch) and sends it.
  void publish(KvEventBatch batch);

  static constexpr size_t kMaxQueue = 100000;

 private:
  KvEventPublisher() = default;
  void run();
  void serve_replay();

  KvEventsOptions opts_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<KvEventBatch> queue_;
  bool stop_ = false;
  int64_t dropped_ = 0;
  uint64_t next_seq_ = 0;                              // the publisher thread's
  std::deque<std::pair<uint64_t, std::string>> sent_;  // the last buffer_steps, for replays
};

}  // namespace vlm
