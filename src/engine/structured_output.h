// Structured output on the engine's side: a request's StructuredOutput → a grammar → a grammar
// compiled against the model's vocabulary, cached by the SHA-256 of what the request asked for
// (a server sees the same schema many times; the cache keeps each compiled grammar's masks).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/sha256.h"
#include "structured/grammar.h"
#include "structured/matcher.h"
#include "vlm/engine.h"
#include "vlm/request.h"
#include "vlm/status.h"
#include "vlm/tokenizer.h"

namespace vlm {

// The grammar `so` describes, finalized. Errors (an unsupported schema keyword, a malformed
// pattern or grammar) are invalid_argument naming what is wrong.
Result<structured::Grammar> build_grammar(const StructuredOutput& so);

class StructuredOutputs {
 public:
  StructuredOutputs(std::shared_ptr<const Tokenizer> tokenizer, int64_t vocab_size,
                    size_t cache_entries = 16);

  // The compiled grammar for `so`, from the cache or compiled now (on the caller's thread).
  Result<std::shared_ptr<structured::CompiledGrammar>> compile(const StructuredOutput& so);
  // The vocabulary's token trie (built on first use).
  std::shared_ptr<const structured::TokenVocab> vocab();

  struct Stats {
    int64_t compiled = 0, cache_hits = 0;
    double compile_ms = 0;  // total
  };
  Stats stats() const;

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t vocab_size_;
  size_t capacity_;
  std::once_flag vocab_once_;
  std::shared_ptr<const structured::TokenVocab> vocab_;
  mutable std::mutex mu_;
  // Least recently used first.
  std::list<std::pair<Sha256Digest, std::shared_ptr<structured::CompiledGrammar>>> lru_;
  std::unordered_map<Sha256Digest, decltype(lru_)::iterator, Sha256DigestHash> index_;
  Stats stats_;
};

}  // namespace vlm
