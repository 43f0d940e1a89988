// The Qwen byte-level BPE tokenizer: added-token split -> NFC -> split regex -> byte-level
// mapping -> BPE merges, and the reverse for decoding. Loading lives in tokenizer_load.cc.
#include "vlm/tokenizer.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace vlm {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  Result<std::unique_ptr<Impl>> impl = tok::load_impl(path);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl).value()));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const std::string& json_text,
                                                        const std::string& name,
                                                        std::optional<int32_t> eos,
                                                        std::optional<int32_t> pad) {
  Result<std::unique_ptr<Impl>> impl = tok::parse_impl(json_text, name);
  if (!impl.ok()) return impl.status();
  (*impl)->eos_id = eos;
  (*impl)->pad_id = pad;
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl).value()));
}

void Tokenizer::Impl::encode_segment(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  // The Rust library only ever sees valid UTF-8 (&str); for other input, decoding it lossily
  // first gives the closest meaningful result instead of undefined regex behaviour.
  std::string repaired;
  if (!tok::utf8_is_valid(text)) {
    tok::utf8_append_lossy(text, &repaired);
    text = repaired;
  }
  std::string normalized;
  if (nfc_normalize) {
    if (tok::nfc(text, &normalized)) text = normalized;
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  if (!split || !split->split(text, &pieces)) {
    pieces.assign(1, {0, text.size()});
  }
  for (const auto& [begin, end] : pieces) encode_piece(text.substr(begin, end - begin), out);
}

namespace {

// Per-thread, direct-mapped cache of short pieces -> ids. Natural text repeats a small set of
// words, and a hit skips the merge loop (whose hash lookups miss the cache). Being thread_local,
// it needs no lock and encode stays safe to call from many threads; entries are tagged with the
// tokenizer's uid so several tokenizers can share a thread.
class PieceCache {
 public:
  static constexpr size_t kMaxPieceBytes = 24;
  static constexpr size_t kMaxIds = 8;

  // Appends the cached ids of `piece` to `out` and returns true on a hit.
  bool lookup(uint64_t uid, uint64_t hash, std::string_view piece, std::vector<int32_t>* out) {
    const Slot& s = slots_[hash % kSlots];
    if (s.uid != uid || s.hash != hash || s.piece_len != piece.size() ||
        piece.compare(0, piece.size(), s.piece, s.piece_len) != 0) {
      return false;
    }
    out->insert(out->end(), s.ids, s.ids + s.num_ids);
    return true;
  }

  void store(uint64_t uid, uint64_t hash, std::string_view piece, const int32_t* ids, size_t n) {
    if (piece.size() > kMaxPieceBytes || n > kMaxIds) return;
    Slot& s = slots_[hash % kSlots];
    s.uid = uid;
    s.hash = hash;
    s.piece_len = static_cast<uint8_t>(piece.size());
    piece.copy(s.piece, piece.size());
    s.num_ids = static_cast<uint8_t>(n);
    std::copy(ids, ids + n, s.ids);
  }

 private:
  static constexpr size_t kSlots = 4096;
  struct Slot {
    uint64_t uid = 0;  // 0: empty (uids start at 1)
    uint64_t hash = 0;
    uint8_t piece_len = 0;
    uint8_t num_ids = 0;
    char piece[kMaxPieceBytes];
    int32_t ids[kMaxIds];
  };
  Slot slots_[kSlots];  // ~300 KB per thread that encodes
};

PieceCache& piece_cache() {
  thread_local std::unique_ptr<PieceCache> cache = std::make_unique<PieceCache>();
  return *cache;
}

}  // namespace

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  const bool cacheable = piece.size() <= PieceCache::kMaxPieceBytes;
  uint64_t hash = 0;
  if (cacheable) {
    hash = std::hash<std::string_view>{}(piece);
    if (piece_cache().lookup(uid, hash, piece, out)) return;
  }
  const size_t first = out->size();
  for (unsigned char c : piece) {
    const int32_t id = byte_ids[c];
    // A byte missing from the vocab is dropped, as the Rust BPE does when unk_token is null.
    if (id >= 0) out->push_back(id);
  }
  if (out->size() - first >= 2) {
    // Merge in a scratch vector: bpe_merge works on a whole vector.
    thread_local std::vector<int32_t> ids;
    ids.assign(out->begin() + first, out->end());
    tok::bpe_merge(merges, &ids);
    out->resize(first);
    out->insert(out->end(), ids.begin(), ids.end());
  }
  if (cacheable) piece_cache().store(uid, hash, piece, out->data() + first, out->size() - first);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool split_special) const {
  const Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t segment_begin = 0;
  size_t i = 0;
  // Added tokens are found in the raw text, leftmost first and longest at a given position (the
  // Rust library's LeftmostLongest Aho-Corasick); the text between them is encoded normally.
  while (i < text.size()) {
    const std::vector<int32_t>& candidates =
        im.added_by_first_byte[static_cast<unsigned char>(text[i])];
    const Impl::AddedToken* hit = nullptr;
    for (int32_t c : candidates) {  // longest first
      const Impl::AddedToken& t = im.added[c];
      if (split_special && t.special) continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    im.encode_segment(text.substr(segment_begin, i - segment_begin), &out);
    out.push_back(hit->id);
    i += hit->content.size();
    segment_begin = i;
  }
  im.encode_segment(text.substr(segment_begin), &out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(im.bytes.size())) continue;
    if (skip_special && im.kind[id] == Impl::kSpecial) continue;
    bytes += im.bytes[id];
  }
  if (tok::utf8_is_valid(bytes)) return bytes;
  std::string out;
  tok::utf8_append_lossy(bytes, &out);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->bytes.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  // Added tokens take precedence over vocab entries with the same text, as in the Rust library.
  const std::string key(token);
  if (auto it = impl_->added_to_id.find(key); it != impl_->added_to_id.end()) return it->second;
  return impl_->vocab_to_id.find(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return std::string(impl_->tokens[id]);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->kind[id] == Impl::kSpecial;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return std::string(impl_->bytes[id]);
}

std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }
std::optional<int32_t> Tokenizer::pad_token_id() const { return impl_->pad_id; }

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (id < 0 || id >= tok_.vocab_size()) return {};
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  // Emit everything up to an incomplete character at the very end. Invalid sequences before it
  // are final (later bytes cannot repair them), so they become U+FFFD now, exactly where the
  // whole-sequence decode would put them.
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  size_t i = 0;
  while (i < pending_.size()) {
    const tok::Utf8Step st = tok::utf8_step(p + i, pending_.size() - i);
    if (st.truncated) break;
    if (st.valid) {
      out.append(pending_, i, st.len);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += st.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  tok::utf8_append_lossy(pending_, &out);
  pending_.clear();
  return out;
}

}  // namespace vlm
