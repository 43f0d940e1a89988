// KV events: the prefix cache's changes (blocks stored, removed, all cleared) published over
// ZeroMQ in vLLM's wire format (vllm/distributed/kv_events.py), so that a KV-aware router — the
// Gateway API Inference Extension's precise prefix scorer (llm-d), Dynamo's KV router — keeps an
// index of which replica holds which prefix.
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
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/request.h"
#include "kv/block_pool.h"
#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm {

// One event as it is sent.
struct KvWireEvent {
  KvCacheEvent::Kind kind = KvCacheEvent::Kind::kStored;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;                    // stored
  std::vector<int32_t> token_ids;                    // stored: block_size per block
  std::vector<std::vector<std::string>> extra_keys;  // stored: per block (empty: nil)
};

// The wire form of the prefix cache's changes `log` (blocks keyed, evicted, all forgotten), into
// *out (cleared first): each stored run with its blocks' token ids and the SHA-256 of every image
// whose tokens they cover, from its sequence as `seq_of` gives it (null: gone; the run is
// skipped).
void kv_wire_events(std::span<const KvCacheEvent> log, int64_t block_size,
                    const std::function<const Sequence*(int64_t)>& seq_of,
                    std::vector<KvWireEvent>* out);

// A block hash as vLLM publishes it: the digest's last 8 bytes read big-endian.
uint64_t external_block_hash(const BlockHash& h);

// The msgpack payload of one batch.
std::string encode_kv_event_batch(double ts, std::span<const KvWireEvent> events,
                                  int32_t block_size, int32_t data_parallel_rank = 0);

// The ZeroMQ side: a PUB socket (and an optional ROUTER for replays) owned by one thread that
// sends what publish() queues, numbering the messages 0, 1, 2, ... publish() never blocks: past
// kMaxQueue batches waiting, a batch is dropped (the first drop is reported on stderr; a
// subscriber sees the gap in the sequence numbers).
class KvEventPublisher {
 public:
  // Opens the sockets (a bind that fails — address in use, bad endpoint — is an error here).
  static Result<std::unique_ptr<KvEventPublisher>> start(const KvEventsOptions& opts);
  ~KvEventPublisher();  // sends what is queued (up to a second), then closes

  // Queues one batch; the publisher's thread encodes it (encode_kv_event_batch) and sends it.
  void publish(double ts, std::vector<KvWireEvent> events, int32_t block_size);

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
  struct Batch {
    double ts = 0;
    std::vector<KvWireEvent> events;
    int32_t block_size = 0;
  };
  std::deque<Batch> queue_;
  bool stop_ = false;
  int64_t dropped_ = 0;
  uint64_t next_seq_ = 0;                              // the publisher thread's
  std::deque<std::pair<uint64_t, std::string>> sent_;  // the last buffer_steps, for replays
};

}  // namespace vlm
