// vlm public API: the Qwen byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
// Thread-safety: a loaded Tokenizer is immutable; encode/decode may be called from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/status.h"

namespace vlm {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one (tokenizer_config.json beside it is
  // read when present, for eos/pad tokens). Errors name the file and what is wrong with it.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  // A tokenizer.json document given as text (one built from a GGUF file's vocabulary, say), with
  // the eos and pad ids tokenizer_config.json would give; `name` names it in errors.
  static Result<std::unique_ptr<Tokenizer>> from_json(const std::string& json_text,
                                                      const std::string& name,
                                                      std::optional<int32_t> eos,
                                                      std::optional<int32_t> pad);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes like transformers' tokenizer(text, add_special_tokens=False).
  // split_special=false: every added token's text in `text` becomes its id (HF default).
  // split_special=true: the text of `special: true` added tokens goes through BPE as plain text;
  // non-special added tokens (e.g. <think>) are still matched.
  std::vector<int32_t> encode(std::string_view text, bool split_special = false) const;

  // Decodes like transformers' decode(ids, skip_special_tokens=...). Invalid UTF-8 byte sequences
  // become U+FFFD (one per maximal invalid sequence). Ids out of range are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Number of ids (regular vocab + added tokens).
  int32_t vocab_size() const;
  // Id of a vocab or added token string (byte-level form for vocab entries), if any.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Raw token string (byte-level form for vocab entries; content for added tokens).
  std::string id_to_token(int32_t id) const;
  // True for added tokens marked `special: true`.
  bool is_special(int32_t id) const;
  // The raw bytes an id stands for (added tokens: their content). Empty for unknown ids.
  std::string token_bytes(int32_t id) const;
  // eos_token / pad_token ids from tokenizer_config.json, when present.
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;

 private:
  friend struct TokenizerAccess;  // the tokenizer's own sources (src/tokenizer/tokenizer_impl.h)
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 text.
// Never emits half a character; bytes of an incomplete sequence are held until the next id
// completes them, or flush() turns them into U+FFFD.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special = true);
  // Returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Returns whatever is held back, invalid bytes replaced by U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted (an incomplete UTF-8 tail)
};

}  // namespace vlm
