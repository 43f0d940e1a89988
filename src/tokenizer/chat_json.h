// OpenAI / transformers style chat JSON → ChatMessage list for render_chat.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/chat.h"
#include "vlm/status.h"

namespace vlm {

struct ParsedChat {
  std::vector<ChatMessage> messages;
  std::vector<std::string> tools_json;  // each tool as the template's `tojson` writes it
};

// messages_json: a JSON array of {"role", "content" (string | list of parts | null),
// "tool_calls"?}. Parts: {"type": "text", "text"}, {"type": "image" | "image_url", ...},
// {"type": "video", ...}; classified as the template does (an "image"/"image_url" key also marks an
// image). tools_json: empty or a JSON array of tool definitions. Errors say which message is bad.
// Text nested deeper than kMaxJsonDepth (core/json_depth.h) is refused before it is parsed.
Result<ParsedChat> parse_chat_json(std::string_view messages_json,
                                   std::string_view tools_json = {});
// The same from JSON already parsed (the server parses a request once). `tools` may be null. The
// caller bounds the nesting (the walk of tool arguments and definitions recurses).
Result<ParsedChat> parse_chat_json(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json* tools);

// JSON text as Python's json.dumps(json.loads(text), ensure_ascii=False) writes it (", " and ": "
// separators, key order kept, floats as repr writes them: 1e5 is 100000.0): what transformers'
// `tojson` filter produces, by the interpreter's writer (jinja/json.h). `json_text` must be valid
// JSON.
Result<std::string> python_style_json(std::string_view json_text);

}  // namespace vlm
