#include "model/qwen3vl_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace vlm {
namespace {

using nlohmann::json;

// Reads an integer field; missing → default (or error when required); wrong type → error.
Status get_int(const json& j, const char* key, int64_t* out, bool required,
               const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? invalid_argument(where + ": missing required field '" + key + "'")
                    : ok_status();
  }
  if (!it->is_number_integer())
    return invalid_argument(where + ": field '" + key + "' must be an integer");
  *out = it->get<int64_t>();
  return ok_status();
}

Status get_double(const json& j, const char* key, double* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_number()) return invalid_argument(where + ": field '" + key + "' must be a number");
  *out = it->get<double>();
  return ok_status();
}

Status get_int_list(const json& j, const char* key, std::vector<int64_t>* out,
                    const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (it->is_number_integer()) {
    *out = {it->get<int64_t>()};
    return ok_status();
  }
  if (!it->is_array())
    return invalid_argument(where + ": field '" + key + "' must be a list of integers");
  out->clear();
  for (const auto& v : *it) {
    if (!v.is_number_integer())
      return invalid_argument(where + ": field '" + key + "' must be a list of integers");
    out->push_back(v.get<int64_t>());
  }
  return ok_status();
}

// `hybrid_moe`: a qwen3_5_moe config, every layer a mixture of experts: no dense MLP and so no
// intermediate_size.
Status parse_text(const json& t, const std::string& where, bool nested, bool hybrid_moe,
                  Qwen3VLTextConfig* c) {
  VLM_RETURN_IF_ERROR(get_int(t, "hidden_size", &c->hidden_size, true, where));
  if (!hybrid_moe) {
    VLM_RETURN_IF_ERROR(get_int(t, "intermediate_size", &c->intermediate_size, true, where));
  }
  VLM_RETURN_IF_ERROR(get_int(t, "num_hidden_layers", &c->num_hidden_layers, true, where));
  VLM_RETURN_IF_ERROR(get_int(t, "num_attention_heads", &c->num_attention_heads, true, where));
  c->num_key_value_heads = c->num_attention_heads;
  VLM_RETURN_IF_ERROR(get_int(t, "num_key_value_heads", &c->num_key_value_heads, false, where));
  VLM_RETURN_IF_ERROR(get_int(t, "vocab_size", &c->vocab_size, true, where));
  c->max_position_embeddings = 32768;
  VLM_RETURN_IF_ERROR(
      get_int(t, "max_position_embeddings", &c->max_position_embeddings, false, where));
  VLM_RETURN_IF_ERROR(get_double(t, "rms_norm_eps", &c->rms_norm_eps, where));
  VLM_RETURN_IF_ERROR(get_double(t, "rope_theta", &c->rope_theta, where));
  if (c->num_attention_heads <= 0 || c->hidden_size <= 0) {
    return invalid_argument(where + ": hidden_size and num_attention_heads must be positive");
  }
  // Qwen3VLTextConfig defaults head_dim to 128; a flat Qwen3-style config derives it.
  c->head_dim = nested ? 128 : c->hidden_size / c->num_attention_heads;
  VLM_RETURN_IF_ERROR(get_int(t, "head_dim", &c->head_dim, false, where));
  // Rope settings: v4 spells them rope_scaling (theta beside it), v5 rope_parameters (theta
  // inside).
  // Qwen3.5 rotates a quarter of each head unless the config says otherwise (transformers'
  // Qwen3_5TextConfig default), with the M-RoPE sections of its rotary dims.
  double partial = c->family == ModelFamily::kQwen35 ? 0.25 : 1.0;
  VLM_RETURN_IF_ERROR(get_double(t, "partial_rotary_factor", &partial, where));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = t.find(key);
    if (it == t.end() || it->is_null()) continue;
    if (!it->is_object()) return invalid_argument(where + ": '" + key + "' must be an object");
    VLM_RETURN_IF_ERROR(get_double(*it, "rope_theta", &c->rope_theta, where + "." + key));
    VLM_RETURN_IF_ERROR(get_int_list(*it, "mrope_section", &c->mrope_section, where + "." + key));
    VLM_RETURN_IF_ERROR(get_double(*it, "partial_rotary_factor", &partial, where + "." + key));
    auto type = it->find("rope_type");
    if (type == it->end()) type = it->find("type");
    if (type != it->end() && type->is_string() && *type != "default" && *type != "mrope") {
      return unimplemented(where + ": rope type '" + type->get<std::string>() +
                           "' is not supported");
    }
  }
  if (auto it = t.find("hidden_act"); it != t.end() && it->is_string()) c->hidden_act = *it;
  if (auto it = t.find("attention_bias"); it != t.end() && it->is_boolean())
    c->attention_bias = *it;

  // Invariants the decoder relies on.
  if (c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads != 0) {
    return invalid_argument(where +
                            ": num_attention_heads must be a multiple of num_key_value_heads");
  }
  if (c->head_dim <= 0 || c->head_dim % 2 != 0)
    return invalid_argument(where + ": head_dim must be even");
  if (partial != 1.0 && c->family != ModelFamily::kQwen35) {
    return unimplemented(where + ": partial_rotary_factor is supported for Qwen3.5 (qwen3_5) only");
  }
  // transformers: int(head_dim * partial_rotary_factor).
  c->rotary_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * partial);
  if (!(partial > 0 && partial <= 1) || c->rotary_dim <= 0 || c->rotary_dim % 2 != 0) {
    return invalid_argument(where +
                            ": partial_rotary_factor must leave an even number of rotary "
                            "dims in (0, head_dim]");
  }
  if (c->mrope_section.empty()) {
    // Qwen3.5's rotary defaults to [11, 11, 10] (of 64 rotary dims); a plain Qwen3 model is 1-D
    // RoPE (all T axis).
    c->mrope_section = c->family == ModelFamily::kQwen35 && c->rotary_dim == 64
                           ? std::vector<int64_t>{11, 11, 10}
                           : std::vector<int64_t>{c->rotary_dim / 2, 0, 0};
  }
  int64_t sum = 0;
  for (int64_t s : c->mrope_section) sum += s;
  if (c->mrope_section.size() != 3 || sum != c->rotary_dim / 2) {
    return invalid_argument(where +
                            ": mrope_section must have 3 entries summing to the rotary dims / 2 (" +
                            std::to_string(c->rotary_dim / 2) + ")");
  }
  if (c->hidden_act != "silu")
    return unimplemented(where + ": hidden_act '" + c->hidden_act + "' is not supported");
  if (c->attention_bias) return unimplemented(where + ": attention_bias=true is not supported");
  return ok_status();
}

