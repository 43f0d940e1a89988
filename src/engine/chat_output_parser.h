// Splits a chat reply as it streams (Engine::chat, on the consuming thread) into reasoning, content
// and tool calls (the OpenAI message's `reasoning` / `reasoning_content`, `content` and
// `tool_calls`):
//   - reasoning: what precedes `</think>` — after a `<think>` the reply opens with, or from the
//     start when the prompt opened it (Qwen3 Thinking templates end the generation prompt with
//     `<think>\n`); the newlines after `</think>` are dropped;
//   - tool calls: `<tool_call>…</tool_call>` blocks holding either Qwen's JSON
//     `{"name": …, "arguments": …}` or the XML form of newer Qwen checkpoints
//     (`<function=NAME><parameter=P>value</parameter>…</function>`). A block that is neither is
//     left in the content as it came; whitespace between and after calls is dropped.
// Text that may be the start of a tag is held back until it cannot be, and a tool call is
// released only once its block is complete and valid, so the pieces streamed add up to exactly
// the non-streamed result whatever the chunking.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vlm/chat.h"

namespace vlm {

class ChatOutputParser {
 public:
  struct Options {
    bool reasoning = true;            // split reasoning out at all
    bool reasoning_open = false;      // the prompt opened <think>: the reply starts in reasoning
    bool tool_calls = true;           // parse <tool_call> blocks (false: tool_choice "none")
    std::string id_prefix = "call_";  // tool call ids: id_prefix + index
    int max_tool_calls = 0;           // > 0: later calls are dropped (parallel_tool_calls false)
  };
  explicit ChatOutputParser(Options options);

  // The next piece of the reply's text; what can be told apart so far goes to *out (appended).
  void feed(std::string_view text, ChatDelta* out);
  // The reply ended: whatever was held back.
  void finish(ChatDelta* out);
  int num_tool_calls() const { return calls_; }

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall };
  void emit_content(std::string text, ChatDelta* out);
  void close_block(const std::string& block, ChatDelta* out);

  Options opt_;
  State state_;
  std::string buf_;
  std::string pending_ws_;       // whitespace after a tool call, held until text follows
  bool strip_newlines_ = false;  // right after </think>
  int calls_ = 0;
};

// A stream's piece into a chat chunk: everything but the text (which the parser splits into
// out->delta), moved.
void take_piece(RequestOutput&& piece, ChatChunk* out);

// Parses one `<tool_call>` block's inside; false when it is not a call.
bool parse_tool_call_block(const std::string& block, std::string* name, std::string* arguments);

}  // namespace vlm
