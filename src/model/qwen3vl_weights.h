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

struct VisionBlockWeights {
  std::vector<float> norm1_w, norm1_b;  // [D]
  TensorView qkv;                       // [3·D, D]: rows q | k | v, head-major inside each
  std::vector<float> qkv_b;             // [3·D]
  TensorView proj;                      // [D, D]
  std::vector<float> proj_b;            // [D]
  std::vector<float> norm2_w, norm2_b;  // [D]
  TensorView fc1;                       // [intermediate, D]
  std::vector<float> fc1_b;             // [intermediate]
  TensorView fc2;                       // [D, intermediate]
  std::vector<float> fc2_b;             // [D]
};

// Patch merger: norm over D before the 2×2 concat (main) or over 4·D after it (DeepStack).
struct VisionMergerWeights {
  std::vector<float> norm_w, norm_b;  // [D] or [4·D]
  TensorView fc1;                     // [4·D, 4·D]
  std::vector<float> fc1_b;           // [4·D]
  TensorView fc2;                     // [out_hidden, 4·D]
  std::vector<float> fc2_b;           // [out_hidden]
};

struct VisionWeights {
  TensorView patch_embed;               // [D, 3·T·P·P]: the Conv3d kernel flattened (C, T, kh, kw)
  std::vector<float> patch_embed_b;     // [D]
  std::vector<float> pos_embed;         // [num_position_embeddings, D] as f32
  std::vector<VisionBlockWeights> blocks;
  VisionMergerWeights merger;
  std::vector<VisionMergerWeights> deepstack_mergers;  // one per deepstack_visual_indexes entry
};

// Loads and checks every text-decoder tensor (name, shape, dtype). The store must outlive the
// returned views. Errors name the file and the tensor.
Result<TextWeights> load_text_weights(const WeightStore& store, const Qwen3VLConfig& cfg);

// Loads and checks every vision-tower tensor ("model.visual.*").
Result<VisionWeights> load_vision_weights(const WeightStore& store, const Qwen3VLConfig& cfg);

}  // namespace vlm
