// A conversation through the library's chat API (Engine::chat), as /v1/chat/completions holds
// one: the checkpoint's own chat template, an optional picture, an optional tool the model may
// call, and the reply split into reasoning, content and tool calls. When the model calls the tool,
// the call and a made-up result go back as the next two turns and the model answers again.
//
//   vlm_example_chat MODEL_DIR "question" [IMAGE]
//
// prints the reply's parts ("reasoning: ...", "content: ...", "tool call: NAME ARGUMENTS"), the
// content streamed as it comes.
#include <cstdio>
#include <string>
#include <utility>

#include "vlm/engine.h"

namespace {

// One tool, as OpenAI's API defines tools (the template renders it into the system prompt).
constexpr const char* kWeatherTool =
    R"({"type": "function", "function": {"name": "get_weather", "description": "The weather in )"
    R"(a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, )"
    R"("required": ["city"]}}})";

void print_reply(const vlm::ChatReply& r) {
  if (!r.reasoning.empty()) std::printf("reasoning: %s\n", r.reasoning.c_str());
  for (const vlm::ChatToolCall& c : r.tool_calls) {
    std::printf("tool call: %s %s\n", c.name.c_str(), c.arguments.c_str());
  }
  std::printf("(%lld prompt tokens, %lld generated)\n",
              static_cast<long long>(r.stats.prompt_tokens),
              static_cast<long long>(r.stats.completion_tokens));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR QUESTION [IMAGE]\n", argv[0]);
    return 2;
  }
  vlm::EngineOptions options;
  options.model_dir = argv[1];
  auto engine = vlm::Engine::load(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "error: %s\n", engine.status().message().c_str());
    return 1;
  }

  vlm::ChatMessage user;
  user.role = "user";
  user.content_is_text = false;
  if (argc > 3) {
    vlm::ImageInput image;
    image.path = argv[3];
    user.parts.push_back(vlm::ChatPart::of_image(std::move(image)));
  }
  user.parts.push_back(vlm::ChatPart::of_text(argv[2]));
  vlm::ChatRequest request;
  request.messages = {user};
  request.tools_json = {kWeatherTool};
  request.sampling.do_sample = false;  // greedy
  request.max_new_tokens = 64;

  // The content as it streams (reasoning and tool calls are printed whole afterwards).
  std::printf("content: ");
  auto on_chunk = [](const vlm::ChatChunk& c) {
    std::fputs(c.delta.content.c_str(), stdout);
    std::fflush(stdout);
    return true;  // false would stop the reply here
  };
  auto reply = (*engine)->chat(request, on_chunk);
  std::printf("\n");
  if (!reply.ok()) {  // a template that refuses the conversation, a bad image, ...
    std::fprintf(stderr, "error: %s\n", reply.status().message().c_str());
    return 1;
  }
  print_reply(*reply);
  if (reply->tool_calls.empty()) return 0;

  // The model asked for the weather: its call and an answer go back as the next turns.
  vlm::ChatMessage assistant;
  assistant.role = "assistant";
  assistant.tool_calls = reply->tool_calls;
  vlm::ChatMessage result;
  result.role = "tool";
  result.tool_call_id = reply->tool_calls[0].id;
  result.text = R"({"temperature_c": 3, "sky": "overcast"})";
  request.messages.push_back(std::move(assistant));
  request.messages.push_back(std::move(result));
  std::printf("content: ");
  auto answer = (*engine)->chat(request, on_chunk);
  std::printf("\n");
  if (!answer.ok()) {
    std::fprintf(stderr, "error: %s\n", answer.status().message().c_str());
    return 1;
  }
  print_reply(*answer);
  return 0;
}
