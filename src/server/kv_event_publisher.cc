#include "server/kv_event_publisher.h"

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <msgpack.hpp>

#include "vlm/log.h"

namespace vlm {
namespace {

constexpr const char* kMedium = "GPU";  // vLLM's MEDIUM_GPU: the engine's own KV cache

void pack_str(msgpack::packer<msgpack::sbuffer>& pk, const char* s) {
  const size_t n = std::strlen(s);
  pk.pack_str(static_cast<uint32_t>(n));
  pk.pack_str_body(s, static_cast<uint32_t>(n));
}

void pack_hashes(msgpack::packer<msgpack::sbuffer>& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) pk.pack_uint64(h);
}

void pack_event(msgpack::packer<msgpack::sbuffer>& pk, const KvEvent& e, int32_t block_size) {
  switch (e.kind) {
    case KvEvent::Kind::kBlockStored:
      pk.pack_map(9);
      pack_str(pk, "type");
      pack_str(pk, "BlockStored");
      pack_str(pk, "block_hashes");
      pack_hashes(pk, e.block_hashes);
      pack_str(pk, "parent_block_hash");
      if (e.parent_block_hash) {
        pk.pack_uint64(*e.parent_block_hash);
      } else {
        pk.pack_nil();
      }
      pack_str(pk, "token_ids");
      pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
      for (int32_t t : e.token_ids) pk.pack_int32(t);
      pack_str(pk, "block_size");
      pk.pack_int32(block_size);
      pack_str(pk, "lora_id");
      pk.pack_nil();
      pack_str(pk, "medium");
      pack_str(pk, kMedium);
      pack_str(pk, "lora_name");
      pk.pack_nil();
      pack_str(pk, "extra_keys");
      pk.pack_array(static_cast<uint32_t>(e.block_hashes.size()));
      for (size_t i = 0; i < e.block_hashes.size(); ++i) {
        if (i >= e.extra_keys.size() || e.extra_keys[i].empty()) {
          pk.pack_nil();
          continue;
        }
        pk.pack_array(static_cast<uint32_t>(e.extra_keys[i].size()));
        for (const std::string& k : e.extra_keys[i]) pack_str(pk, k.c_str());
      }
      return;
    case KvEvent::Kind::kBlockRemoved:
      pk.pack_map(3);
      pack_str(pk, "type");
      pack_str(pk, "BlockRemoved");
      pack_str(pk, "block_hashes");
      pack_hashes(pk, e.block_hashes);
      pack_str(pk, "medium");
      pack_str(pk, kMedium);
      return;
    case KvEvent::Kind::kAllBlocksCleared:
      pk.pack_map(1);
      pack_str(pk, "type");
      pack_str(pk, "AllBlocksCleared");
      return;
  }
}

// vLLM's rule (ZmqEventPublisher._socket_setup): bind a wildcard or a local transport, connect
// to anything else.
bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

std::string zmq_error(const std::string& what, const std::string& endpoint) {
  return "--kv-events: cannot " + what + " " + endpoint + ": " + zmq_strerror(zmq_errno());
}

std::string seq_frame(uint64_t seq) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(seq >> (56 - 8 * i));
  return s;
}

// Sends frames as one multipart message; false when the socket refused it.
bool send_multipart(void* sock, std::initializer_list<std::string_view> frames, int flags) {
  size_t i = 0;
  for (std::string_view f : frames) {
    const int more = ++i < frames.size() ? ZMQ_SNDMORE : 0;
    if (zmq_send(sock, f.data(), f.size(), flags | more) < 0) return false;
  }
  return true;
}

}  // namespace

std::string encode_kv_event_batch(double ts, std::span<const KvEvent> events, int32_t block_size,
                                  int32_t data_parallel_rank) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pack_str(pk, "ts");
  pk.pack_double(ts);
  pack_str(pk, "events");
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) pack_event(pk, e, block_size);
  pack_str(pk, "data_parallel_rank");
  pk.pack_int32(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::start(const KvEventsOptions& opts) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher());
  p->opts_ = opts;
  p->ctx_ = zmq_ctx_new();
  if (p->ctx_ == nullptr) return internal_error("--kv-events: cannot create a ZeroMQ context");
  p->pub_ = zmq_socket(p->ctx_, ZMQ_PUB);
  const int hwm = opts.hwm, linger = 1000;
  zmq_setsockopt(p->pub_, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(p->pub_, ZMQ_LINGER, &linger, sizeof linger);
  const std::string& ep = opts.endpoint;
  if (binds(ep) ? zmq_bind(p->pub_, ep.c_str()) != 0 : zmq_connect(p->pub_, ep.c_str()) != 0) {
    return invalid_argument(zmq_error(binds(ep) ? "bind" : "connect to", ep));
  }
  if (!opts.replay_endpoint.empty()) {
    p->replay_ = zmq_socket(p->ctx_, ZMQ_ROUTER);
    zmq_setsockopt(p->replay_, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(p->replay_, opts.replay_endpoint.c_str()) != 0) {
      return invalid_argument(zmq_error("bind", opts.replay_endpoint));
    }
  }
  p->thread_ = std::thread([q = p.get()] { q->run(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (pub_ != nullptr) zmq_close(pub_);
  if (replay_ != nullptr) zmq_close(replay_);
  if (ctx_ != nullptr) zmq_ctx_term(ctx_);  // waits up to the linger for what is still queued
}

void KvEventPublisher::publish(KvEventBatch batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueue) {
      if (dropped_++ == 0) {
        log_printf(LogLevel::kWarn, "KV events: %zu batches wait to be sent; dropping new ones",
                   queue_.size());
      }
      return;
    }
    queue_.push_back(std::move(batch));
  }
  cv_.notify_one();
}

void KvEventPublisher::run() {
  std::deque<KvEventBatch> batch;
  for (;;) {
    if (replay_ != nullptr) serve_replay();
    bool stop;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A replay request waits at most this long for the next pass.
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_ || !queue_.empty(); });
      batch.swap(queue_);
      stop = stop_;
    }
    for (KvEventBatch& b : batch) {
      std::string payload = encode_kv_event_batch(b.ts, b.events, b.block_size);
      const uint64_t seq = next_seq_++;
      // A PUB socket at its high-water mark drops the message (no subscriber blocks the engine).
      send_multipart(pub_, {opts_.topic, seq_frame(seq), payload}, ZMQ_DONTWAIT);
      if (replay_ != nullptr && opts_.buffer_steps > 0) {
        if (static_cast<int64_t>(sent_.size()) >= opts_.buffer_steps) sent_.pop_front();
        sent_.emplace_back(seq, std::move(payload));
      }
    }
    batch.clear();
    if (stop) return;
  }
}

// A replay request is (identity, empty, start sequence as 8 bytes big-endian); the answer is every
// kept batch from there as (identity, empty, seq, payload), then (identity, empty, -1, empty).
void KvEventPublisher::serve_replay() {
  for (;;) {
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, replay_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        if (frames.empty()) return;  // nothing waiting
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    if (frames.size() != 3 || frames[2].size() != 8) continue;  // not a replay request
    uint64_t start = 0;
    for (unsigned char c : frames[2]) start = start << 8 | c;
    for (const auto& [seq, payload] : sent_) {
      if (seq >= start) send_multipart(replay_, {frames[0], "", seq_frame(seq), payload}, 0);
    }
    send_multipart(replay_, {frames[0], "", seq_frame(~uint64_t{0}), ""}, 0);
  }
}

}  // namespace vlm