// The sparse MLP's fields of a qwen3_vl_moe text config (`moe`: the model type says so, and
// transformers' Qwen3VLMoeTextConfig defaults fill what it leaves out), or of any text config
// that gives num_experts > 0. A qwen3_5_moe config (`hybrid_moe`, Qwen3_5MoeTextConfig's
// defaults): every layer sparse (it has no decoder_sparse_step or mlp_only_layers), a shared
// expert beside the routed ones, and the router always renormalises its top-k (it has no
// norm_topk_prob).
Status parse_moe(const json& t, const std::string& where, bool moe, bool hybrid_moe,
                 Qwen3VLTextConfig* c) {
  if (moe) {
    c->num_experts = 60;
    c->num_experts_per_tok = 4;
    c->moe_intermediate_size = 1408;
  }
  if (hybrid_moe) {
    c->num_experts = 256;
    c->num_experts_per_tok = 8;
    c->moe_intermediate_size = 512;
    c->shared_expert_intermediate_size = 512;
    VLM_RETURN_IF_ERROR(get_int(t, "shared_expert_intermediate_size",
                                &c->shared_expert_intermediate_size, false, where));
    if (c->shared_expert_intermediate_size <= 0)
      return invalid_argument(where + ": shared_expert_intermediate_size must be positive");
    moe = true;
  }
  VLM_RETURN_IF_ERROR(get_int(t, "num_experts", &c->num_experts, false, where));
  // (transformers 5.x writes Qwen3-VL MoE's as num_local_experts.)
  const bool both = t.contains("num_experts") && !t["num_experts"].is_null();
  const int64_t named = both ? c->num_experts : -1;
  VLM_RETURN_IF_ERROR(get_int(t, "num_local_experts", &c->num_experts, false, where));
  if (named != -1 && named != c->num_experts) {
    return invalid_argument(where + ": num_experts " + std::to_string(named) +
                            " and num_local_experts " + std::to_string(c->num_experts) +
                            " disagree");
  }
  if (c->num_experts <= 0) {
    if (hybrid_moe) return invalid_argument(where + ": num_experts must be positive");
    c->num_experts = 0;
    return ok_status();
  }
  VLM_RETURN_IF_ERROR(get_int(t, "num_experts_per_tok", &c->num_experts_per_tok, !moe, where));
  VLM_RETURN_IF_ERROR(get_int(t, "moe_intermediate_size", &c->moe_intermediate_size, !moe, where));
  if (!hybrid_moe) {
    VLM_RETURN_IF_ERROR(get_int(t, "decoder_sparse_step", &c->decoder_sparse_step, false, where));
    VLM_RETURN_IF_ERROR(get_int_list(t, "mlp_only_layers", &c->mlp_only_layers, where));
  }
  if (auto it = t.find("norm_topk_prob"); !hybrid_moe && it != t.end() && !it->is_null()) {
    if (!it->is_boolean())
      return invalid_argument(where + ": field 'norm_topk_prob' must be true or false");
    c->norm_topk_prob = *it;
  }
  if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts) {
    return invalid_argument(where + ": num_experts_per_tok must be in [1, num_experts (" +
                            std::to_string(c->num_experts) + ")]");
  }
  if (c->moe_intermediate_size <= 0)
    return invalid_argument(where + ": moe_intermediate_size must be positive");
  if (c->decoder_sparse_step <= 0)
    return invalid_argument(where + ": decoder_sparse_step must be positive");
  for (int64_t l : c->mlp_only_layers) {
    if (l < 0 || l >= c->num_hidden_layers)
      return invalid_argument(where + ": mlp_only_layers names a layer out of range");
  }
  return ok_status();
}

