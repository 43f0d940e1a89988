// A GGUF model file (llama.cpp's format: what Ollama, LM Studio and llama.cpp download) and its
// separate vision file (`mmproj`), read as the checkpoint the loaders read: the configuration
// from the metadata, the tensors under transformers' names and layouts (what llama.cpp's
// convert_hf_to_gguf.py did undone: its names, the vision patch embedding's Conv3D split in two
// along time, the DeepStack mergers numbered by vision layer, the experts stacked), the
// tokenizer from `tokenizer.ggml.*` and the chat template from `tokenizer.chat_template`.
//
// Qwen3.5 too: A_log from its stored -exp(A_log), the (1 + w) norms from their stored 1 + w, the
// MTP head from the extra block. The value heads the converter reordered stay in its order (the
// config's linear_value_heads_tiled: the layers run so), their matrices as stored.
//
// Weights: F32 and BF16 tensors are read in place from the mapping, and so are the text
// decoder's Q8_0, Q4_K, Q5_K and Q6_K matrices with `native_blocks` (DType::kQ8_0 ...: the CPU
// multiplies them as stored, kernels/cpu/ggml_blocks.h); every other type (F16 and the other
// quantized ones) is dequantized block by block exactly as the format defines
// (io/gguf_quants.h) and held in memory: in f32 (`exact`), else rounded to BF16 (half the
// memory; each weight within 2^-8 of its value, relative). The tensors whose layout the
// converter changed (Qwen3.5's A_log and norms, the vision patch embedding) are f32 copies either
// way.
//
// Architectures: qwen3vl, qwen3vlmoe (Qwen3-VL dense and MoE), qwen35 and qwen35moe (Qwen3.5 /
// 3.6); the vision file's projector qwen3vl_merger. Anything else is refused by name.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "vlm/status.h"

namespace vlm {

struct GgufCheckpoint {
  Qwen3VLConfig cfg;  // has_vision: a vision file was given
  std::unique_ptr<WeightStore> store;
  // The tokenizer as a tokenizer.json document (byte-level BPE, the pre-tokenizer that
  // tokenizer.ggml.pre names), and the ids tokenizer_config.json would give.
  std::string tokenizer_json;
  std::optional<int32_t> eos_id, pad_id;
  std::string bos_token, eos_token;  // their text, for the chat template
  std::string chat_template;         // tokenizer.chat_template; "" when the file has none
  // The vision file's image_mean / image_std (empty without one).
  std::vector<double> image_mean, image_std;
  // What the load did that its user should hear once (types dequantized, defaults taken).
  std::vector<std::string> notes;
  uint64_t file_bytes = 0;         // the two files' sizes
  uint64_t dequantized_bytes = 0;  // memory the dequantized (and copied) tensors take
};

// Opens `model_path` (a .gguf file) and, when not empty, `mmproj_path`. Errors name the file and
// the key or tensor at fault.
// `native_blocks` (the CPU, without `exact`): the text decoder's Q8_0, Q4_K, Q5_K and Q6_K
// matrices stay as stored, for the CPU's block kernels.
Result<GgufCheckpoint> open_gguf_checkpoint(const std::string& model_path,
                                            const std::string& mmproj_path, bool exact = true,
                                            bool native_blocks = false);

// Whether `path` names a GGUF file (by its first four bytes, "GGUF").
bool is_gguf_file(const std::string& path);

// The tokenizer.json document for a GGUF file's tokenizer.ggml.* (exposed for tests).
Result<std::string> gguf_tokenizer_json(const GgufFile& f);

}  // namespace vlm
