// libFuzzer target: arbitrary bytes as a GGUF file, through the parser that reads the header of
// every GGUF vlm is given (src/io/gguf.cc): it must return an error or a file whose every
// tensor's bytes lie inside the input and are as many as its shape and type make, never read
// outside it.
// Build and run: scripts/fuzz.sh gguf SECONDS (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = vlm::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz");
  if (!g.ok()) {
    if (g.status().message().empty()) __builtin_trap();
    return 0;
  }
  for (const vlm::GgufTensor& t : g->tensors()) {
    if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size) __builtin_trap();
    // The byte count is the shape's, never one that wrapped around.
    const vlm::GgmlBlock b = vlm::ggml_block(t.type);
    if (b.block == 0 || t.numel() % b.block != 0 ||
        static_cast<uint64_t>(t.numel() / b.block) != t.nbytes / static_cast<uint64_t>(b.bytes) ||
        t.nbytes % static_cast<uint64_t>(b.bytes) != 0) {
      __builtin_trap();
    }
  }
  for (const auto& [key, v] : g->metadata()) {
    for (uint64_t k = 0; k < v.count && v.raw != nullptr; ++k) (void)v.item(k);
  }
  return 0;
}