// Qwen3.5's hybrid layers: which layers are Gated DeltaNet (layer_types, else every
// full_attention_interval-th layer is full attention, transformers' default 4) and their geometry
// (transformers' Qwen3_5TextConfig defaults where the file is silent).
Status parse_hybrid(const json& t, const std::string& where, Qwen3VLTextConfig* c) {
  c->zero_centered_norms = true;
  c->attn_output_gate = true;
  if (auto it = t.find("attn_output_gate"); it != t.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return invalid_argument(where + ": field 'attn_output_gate' must be true or false");
    }
    if (!*it) return unimplemented(where + ": attn_output_gate=false is not supported");
  }
  c->linear_num_key_heads = 16;
  c->linear_num_value_heads = 32;
  c->linear_key_head_dim = 128;
  c->linear_value_head_dim = 128;
  c->linear_conv_kernel_dim = 4;
  VLM_RETURN_IF_ERROR(get_int(t, "linear_num_key_heads", &c->linear_num_key_heads, false, where));
  VLM_RETURN_IF_ERROR(
      get_int(t, "linear_num_value_heads", &c->linear_num_value_heads, false, where));
  VLM_RETURN_IF_ERROR(get_int(t, "linear_key_head_dim", &c->linear_key_head_dim, false, where));
  VLM_RETURN_IF_ERROR(get_int(t, "linear_value_head_dim", &c->linear_value_head_dim, false, where));
  VLM_RETURN_IF_ERROR(
      get_int(t, "linear_conv_kernel_dim", &c->linear_conv_kernel_dim, false, where));
  VLM_RETURN_IF_ERROR(get_int(t, "mtp_num_hidden_layers", &c->mtp_num_hidden_layers, false, where));
  if (c->mtp_num_hidden_layers < 0)
    return invalid_argument(where + ": mtp_num_hidden_layers must not be negative");
  if (c->linear_num_key_heads <= 0 || c->linear_num_value_heads <= 0 ||
      c->linear_key_head_dim <= 0 || c->linear_value_head_dim <= 0 ||
      c->linear_conv_kernel_dim < 2) {
    return invalid_argument(where +
                            ": the linear-attention head counts and dims must be "
                            "positive and linear_conv_kernel_dim at least 2");
  }
  if (c->linear_num_value_heads % c->linear_num_key_heads != 0) {
    return invalid_argument(where +
                            ": linear_num_value_heads must be a multiple of linear_num_key_heads");
  }
  const int64_t L = c->num_hidden_layers;
  c->layer_types.clear();
  if (auto it = t.find("layer_types"); it != t.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != L) {
      return invalid_argument(where + ": layer_types must list num_hidden_layers (" +
                              std::to_string(L) + ") entries");
    }
    for (const auto& v : *it) {
      if (v == "linear_attention") {
        c->layer_types.push_back(LayerType::kLinearAttention);
      } else if (v == "full_attention") {
        c->layer_types.push_back(LayerType::kFullAttention);
      } else {
        return unimplemented(where + ": layer type " + v.dump() +
                             " is not supported (linear_attention, full_attention)");
      }
    }
  } else {
    int64_t interval = 4;
    VLM_RETURN_IF_ERROR(get_int(t, "full_attention_interval", &interval, false, where));
    if (interval <= 0)
      return invalid_argument(where + ": full_attention_interval must be positive");
    for (int64_t l = 0; l < L; ++l) {
      c->layer_types.push_back((l + 1) % interval != 0 ? LayerType::kLinearAttention
                                                       : LayerType::kFullAttention);
    }
  }
  if (c->num_linear_layers() == L) {
    return unimplemented(where +
                         ": layer_types has no full_attention layer (a model of linear "
                         "attention alone is not supported)");
  }
  return ok_status();
}

