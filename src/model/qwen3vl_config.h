// Qwen3-VL and Qwen3.5 configuration: field names follow the Hugging Face config.json keys
// verbatim.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/prequant.h"
#include "vlm/status.h"

namespace vlm {

// The model families vlm runs, by config.json's model_type.
enum class ModelFamily {
  kQwen3VL,  // qwen3_vl, qwen3_vl_moe, and plain Qwen3 text configs (qwen3, qwen3_moe)
  kQwen35,   // qwen3_5, qwen3_5_moe: hybrid Gated DeltaNet + gated attention layers
};

// A decoder layer's token mixer (Qwen3.5's layer_types).
enum class LayerType : uint8_t { kFullAttention, kLinearAttention };

struct Qwen3VLTextConfig {
  ModelFamily family = ModelFamily::kQwen3VL;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // the dense MLP's; 0 for qwen3_5_moe (no dense MLP)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // config "head_dim", else hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 5e6;  // text_config.rope_theta, or rope_parameters.rope_theta (v5)
  // rope_scaling.mrope_section (v4) / rope_parameters.mrope_section (v5); sums to
  // rotary_dim / 2.
  std::vector<int64_t> mrope_section;
  // The leading dims of each head that rotate: head_dim · partial_rotary_factor (Qwen3.5: 0.25
  // by default; Qwen3-VL rotates all of them). 0 (a config built by hand): head_dim.
  int64_t rotary_dim = 0;
  int64_t rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  std::string hidden_act = "silu";
  bool attention_bias = false;

  // Mixture of experts (qwen3_vl_moe, qwen3_5_moe); num_experts 0: every layer dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // each expert's I
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = true;
  // qwen3_5_moe: each sparse layer's shared expert (an MLP of this intermediate size every row
  // goes through, scaled by sigmoid(shared_expert_gate · x)); 0: none.
  int64_t shared_expert_intermediate_size = 0;
  // Whether decoder layer l's MLP is the sparse block (transformers' rule: not in
  // mlp_only_layers, and (l + 1) a multiple of decoder_sparse_step).
  bool sparse_layer(int64_t l) const;

  // Qwen3.5 (family kQwen35). Every RMSNorm of the decoder but the linear layers' gated one
  // scales by (1 + weight); q_proj yields, per head, [q | gate] and the attention output is
  // multiplied by sigmoid(gate).
  bool zero_centered_norms = false;
  bool attn_output_gate = false;
  // layer_types, or every full_attention_interval-th layer full attention; empty: all full.
  std::vector<LayerType> layer_types;
  // The Gated DeltaNet layers' geometry.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  // The value heads in llama.cpp's GGUF order rather than transformers' (ops::DeltaNetShape::
  // tiled): set by the GGUF loader, never by a config.json.
  bool linear_value_heads_tiled = false;
  // Qwen3.5's multi-token-prediction head (the checkpoint's mtp.* tensors, speculative
  // decoding's `--spec mtp`): its decoder layers (mtp_num_hidden_layers; 0: none).
  int64_t mtp_num_hidden_layers = 0;
  bool linear_layer(int64_t l) const {
    return !layer_types.empty() && layer_types[l] == LayerType::kLinearAttention;
  }
  int64_t num_linear_layers() const;
  // The channels of the linear layers' conv1d: q, k (key heads · key dim each) and v.
  int64_t linear_conv_dim() const {
    return 2 * linear_num_key_heads * linear_key_head_dim +
           linear_num_value_heads * linear_value_head_dim;
  }
  // Rows of q_proj: the query heads, and as many gate rows with the output gate.
  int64_t q_proj_rows() const {
    return num_attention_heads * head_dim * (attn_output_gate ? 2 : 1);
  }
};

struct Qwen3VLVisionConfig {
  int64_t depth = 0;
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t intermediate_size = 0;
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t in_channels = 3;
  int64_t out_hidden_size = 0;
  int64_t num_position_embeddings = 0;
  std::vector<int64_t> deepstack_visual_indexes;
  std::string hidden_act = "gelu_pytorch_tanh";
};

struct Qwen3VLConfig {
  std::string model_type;  // as written (the top level's, else text_config's; may be empty)
  Qwen3VLTextConfig text_config;
  Qwen3VLVisionConfig vision_config;
  bool has_vision = false;
  bool tie_word_embeddings = false;
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  std::string torch_dtype;  // as written ("bfloat16", "float32", ...), informational
  // eos_token_id of the text config (or the top level): a checkpoint without
  // generation_config.json (Qwen3.5's) stops there too.
  std::vector<int64_t> eos_token_id;
  // quantization_config: a pre-quantized checkpoint's scheme (method kNone: none).
  PrequantConfig prequant;
};

// generation_config.json: defaults a request may override.
struct GenerationConfig {
  std::vector<int64_t> eos_token_id;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  bool do_sample = false;
  double temperature = 1.0;
  int64_t top_k = 50;  // transformers' default when absent
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  std::optional<int64_t> max_new_tokens;
};

// Parses config.json text. Accepts Qwen3-VL and Qwen3.5 checkpoints (text_config /
// vision_config) and plain Qwen3 text configs (fields at top level); any other model_type is
// refused by name. `source` names the file in error messages.
Result<Qwen3VLConfig> parse_qwen3vl_config(const std::string& json_text, const std::string& source);
Result<Qwen3VLConfig> load_qwen3vl_config(const std::string& dir);

Result<GenerationConfig> parse_generation_config(const std::string& json_text,
                                                 const std::string& source);
// Missing generation_config.json is not an error: returns defaults.
Result<GenerationConfig> load_generation_config(const std::string& dir);

// Reads a whole small file (configs). Errors name the path.
Result<std::string> read_text_file(const std::string& path);

}  // namespace vlm
