#include "model/qwen3vl_weights.h"

#include "core/half.h"

namespace vlm {
namespace {

// transformers >= 4.52 writes "model.language_model."; older Qwen-VL exports used "model.".
constexpr const char* kPrefixes[] = {"model.language_model.", "model."};

constexpr std::initializer_list<DType> kFloatTypes = {DType::kF32, DType::kBF16, DType::kF16};

Result<std::vector<float>> load_vector(const WeightStore& s, const std::string& name, int64_t n) {
  VLM_ASSIGN_OR_RETURN(TensorView v, s.get(name, {n}, kFloatTypes));
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (v.dtype) {
      case DType::kF32: out[i] = static_cast<const float*>(v.data)[i]; break;
      case DType::kBF16: out[i] = bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]); break;
      case DType::kF16: out[i] = f16_to_f32(static_cast<const uint16_t*>(v.data)[i]); break;
      default: break;
    }
  }
  return out;
}

}  // namespace

Result<TextWeights> load_text_weights(const WeightStore& s, const Qwen3VLConfig& cfg) {
  const Qwen3VLTextConfig& t = cfg.text_config;
  std::string prefix = kPrefixes[0];
  for (const char* p : kPrefixes) {
    if (s.has(std::string(p) + "embed_tokens.weight")) {
      prefix = p;
      break;
    }
  }
  const int64_t H = t.hidden_size, q_out = t.num_attention_heads * t.head_dim,
                kv_out = t.num_key_value_heads * t.head_dim, I = t.intermediate_size;
  TextWeights w;
  VLM_ASSIGN_OR_RETURN(w.embed_tokens, s.get(prefix + "embed_tokens.weight", {t.vocab_size, H}, kFloatTypes));
  w.layers.resize(t.num_hidden_layers);
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
    const std::string p = prefix + "layers." + std::to_string(l) + ".";
    TextLayerWeights& L = w.layers[l];
    VLM_ASSIGN_OR_RETURN(L.input_layernorm, load_vector(s, p + "input_layernorm.weight", H));
    VLM_ASSIGN_OR_RETURN(L.q_proj, s.get(p + "self_attn.q_proj.weight", {q_out, H}, kFloatTypes));
    VLM_ASSIGN_OR_RETURN(L.k_proj, s.get(p + "self_attn.k_proj.weight", {kv_out, H}, kFloatTypes));
    VLM_ASSIGN_OR_RETURN(L.v_proj, s.get(p + "self_attn.v_proj.weight", {kv_out, H}, kFloatTypes));
    VLM_ASSIGN_OR_RETURN(L.o_proj, s.get(p + "self_attn.o_proj.weight", {H, q_out}, kFloatTypes));
    VLM_ASSIGN_OR_RETURN(L.q_norm, load_vector(s, p + "self_attn.q_norm.weight", t.head_dim));
    VLM_ASSIGN_OR_RETURN(L.k_norm, load_vector(s, p + "self_attn.k_norm.weight", t.head_dim));
    VLM_ASSIGN_OR_RETURN(L.post_attention_layernorm,
                         load_vector(s, p + "post_attention_layernorm.weight", H));
    VLM_ASSIGN_OR_RETURN(L.gate_proj, s.get(p + "mlp.gate_proj.weight", {I, H}, kFloatTypes));
    VLM_ASSIGN_OR_RETURN(L.up_proj, s.get(p + "mlp.up_proj.weight", {I, H}, kFloatTypes));
    VLM_ASSIGN_OR_RETURN(L.down_proj, s.get(p + "mlp.down_proj.weight", {H, I}, kFloatTypes));
  }
  VLM_ASSIGN_OR_RETURN(w.norm, load_vector(s, prefix + "norm.weight", H));
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    VLM_ASSIGN_OR_RETURN(w.lm_head, s.get("lm_head.weight", {t.vocab_size, H}, kFloatTypes));
  }
  return w;
}

}  // namespace vlm
