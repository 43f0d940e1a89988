#include "engine/kv_events.h"

#include <algorithm>
#include <string>

#include "core/sha256.h"

namespace vlm {
namespace {

KvEvent::Kind kind_of(KvCacheEvent::Kind k) {
  switch (k) {
    case KvCacheEvent::Kind::kStored:
      return KvEvent::Kind::kBlockStored;
    case KvCacheEvent::Kind::kRemoved:
      return KvEvent::Kind::kBlockRemoved;
    case KvCacheEvent::Kind::kCleared:
      break;
  }
  return KvEvent::Kind::kAllBlocksCleared;
}

}  // namespace

uint64_t external_block_hash(const BlockHash& h) {
  uint64_t v = 0;
  for (size_t i = h.size() - 8; i < h.size(); ++i) v = v << 8 | h[i];
  return v;
}

void kv_events_of(std::span<const KvCacheEvent> log, int64_t bs,
                  const std::function<const Sequence*(int64_t)>& seq_of,
                  std::vector<KvEvent>* out) {
  out->clear();
  for (const KvCacheEvent& e : log) {
    KvEvent w;
    w.kind = kind_of(e.kind);
    for (const BlockHash& h : e.hashes) w.block_hashes.push_back(external_block_hash(h));
    if (e.kind == KvCacheEvent::Kind::kStored) {
      // The sequence is live: its blocks were keyed as this step scheduled it.
      const Sequence* seq = seq_of(e.seq);
      if (seq == nullptr) continue;
      if (e.parent) w.parent_block_hash = external_block_hash(*e.parent);
      const int64_t begin = e.first_block * bs;
      const int64_t end = begin + static_cast<int64_t>(e.hashes.size()) * bs;
      w.token_ids.assign(seq->ids.begin() + begin, seq->ids.begin() + end);
      w.extra_keys.resize(e.hashes.size());
      for (const ImageSpan& span : seq->prompt.image_spans) {
        if (span.end <= begin || span.begin >= end) continue;
        const std::string key = sha256_hex(span.key.content);
        for (int64_t k = std::max(begin, span.begin) / bs; k * bs < std::min(end, span.end); ++k) {
          w.extra_keys[static_cast<size_t>(k - begin / bs)].push_back(key);
        }
      }
    }
    out->push_back(std::move(w));
  }
}

}  // namespace vlm
