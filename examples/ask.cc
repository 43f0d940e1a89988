// vlm embedded in a program, without HTTP: load a Qwen3-VL checkpoint, ask several questions
// about one picture at once through the engine's streaming chat API (Engine::chat_stream), and
// print each reply as it arrives. The requests run together (continuous batching); each has its own
// stream.
//
//   vlm_example_ask MODEL_DIR IMAGE "question" ["question" ...]
//
// prints one line per question, "<index>: <reply>", in the order the replies finish.
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vlm/engine.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL_DIR IMAGE QUESTION [QUESTION...]\n", argv[0]);
    return 2;
  }
  // The engine thread calls `notify` when a stream has new pieces; this thread then reads them.
  // Declared before the engine, so that they outlive it: the engine may call `notify` until it is
  // destroyed.
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  auto notify = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ready = true;
    cv.notify_one();
  };

  vlm::EngineOptions options;
  options.model_dir = argv[1];
  auto engine = vlm::Engine::load(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "error: %s\n", engine.status().message().c_str());
    return 1;
  }

  std::vector<std::unique_ptr<vlm::ChatStream>> streams;
  for (int i = 3; i < argc; ++i) {
    vlm::ImageInput image;
    image.path = argv[2];
    vlm::ChatMessage user;
    user.role = "user";
    user.content_is_text = false;
    user.parts = {vlm::ChatPart::of_image(image), vlm::ChatPart::of_text(argv[i])};
    vlm::ChatRequest request;
    request.messages = {user};
    request.sampling.do_sample = false;  // greedy
    request.max_new_tokens = 32;
    // Rendered with the checkpoint's chat template, tokenized, the image decoded: here, now.
    auto stream = (*engine)->chat_stream(std::move(request), notify);
    if (!stream.ok()) {  // a bad image, a prompt over the context, a full queue
      std::fprintf(stderr, "error: question %d: %s\n", i - 2, stream.status().message().c_str());
      return 1;
    }
    streams.push_back(std::move(stream).value());
  }

  std::vector<std::string> replies(streams.size());
  size_t open = streams.size();
  while (open > 0) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return ready; });
      ready = false;
    }
    // try_next never blocks: take what each stream has now (text is detokenized and split here).
    for (size_t i = 0; i < streams.size(); ++i) {
      if (streams[i] == nullptr) continue;
      vlm::ChatChunk piece;
      while (streams[i]->try_next(&piece)) {
        replies[i] += piece.delta.content;
        if (!piece.error.ok()) {
          std::fprintf(stderr, "error: question %zu: %s\n", i + 1, piece.error.message().c_str());
          return 1;
        }
        if (piece.finished) {
          std::printf("%zu: %s\n", i + 1, replies[i].c_str());
          streams[i].reset();
          --open;
          break;
        }
      }
    }
  }
  return 0;
}
