// Qwen3-VL weights: views into the mmap'd checkpoint (no copies), plus f32 copies of the small
// norm vectors. Shapes are [out, in] as stored (nn.Linear layout).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "vlm/status.h"

namespace vlm {

struct TextLayerWeights {
  std::vector<float> input_layernorm;           // [hidden]
  TensorView q_proj;                            // [n_heads * head_dim, hidden]
  TensorView k_proj;                            // [n_kv_heads * head_dim, hidden]
  TensorView v_proj;                            // [n_kv_heads * head_dim, hidden]
  TensorView o_proj;                            // [hidden, n_heads * head_dim]
  std::vector<float> q_norm;                    // [head_dim]
  std::vector<float> k_norm;                    // [head_dim]
  std::vector<float> post_attention_layernorm;  // [hidden]
  TensorView gate_proj;                         // [intermediate, hidden]
  TensorView up_proj;                           // [intermediate, hidden]
  TensorView down_proj;                         // [hidden, intermediate]
};

struct TextWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  std::vector<TextLayerWeights> layers;
  std::vector<float> norm;  // [hidden]
  TensorView lm_head;       // [vocab, hidden]; = embed_tokens when tied
};

// Loads and checks every text-decoder tensor (name, shape, dtype). The store must outlive the
// returned views. Errors name the file and the tensor.
Result<TextWeights> load_text_weights(const WeightStore& store, const Qwen3VLConfig& cfg);

}  // namespace vlm