Status parse_vision(const json& v, const std::string& where, Qwen3VLVisionConfig* c) {
  VLM_RETURN_IF_ERROR(get_int(v, "depth", &c->depth, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "hidden_size", &c->hidden_size, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "num_heads", &c->num_heads, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "intermediate_size", &c->intermediate_size, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "patch_size", &c->patch_size, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "temporal_patch_size", &c->temporal_patch_size, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "spatial_merge_size", &c->spatial_merge_size, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "in_channels", &c->in_channels, false, where));
  VLM_RETURN_IF_ERROR(get_int(v, "out_hidden_size", &c->out_hidden_size, false, where));
  VLM_RETURN_IF_ERROR(
      get_int(v, "num_position_embeddings", &c->num_position_embeddings, false, where));
  VLM_RETURN_IF_ERROR(
      get_int_list(v, "deepstack_visual_indexes", &c->deepstack_visual_indexes, where));
  if (auto it = v.find("hidden_act"); it != v.end() && it->is_string()) c->hidden_act = *it;
  // Invariants the vision encoder relies on.
  if (c->depth <= 0 || c->hidden_size <= 0 || c->num_heads <= 0 || c->intermediate_size <= 0) {
    return invalid_argument(
        where + ": depth, hidden_size, num_heads and intermediate_size must be positive");
  }
  if (c->hidden_size % c->num_heads != 0 || (c->hidden_size / c->num_heads) % 4 != 0) {
    return invalid_argument(where +
                            ": hidden_size / num_heads must be a multiple of 4 (2-D rotary)");
  }
  const int64_t side = static_cast<int64_t>(
      std::llround(std::sqrt(static_cast<double>(c->num_position_embeddings))));
  if (c->num_position_embeddings <= 0 || side * side != c->num_position_embeddings) {
    return invalid_argument(where + ": num_position_embeddings must be a perfect square");
  }
  if (c->spatial_merge_size <= 0 || c->patch_size <= 0 || c->temporal_patch_size <= 0) {
    return invalid_argument(
        where + ": patch_size, temporal_patch_size, spatial_merge_size must be positive");
  }
  for (int64_t k : c->deepstack_visual_indexes) {
    if (k < 0 || k >= c->depth)
      return invalid_argument(where + ": deepstack_visual_indexes out of range");
  }
  if (c->hidden_act != "gelu_pytorch_tanh") {
    return unimplemented(where + ": vision hidden_act '" + c->hidden_act + "' is not supported");
  }
  return ok_status();
}

