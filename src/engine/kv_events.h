// KV events: the prefix cache's changes (blocks keyed, evicted, all forgotten) in the terms of
// vLLM's KV events (include/vlm/engine.h: KvEvent), handed to BatchingOptions::on_kv_events. The
// server publishes them over ZeroMQ (server/kv_event_publisher.h); the engine knows no transport.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "kv/block_pool.h"
#include "vlm/engine.h"

namespace vlm {

// The events of the prefix cache's changes `log`, into *out (cleared first): each stored run with
// its blocks' token ids and the SHA-256 of every image whose tokens they cover, from its sequence
// as `seq_of` gives it (null: gone; the run is skipped).
void kv_events_of(std::span<const KvCacheEvent> log, int64_t block_size,
                  const std::function<const Sequence*(int64_t)>& seq_of, std::vector<KvEvent>* out);

// A block hash as vLLM publishes it: the digest's last 8 bytes read big-endian.
uint64_t external_block_hash(const BlockHash& h);

}  // namespace vlm
