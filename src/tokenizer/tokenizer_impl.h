// Internal state of vlm::Tokenizer, shared by tokenizer.cc (encode/decode) and
// tokenizer_load.cc (building it from tokenizer.json). Immutable once loaded.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/string_map.h"
#include "vlm/status.h"
#include "vlm/tokenizer.h"

namespace vlm {

// Tokenizer's friend: names its private parts for the tokenizer's own sources.
struct TokenizerAccess {
  using Impl = Tokenizer::Impl;
};
using TokenizerImpl = TokenizerAccess::Impl;

struct Tokenizer::Impl {
  enum Kind : uint8_t { kNone, kVocab, kAdded, kSpecial };
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
  };

  // Indexed by id; size = vocab_size(). Ids with no token (gaps) have kind kNone, empty strings.
  tok::StringTable tokens;  // byte-level vocab string, or added-token content
  tok::StringTable bytes;   // what the id decodes to (ByteLevel decoder rule)
  std::vector<Kind> kind;

  tok::StringIdMap vocab_to_id;
  std::unordered_map<std::string, int32_t> added_to_id;
  tok::MergeMap merges;
  std::array<int32_t, 256> byte_ids;  // vocab id of each byte's byte-level character, or -1

  std::vector<AddedToken> added;
  // Indices into `added` of the tokens starting with each byte, longest content first.
  std::array<std::vector<int32_t>, 256> added_by_first_byte;

  bool nfc_normalize = false;
  std::unique_ptr<tok::SplitRegex> split;  // null: the whole segment is one piece

  std::optional<int32_t> eos_id;
  std::optional<int32_t> pad_id;

  // Unique per loaded tokenizer in this process (never reused), so per-thread caches can tell
  // their entries apart even after a tokenizer is destroyed and another allocated at its address.
  uint64_t uid = 0;

  // Encodes text that contains no added tokens: NFC, split, byte-level, BPE. Appends to `out`.
  void encode_segment(std::string_view text, std::vector<int32_t>* out) const;
  // Byte-level BPE of one pre-tokenized piece. Appends to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;
};

namespace tok {

// Loads tokenizer.json (`path` may be its directory) and tokenizer_config.json beside it.
Result<std::unique_ptr<TokenizerImpl>> load_impl(const std::string& path);
// A tokenizer.json document held in memory; `name` names it in errors.
Result<std::unique_ptr<TokenizerImpl>> parse_impl(const std::string& text, const std::string& name);

}  // namespace tok
}  // namespace vlm
