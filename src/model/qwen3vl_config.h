// Qwen3-VL configuration: field names follow the Hugging Face config.json keys verbatim.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vlm/status.h"

namespace vlm {

struct Qwen3VLTextConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // config "head_dim", else hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 5e6;  // text_config.rope_theta, or rope_parameters.rope_theta (v5)
  // rope_scaling.mrope_section (v4) / rope_parameters.mrope_section (v5); sums to head_dim / 2.
  std::vector<int64_t> mrope_section;
  std::string hidden_act = "silu";
  bool attention_bias = false;

  // Mixture of experts (qwen3_vl_moe); num_experts 0: every layer dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // each expert's I
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = true;
  // Whether decoder layer l's MLP is the sparse block (transformers' rule: not in
  // mlp_only_layers, and (l + 1) a multiple of decoder_sparse_step).
  bool sparse_layer(int64_t l) const;
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
  Qwen3VLTextConfig text_config;
  Qwen3VLVisionConfig vision_config;
  bool has_vision = false;
  bool tie_word_embeddings = false;
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  std::string torch_dtype;  // as written ("bfloat16", "float32", ...), informational
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

// Parses config.json text. Accepts Qwen3-VL checkpoints (text_config / vision_config) and plain
// Qwen3 text configs (fields at top level). `source` names the file in error messages.
Result<Qwen3VLConfig> parse_qwen3vl_config(const std::string& json_text, const std::string& source);
Result<Qwen3VLConfig> load_qwen3vl_config(const std::string& dir);

Result<GenerationConfig> parse_generation_config(const std::string& json_text,
                                                 const std::string& source);
// Missing generation_config.json is not an error: returns defaults.
Result<GenerationConfig> load_generation_config(const std::string& dir);

// Reads a whole small file (configs). Errors name the path.
Result<std::string> read_text_file(const std::string& path);

}  // namespace vlm
