#include "engine/structured_output.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "core/clock.h"
#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace vlm {

namespace {

using structured::Element;
using structured::Grammar;
using structured::Sequence;
using ojson = nlohmann::ordered_json;

// Tool calls: begin {"name": "NAME", "arguments": ARGS} end, one or (parallel) more separated by
// a newline, and nothing else; ARGS follows the tool's parameter schema.
Result<Grammar> tool_call_grammar(const StructuredOutput& so) {
  ojson tools;
  try {
    tools = ojson::parse(so.spec);
  } catch (const ojson::exception& e) {
    return invalid_argument(std::string("tools: malformed JSON: ") + e.what());
  }
  if (!tools.is_array() || tools.empty())
    return invalid_argument("tools: a non-empty list is needed");
  Grammar g;
  std::vector<Sequence> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
      return invalid_argument("tools[" + std::to_string(i) + "]: a string 'name' is needed");
    }
    const std::string name = t["name"].get<std::string>();
    std::string params = R"({"type": "object"})";
    if (auto p = t.find("parameters"); p != t.end() && !p->is_null()) params = p->dump();
    auto args = structured::add_json_schema(&g, params);
    if (!args.ok()) {
      return invalid_argument("tools[" + std::to_string(i) + "] ('" + name +
                              "') parameters: " + args.status().message());
    }
    Sequence call =
        g.literal(so.tool_call_begin + R"({"name": )" + ojson(name).dump() + R"(, "arguments": )");
    call.push_back(*args);
    const Sequence tail = g.literal("}" + so.tool_call_end);
    call.insert(call.end(), tail.begin(), tail.end());
    calls.push_back(std::move(call));
  }
  const Element one = g.group(std::move(calls), "tool_call");
  Sequence root{one};
  if (so.parallel_tool_calls) {
    Sequence more = g.literal("\n");
    more.push_back(one);
    root.push_back(g.star(std::move(more)));
  }
  g.set_root(g.rule("root", {std::move(root)}));
  VLM_RETURN_IF_ERROR(g.finalize());
  return g;
}

}  // namespace

Result<structured::Grammar> build_grammar(const StructuredOutput& so) {
  using Kind = StructuredOutput::Kind;
  switch (so.kind) {
    case Kind::kJsonObject:
      return structured::json_object_grammar();  // finalized
    case Kind::kJsonSchema:
      return structured::compile_json_schema(so.spec);
    case Kind::kRegex:
      return structured::compile_regex(so.spec);
    case Kind::kGrammar:
      return structured::parse_gbnf(so.spec);
    case Kind::kChoice: {
      if (so.choices.empty()) return invalid_argument("choice: at least one choice is needed");
      Grammar g;
      std::vector<Sequence> alts;
      for (const std::string& c : so.choices) alts.push_back(g.literal(c));
      g.set_root(g.rule("root", std::move(alts)));
      VLM_RETURN_IF_ERROR(g.finalize());
      return g;
    }
    case Kind::kToolCalls:
      return tool_call_grammar(so);
    case Kind::kNone:
      break;
  }
  return invalid_argument("no structured output was asked for");
}

StructuredOutputs::StructuredOutputs(std::shared_ptr<const Tokenizer> tokenizer, int64_t vocab_size,
                                     size_t cache_entries)
    : tokenizer_(std::move(tokenizer)), vocab_size_(vocab_size), capacity_(cache_entries) {}

std::shared_ptr<const structured::TokenVocab> StructuredOutputs::vocab() {
  std::call_once(vocab_once_, [&] {
    // Special tokens (<|im_end|>, <|image_pad|>, ...) are never grammar text: the end tokens
    // are allowed by the matcher's own rule, the others never. Added tokens that are not
    // special (<tool_call>, <think>) are text like any other.
    const int32_t n = tokenizer_->vocab_size();
    std::vector<std::string> bytes(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
      if (!tokenizer_->is_special(id)) bytes[static_cast<size_t>(id)] = tokenizer_->token_bytes(id);
    }
    vocab_ = std::make_shared<structured::TokenVocab>(bytes, vocab_size_);
  });
  return vocab_;
}

Result<std::shared_ptr<structured::CompiledGrammar>> StructuredOutputs::compile(
    const StructuredOutput& so) {
  Sha256 h;
  const auto kind = static_cast<int32_t>(so.kind);
  h.update_value(kind);
  auto put = [&](const std::string& s) {
    const uint64_t n = s.size();
    h.update_value(n);
    h.update(s.data(), s.size());
  };
  put(so.spec);
  const uint64_t nc = so.choices.size();
  h.update_value(nc);
  for (const std::string& c : so.choices) put(c);
  const uint8_t parallel = so.parallel_tool_calls ? 1 : 0;
  h.update_value(parallel);
  put(so.tool_call_begin);
  put(so.tool_call_end);
  const Sha256Digest key = h.finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.end(), lru_, it->second);
      ++stats_.cache_hits;
      return it->second->second;
    }
  }
  const Clock::time_point t0 = Clock::now();
  VLM_ASSIGN_OR_RETURN(structured::Grammar g, build_grammar(so));
  auto compiled = std::make_shared<structured::CompiledGrammar>(g, vocab());
  const double ms = ms_since(t0);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.compiled;
  stats_.compile_ms += ms;
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;  // a race
  lru_.emplace_back(key, compiled);
  index_[key] = std::prev(lru_.end());
  while (lru_.size() > capacity_) {
    index_.erase(lru_.front().first);
    lru_.pop_front();
  }
  return compiled;
}

StructuredOutputs::Stats StructuredOutputs::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace vlm
