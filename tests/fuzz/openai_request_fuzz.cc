// libFuzzer target: arbitrary bytes as the JSON body of POST /v1/chat/completions or
// /v1/completions (the first byte picks which), through what the server runs on a body before
// the engine: the bounded parse, every field's validation, the chat messages and tools, and the
// chat template's rendering of an accepted request.
// Build and run: scripts/fuzz.sh openai_request SECONDS (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/openai_api.h"
#include "vlm/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) == 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  vlm::ApiLimits limits;
  limits.vocab_size = 151936;
  limits.max_queue = 256;
  limits.max_image_pixels = 16777216;
  vlm::MediaPolicy media;  // no file:// or remote images: nothing outside the body is read
  if (chat) {
    auto r = vlm::parse_chat_completion(body, limits, media);
    if (r.ok()) {
      vlm::ChatTemplateOptions opts;
      opts.tools_json = r->tools_json;
      const std::string prompt = vlm::render_chat(r->messages, opts);
      size_t images = 0;
      for (const vlm::ChatMessage& m : r->messages) {
        for (const vlm::ChatPart& p : m.parts) images += p.type == vlm::ChatPart::Type::kImage;
      }
      if (r->n < 1 || r->n > limits.max_n || images > size_t(limits.max_images)) __builtin_trap();
      (void)prompt;
    } else if (r.error().http_status < 400 || r.error().http_status > 499 ||
               r.error().message.empty()) {
      __builtin_trap();
    }
  } else {
    auto r = vlm::parse_completion(body, limits);
    if (r.ok()) {
      if (r->prompts.empty() || r->prompts.size() * size_t(r->n) > size_t(limits.max_n))
        __builtin_trap();
    } else if (r.error().http_status < 400 || r.error().http_status > 499 ||
               r.error().message.empty()) {
      __builtin_trap();
    }
  }
  return 0;
}