// The family of a config.json model_type (the top level's, else the text config's): known names
// only (none written: a Qwen3-VL layout).
Result<ModelFamily> family_of(const std::string& type, const std::string& source) {
  if (type.empty() || type == "qwen3_vl" || type == "qwen3_vl_moe" || type == "qwen3_vl_text" ||
      type == "qwen3_vl_moe_text" || type == "qwen3" || type == "qwen3_moe") {
    return ModelFamily::kQwen3VL;
  }
  if (type == "qwen3_5" || type == "qwen3_5_text" || type == "qwen3_5_moe" ||
      type == "qwen3_5_moe_text") {
    return ModelFamily::kQwen35;
  }
  return unimplemented(source + ": model_type '" + type +
                       "' is not supported (qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe, and "
                       "Qwen3 text)");
}

}  // namespace

int64_t Qwen3VLTextConfig::num_linear_layers() const {
  int64_t n = 0;
  for (LayerType t : layer_types) n += t == LayerType::kLinearAttention ? 1 : 0;
  return n;
}

bool Qwen3VLTextConfig::sparse_layer(int64_t l) const {
  if (num_experts <= 0) return false;
  for (int64_t m : mlp_only_layers) {
    if (m == l) return false;
  }
  return (l + 1) % decoder_sparse_step == 0;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return data_loss("cannot read " + path);
  return ss.str();
}

Result<Qwen3VLConfig> parse_qwen3vl_config(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(source + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(source + ": top level must be a JSON object");
  Qwen3VLConfig c;
  auto tc = j.find("text_config");
  const json& text_json = (tc != j.end() && tc->is_object()) ? *tc : j;
  const std::string text_where = source + (&text_json != &j ? ": text_config" : "");
  auto type_of = [](const json& o) {
    auto it = o.find("model_type");
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  c.model_type = type_of(j).empty() ? type_of(text_json) : type_of(j);
  VLM_ASSIGN_OR_RETURN(c.text_config.family, family_of(c.model_type, source));
  const bool hybrid_moe = c.model_type == "qwen3_5_moe" || type_of(text_json) == "qwen3_5_moe_text";
  VLM_RETURN_IF_ERROR(
      parse_text(text_json, text_where, &text_json != &j, hybrid_moe, &c.text_config));
  if (c.text_config.family == ModelFamily::kQwen35) {
    VLM_RETURN_IF_ERROR(parse_hybrid(text_json, text_where, &c.text_config));
  }
  const bool moe = c.model_type == "qwen3_vl_moe" || type_of(text_json) == "qwen3_vl_moe_text";
  // A dense qwen3_5 config's expert fields (if any) mean nothing to its model, as to
  // transformers'.
  if (c.text_config.family != ModelFamily::kQwen35 || hybrid_moe) {
    VLM_RETURN_IF_ERROR(parse_moe(text_json, text_where, moe, hybrid_moe, &c.text_config));
  }
  // A pre-quantized checkpoint's (at the top level, or in text_config where a tool put it).
  for (const json* o : {static_cast<const json*>(&j), &text_json}) {
    auto q = o->find("quantization_config");
    if (q == o->end() || q->is_null() || c.prequant.quantized()) continue;
    VLM_ASSIGN_OR_RETURN(c.prequant, parse_prequant_config(q->dump(), source));
  }
  if (auto vc = j.find("vision_config"); vc != j.end() && vc->is_object()) {
    c.has_vision = true;
    VLM_RETURN_IF_ERROR(parse_vision(*vc, source + ": vision_config", &c.vision_config));
    if (c.vision_config.out_hidden_size != c.text_config.hidden_size) {
      return invalid_argument(source +
                              ": vision_config.out_hidden_size must equal text hidden_size");
    }
  }
  // transformers 4.57 ties the head when the TEXT config says so (get_text_config()), and
  // Qwen3VLConfig / Qwen3VLTextConfig both default to false; published checkpoints write both.
  bool tie = false;
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) tie = *it;
  if (auto it = text_json.find("tie_word_embeddings"); it != text_json.end() && it->is_boolean())
    tie = *it;
  c.tie_word_embeddings = tie;
  VLM_RETURN_IF_ERROR(get_int(j, "image_token_id", &c.image_token_id, false, source));
  VLM_RETURN_IF_ERROR(get_int(j, "video_token_id", &c.video_token_id, false, source));
  VLM_RETURN_IF_ERROR(get_int(j, "vision_start_token_id", &c.vision_start_token_id, false, source));
  VLM_RETURN_IF_ERROR(get_int(j, "vision_end_token_id", &c.vision_end_token_id, false, source));
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (auto it = j.find(key); it != j.end() && it->is_string()) c.torch_dtype = *it;
  }
  VLM_RETURN_IF_ERROR(get_int_list(j, "eos_token_id", &c.eos_token_id, source));
  VLM_RETURN_IF_ERROR(get_int_list(text_json, "eos_token_id", &c.eos_token_id, text_where));
  return c;
}

Result<Qwen3VLConfig> load_qwen3vl_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  VLM_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_qwen3vl_config(text, path);
}

Result<GenerationConfig> parse_generation_config(const std::string& text,
                                                 const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument(source + ": not a valid JSON object");
  GenerationConfig g;
  VLM_RETURN_IF_ERROR(get_int_list(j, "eos_token_id", &g.eos_token_id, source));
  int64_t v = 0;
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null()) {
    VLM_RETURN_IF_ERROR(get_int(j, "bos_token_id", &v, true, source));
    g.bos_token_id = v;
  }
  if (j.contains("pad_token_id") && !j["pad_token_id"].is_null()) {
    VLM_RETURN_IF_ERROR(get_int(j, "pad_token_id", &v, true, source));
    g.pad_token_id = v;
  }
  if (j.contains("max_new_tokens") && !j["max_new_tokens"].is_null()) {
    VLM_RETURN_IF_ERROR(get_int(j, "max_new_tokens", &v, true, source));
    g.max_new_tokens = v;
  }
  if (auto it = j.find("do_sample"); it != j.end() && it->is_boolean()) g.do_sample = *it;
  VLM_RETURN_IF_ERROR(get_double(j, "temperature", &g.temperature, source));
  VLM_RETURN_IF_ERROR(get_int(j, "top_k", &g.top_k, false, source));
  VLM_RETURN_IF_ERROR(get_double(j, "top_p", &g.top_p, source));
  VLM_RETURN_IF_ERROR(get_double(j, "min_p", &g.min_p, source));
  VLM_RETURN_IF_ERROR(get_double(j, "repetition_penalty", &g.repetition_penalty, source));
  return g;
}

Result<GenerationConfig> load_generation_config(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  std::ifstream probe(path);
  if (!probe) return GenerationConfig{};
  VLM_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_generation_config(text, path);
}

}  // namespace vlm
