#include "model/gguf_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "io/gguf_quants.h"

namespace vlm {
namespace {

using json = nlohmann::json;

// The split regexes of the pre-tokenizers vlm knows, by tokenizer.ggml.pre (llama.cpp's names):
// Qwen2/Qwen3's tokenizer.json, and Qwen3.5's (letter runs take combining marks, \p{M}).
struct PreTokenizer {
  const char* name;
  const char* regex;
};
constexpr PreTokenizer kPreTokenizers[] = {
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"qwen35",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
     "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

// GGUF token types (llama.cpp's llama_token_type).
enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5 };

// What keeps the checkpoint's bytes alive: the files' mappings and the dequantized tensors.
struct Holder {
  std::vector<GgufFile> files;
  std::vector<std::vector<float>> buffers;
};

// The tensors under transformers' names, as views into the mapping or into dequantized copies.
class Mapper {
 public:
  explicit Mapper(Holder* h) : h_(h) {}

  // GGUF tensor `gname` of `f` as transformers' `hname`; `shape` is transformers' (outermost
  // first), checked against the file's.
  Status add(const GgufFile& f, const std::string& gname, const std::string& hname,
             const std::vector<int64_t>& shape) {
    VLM_ASSIGN_OR_RETURN(TensorView v, read(f, gname, shape));
    put(hname, v, f.name() + ", GGUF tensor '" + gname + "'");
    return ok_status();
  }

  // A stacked experts tensor [E, rows, cols] as one [rows, cols] tensor per expert:
  // `hname_of(e)`.
  template <typename NameFn>
  Status add_experts(const GgufFile& f, const std::string& gname, NameFn hname_of,
                     const std::vector<int64_t>& shape) {
    VLM_ASSIGN_OR_RETURN(TensorView all, read(f, gname, shape));
    const size_t per = dtype_nbytes(all.dtype, shape[1] * shape[2]);
    for (int64_t e = 0; e < shape[0]; ++e) {
      TensorView one = all;
      one.shape = {shape[1], shape[2]};
      one.data = static_cast<const uint8_t*>(all.data) + static_cast<size_t>(e) * per;
      put(hname_of(e), one, f.name() + ", GGUF tensor '" + gname + "' expert " + std::to_string(e));
    }
    return ok_status();
  }

  // The tensor as f32 in memory of its own (a copy for F32 and BF16).
  Result<const float*> read_f32(const GgufFile& f, const std::string& gname,
                                const std::vector<int64_t>& shape) {
    VLM_ASSIGN_OR_RETURN(const GgufTensor* t, find(f, gname, shape));
    std::vector<float>& out = h_->buffers.emplace_back(static_cast<size_t>(t->numel()));
    VLM_RETURN_IF_ERROR(dequantize(*t, out).with_context(f.name()));
    return out.data();
  }

  std::vector<float>& buffer(size_t n) { return h_->buffers.emplace_back(n); }
  void put(const std::string& hname, const TensorView& v, const std::string& origin) {
    views_[hname] = v;
    origin_[hname] = origin;
  }
  std::map<std::string, TensorView> take_views() { return std::move(views_); }
  std::map<std::string, std::string> take_origin() { return std::move(origin_); }
  std::vector<GgmlType> dequantized_types() const { return {deq_types_.begin(), deq_types_.end()}; }
  uint64_t dequantized_bytes() const { return deq_bytes_; }

 private:
  static Result<const GgufTensor*> find(const GgufFile& f, const std::string& gname,
                                        const std::vector<int64_t>& shape) {
    const GgufTensor* t = f.tensor(gname);
    if (t == nullptr) return not_found(f.name() + ": tensor '" + gname + "' not found");
    std::vector<int64_t> got(t->shape.rbegin(), t->shape.rend());
    if (got != shape) {
      return invalid_argument(f.name() + ": tensor '" + gname + "': expected shape " +
                              shape_to_string(shape) + " (outermost first), got " +
                              shape_to_string(got));
    }
    return t;
  }

  Result<TensorView> read(const GgufFile& f, const std::string& gname,
                          const std::vector<int64_t>& shape) {
    VLM_ASSIGN_OR_RETURN(const GgufTensor* t, find(f, gname, shape));
    TensorView v;
    v.shape = shape;
    if (t->type == GgmlType::kF32 || t->type == GgmlType::kBF16) {
      v.dtype = t->type == GgmlType::kF32 ? DType::kF32 : DType::kBF16;
      v.data = t->data;
      return v;
    }
    std::vector<float>& out = h_->buffers.emplace_back(static_cast<size_t>(t->numel()));
    VLM_RETURN_IF_ERROR(dequantize(*t, out).with_context(f.name()));
    deq_types_.insert(t->type);
    deq_bytes_ += out.size() * sizeof(float);
    v.dtype = DType::kF32;
    v.data = out.data();
    return v;
  }

  Holder* h_;
  std::map<std::string, TensorView> views_;
  std::map<std::string, std::string> origin_;
  std::set<GgmlType> deq_types_;
  uint64_t deq_bytes_ = 0;
};

// An integer key, with the file named when it is missing or of another type.
Result<int64_t> int_key(const GgufFile& f, const std::string& key) {
  auto v = f.get_int(key);
  if (!v.ok()) return v.status().with_context(f.name());
  return *v;
}

Result<double> float_key(const GgufFile& f, const std::string& key) {
  auto v = f.get_float(key);
  if (!v.ok()) return v.status().with_context(f.name());
  return *v;
}

// An array of numbers as int64s (bools as 0/1).
Result<std::vector<int64_t>> int_array(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return not_found(f.name() + ": metadata key '" + key + "' not found");
  if (v->type != GgufType::kArray || v->elem == GgufType::kString || v->elem == GgufType::kArray) {
    return invalid_argument(f.name() + ": metadata key '" + key + "' is not an array of numbers");
  }
  std::vector<int64_t> out;
  for (uint64_t k = 0; k < v->count; ++k) {
    const GgufValue item = v->item(k);
    if (item.type == GgufType::kBool) {
      out.push_back(item.u != 0 ? 1 : 0);
    } else if (auto i = item.as_int()) {
      out.push_back(*i);
    } else {
      return invalid_argument(f.name() + ": metadata key '" + key + "' holds a non-integer");
    }
  }
  return out;
}

Result<std::vector<double>> float_array(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return std::vector<double>{};
  if (v->type != GgufType::kArray ||
      (v->elem != GgufType::kFloat32 && v->elem != GgufType::kFloat64)) {
    return invalid_argument(f.name() + ": metadata key '" + key + "' is not an array of floats");
  }
  std::vector<double> out;
  for (uint64_t k = 0; k < v->count; ++k) out.push_back(v->item(k).f);
  return out;
}

// The text decoder's configuration from `ARCH.*` keys; the vocabulary from token_embd's rows.
Result<Qwen3VLConfig> text_config(const GgufFile& f, const std::string& arch) {
  Qwen3VLConfig cfg;
  Qwen3VLTextConfig& t = cfg.text_config;
  const std::string a = arch + ".";
  cfg.model_type = arch == "qwen3vl" ? "qwen3_vl" : "qwen3_vl_moe";
  VLM_ASSIGN_OR_RETURN(t.hidden_size, int_key(f, a + "embedding_length"));
  VLM_ASSIGN_OR_RETURN(t.num_hidden_layers, int_key(f, a + "block_count"));
  VLM_ASSIGN_OR_RETURN(t.num_attention_heads, int_key(f, a + "attention.head_count"));
  VLM_ASSIGN_OR_RETURN(t.num_key_value_heads, int_key(f, a + "attention.head_count_kv"));
  VLM_ASSIGN_OR_RETURN(t.max_position_embeddings, int_key(f, a + "context_length"));
  VLM_ASSIGN_OR_RETURN(t.rms_norm_eps, float_key(f, a + "attention.layer_norm_rms_epsilon"));
  VLM_ASSIGN_OR_RETURN(t.rope_theta, float_key(f, a + "rope.freq_base"));
  t.head_dim = t.num_attention_heads > 0 ? t.hidden_size / t.num_attention_heads : 0;
  if (f.find(a + "attention.key_length") != nullptr) {
    VLM_ASSIGN_OR_RETURN(t.head_dim, int_key(f, a + "attention.key_length"));
  }
  // rope.dimension_sections: M-RoPE's [t, h, w] sections, then a fourth (0) llama.cpp keeps.
  VLM_ASSIGN_OR_RETURN(std::vector<int64_t> sections, int_array(f, a + "rope.dimension_sections"));
  while (sections.size() > 3 && sections.back() == 0) sections.pop_back();
  t.mrope_section = sections;
  if (arch == "qwen3vl") {
    VLM_ASSIGN_OR_RETURN(t.intermediate_size, int_key(f, a + "feed_forward_length"));
  } else {
    VLM_ASSIGN_OR_RETURN(t.num_experts, int_key(f, a + "expert_count"));
    VLM_ASSIGN_OR_RETURN(t.num_experts_per_tok, int_key(f, a + "expert_used_count"));
    VLM_ASSIGN_OR_RETURN(t.moe_intermediate_size, int_key(f, a + "expert_feed_forward_length"));
    if (f.find(a + "feed_forward_length") != nullptr) {
      VLM_ASSIGN_OR_RETURN(t.intermediate_size, int_key(f, a + "feed_forward_length"));
    }
  }
  const GgufTensor* embd = f.tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) {
    return not_found(f.name() + ": tensor 'token_embd.weight' not found (or not 2-D)");
  }
  t.vocab_size = embd->shape[1];
  cfg.tie_word_embeddings = f.tensor("output.weight") == nullptr;
  return cfg;
}

std::string layer_name(int64_t l, const char* rest) {
  return "blk." + std::to_string(l) + "." + rest;
}

// The text decoder's tensors, as transformers names them.
Status map_text(const GgufFile& f, const Qwen3VLTextConfig& t, bool tied, Mapper* m) {
  const std::string p = "model.language_model.";
  const int64_t H = t.hidden_size, hd = t.head_dim, V = t.vocab_size;
  VLM_RETURN_IF_ERROR(m->add(f, "token_embd.weight", p + "embed_tokens.weight", {V, H}));
  VLM_RETURN_IF_ERROR(m->add(f, "output_norm.weight", p + "norm.weight", {H}));
  if (!tied) VLM_RETURN_IF_ERROR(m->add(f, "output.weight", "lm_head.weight", {V, H}));
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
    const std::string q = p + "layers." + std::to_string(l) + ".";
    struct Entry {
      const char* gguf;
      const char* hf;
      std::vector<int64_t> shape;
    };
    std::vector<Entry> entries = {
        {"attn_norm.weight", "input_layernorm.weight", {H}},
        {"ffn_norm.weight", "post_attention_layernorm.weight", {H}},
        {"attn_q.weight", "self_attn.q_proj.weight", {t.num_attention_heads * hd, H}},
        {"attn_k.weight", "self_attn.k_proj.weight", {t.num_key_value_heads * hd, H}},
        {"attn_v.weight", "self_attn.v_proj.weight", {t.num_key_value_heads * hd, H}},
        {"attn_output.weight", "self_attn.o_proj.weight", {H, t.num_attention_heads * hd}},
        {"attn_q_norm.weight", "self_attn.q_norm.weight", {hd}},
        {"attn_k_norm.weight", "self_attn.k_norm.weight", {hd}},
    };
    if (t.num_experts == 0) {
      const int64_t I = t.intermediate_size;
      entries.push_back({"ffn_gate.weight", "mlp.gate_proj.weight", {I, H}});
      entries.push_back({"ffn_up.weight", "mlp.up_proj.weight", {I, H}});
      entries.push_back({"ffn_down.weight", "mlp.down_proj.weight", {H, I}});
    } else {
      entries.push_back({"ffn_gate_inp.weight", "mlp.gate.weight", {t.num_experts, H}});
    }
    for (const Entry& e : entries) {
      VLM_RETURN_IF_ERROR(m->add(f, layer_name(l, e.gguf), q + e.hf, e.shape));
    }
    if (t.num_experts == 0) continue;
    const int64_t E = t.num_experts, I = t.moe_intermediate_size;
    for (const auto& [g, proj] : {std::pair{"ffn_gate_exps.weight", "gate_proj"},
                                  std::pair{"ffn_up_exps.weight", "up_proj"},
                                  std::pair{"ffn_down_exps.weight", "down_proj"}}) {
      const bool down = std::strcmp(proj, "down_proj") == 0;
      const std::string pr = proj;
      VLM_RETURN_IF_ERROR(m->add_experts(
          f, layer_name(l, g),
          [&](int64_t e) { return q + "mlp.experts." + std::to_string(e) + "." + pr + ".weight"; },
          down ? std::vector<int64_t>{E, H, I} : std::vector<int64_t>{E, I, H}));
    }
  }
  return ok_status();
}

// The vision file's configuration (clip.vision.*) into cfg.vision_config.
Status vision_config(const GgufFile& v, Qwen3VLConfig* cfg) {
  auto proj = v.get_string("clip.projector_type");
  if (!proj.ok()) return proj.status().with_context(v.name());
  if (*proj != "qwen3vl_merger") {
    return invalid_argument(v.name() + ": projector type '" + std::string(*proj) +
                            "' is not Qwen3-VL's (qwen3vl_merger)");
  }
  Qwen3VLVisionConfig& c = cfg->vision_config;
  VLM_ASSIGN_OR_RETURN(c.depth, int_key(v, "clip.vision.block_count"));
  VLM_ASSIGN_OR_RETURN(c.hidden_size, int_key(v, "clip.vision.embedding_length"));
  VLM_ASSIGN_OR_RETURN(c.num_heads, int_key(v, "clip.vision.attention.head_count"));
  VLM_ASSIGN_OR_RETURN(c.intermediate_size, int_key(v, "clip.vision.feed_forward_length"));
  VLM_ASSIGN_OR_RETURN(c.patch_size, int_key(v, "clip.vision.patch_size"));
  VLM_ASSIGN_OR_RETURN(c.spatial_merge_size, int_key(v, "clip.vision.spatial_merge_size"));
  VLM_ASSIGN_OR_RETURN(c.out_hidden_size, int_key(v, "clip.vision.projection_dim"));
  c.temporal_patch_size = 2;  // the converter splits the Conv3D's two frames into two tensors
  const GgufTensor* pos = v.tensor("v.position_embd.weight");
  if (pos == nullptr || pos->shape.size() != 2) {
    return not_found(v.name() + ": tensor 'v.position_embd.weight' not found (or not 2-D)");
  }
  c.num_position_embeddings = pos->shape[1];
  const GgufTensor* patch = v.tensor("v.patch_embd.weight");
  if (patch == nullptr || patch->shape.size() != 4) {
    return not_found(v.name() + ": tensor 'v.patch_embd.weight' not found (or not 4-D)");
  }
  c.in_channels = patch->shape[2];
  c.deepstack_visual_indexes.clear();
  if (v.find("clip.vision.is_deepstack_layers") != nullptr) {
    VLM_ASSIGN_OR_RETURN(std::vector<int64_t> ds, int_array(v, "clip.vision.is_deepstack_layers"));
    for (size_t l = 0; l < ds.size(); ++l) {
      if (ds[l] != 0) c.deepstack_visual_indexes.push_back(static_cast<int64_t>(l));
    }
  }
  cfg->has_vision = true;
  return ok_status();
}

// The vision tower's tensors, as transformers names them.
Status map_vision(const GgufFile& v, const Qwen3VLVisionConfig& c, Mapper* m) {
  const std::string p = "model.visual.";
  const int64_t h = c.hidden_size, I = c.intermediate_size, P = c.patch_size, C = c.in_channels,
                merged = h * c.spatial_merge_size * c.spatial_merge_size;
  // The Conv3D [h, C, 2, P, P] from its two frames' [h, C, P, P] halves.
  VLM_ASSIGN_OR_RETURN(const float* f0, m->read_f32(v, "v.patch_embd.weight", {h, C, P, P}));
  VLM_ASSIGN_OR_RETURN(const float* f1, m->read_f32(v, "v.patch_embd.weight.1", {h, C, P, P}));
  std::vector<float>& conv = m->buffer(static_cast<size_t>(h * C * 2 * P * P));
  const size_t plane = static_cast<size_t>(P * P);
  for (int64_t oc = 0; oc < h * C; ++oc) {
    std::memcpy(&conv[(2 * oc) * plane], f0 + oc * plane, plane * sizeof(float));
    std::memcpy(&conv[(2 * oc + 1) * plane], f1 + oc * plane, plane * sizeof(float));
  }
  TensorView cv;
  cv.dtype = DType::kF32;
  cv.shape = {h, C, 2, P, P};
  cv.data = conv.data();
  m->put(p + "patch_embed.proj.weight", cv,
         v.name() + ", GGUF tensors 'v.patch_embd.weight' and 'v.patch_embd.weight.1'");
  VLM_RETURN_IF_ERROR(m->add(v, "v.patch_embd.bias", p + "patch_embed.proj.bias", {h}));
  VLM_RETURN_IF_ERROR(
      m->add(v, "v.position_embd.weight", p + "pos_embed.weight", {c.num_position_embeddings, h}));
  struct Entry {
    const char* gguf;
    const char* hf;
    std::vector<int64_t> shape;
  };
  const std::vector<Entry> block = {
      {"attn_qkv.weight", "attn.qkv.weight", {3 * h, h}},
      {"attn_qkv.bias", "attn.qkv.bias", {3 * h}},
      {"attn_out.weight", "attn.proj.weight", {h, h}},
      {"attn_out.bias", "attn.proj.bias", {h}},
      {"ln1.weight", "norm1.weight", {h}},
      {"ln1.bias", "norm1.bias", {h}},
      {"ln2.weight", "norm2.weight", {h}},
      {"ln2.bias", "norm2.bias", {h}},
      {"ffn_up.weight", "mlp.linear_fc1.weight", {I, h}},
      {"ffn_up.bias", "mlp.linear_fc1.bias", {I}},
      {"ffn_down.weight", "mlp.linear_fc2.weight", {h, I}},
      {"ffn_down.bias", "mlp.linear_fc2.bias", {h}},
  };
  for (int64_t l = 0; l < c.depth; ++l) {
    for (const Entry& e : block) {
      VLM_RETURN_IF_ERROR(m->add(v, "v.blk." + std::to_string(l) + "." + e.gguf,
                                 p + "blocks." + std::to_string(l) + "." + e.hf, e.shape));
    }
  }
  const int64_t out = c.out_hidden_size;
  // The merger (its norm over each patch's h features) and each DeepStack merger (its norm over
  // the merged 4h), the latter numbered in the file by the vision layer it taps.
  const std::vector<Entry> merger = {
      {"v.post_ln.weight", "merger.norm.weight", {h}},
      {"v.post_ln.bias", "merger.norm.bias", {h}},
      {"mm.0.weight", "merger.linear_fc1.weight", {merged, merged}},
      {"mm.0.bias", "merger.linear_fc1.bias", {merged}},
      {"mm.2.weight", "merger.linear_fc2.weight", {out, merged}},
      {"mm.2.bias", "merger.linear_fc2.bias", {out}},
  };
  for (const Entry& e : merger) VLM_RETURN_IF_ERROR(m->add(v, e.gguf, p + e.hf, e.shape));
  const std::vector<Entry> deepstack = {
      {"norm.weight", "norm.weight", {merged}},
      {"norm.bias", "norm.bias", {merged}},
      {"fc1.weight", "linear_fc1.weight", {merged, merged}},
      {"fc1.bias", "linear_fc1.bias", {merged}},
      {"fc2.weight", "linear_fc2.weight", {out, merged}},
      {"fc2.bias", "linear_fc2.bias", {out}},
  };
  for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k) {
    const std::string g = "v.deepstack." + std::to_string(c.deepstack_visual_indexes[k]) + ".";
    const std::string hf = p + "deepstack_merger_list." + std::to_string(k) + ".";
    for (const Entry& e : deepstack) {
      VLM_RETURN_IF_ERROR(m->add(v, g + e.gguf, hf + e.hf, e.shape));
    }
  }
  return ok_status();
}

// The id of a token by its text, if the vocabulary has it.
std::optional<int64_t> token_id(const GgufFile& f, std::string_view text) {
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr) return std::nullopt;
  for (size_t i = 0; i < tokens->strings.size(); ++i) {
    if (tokens->strings[i] == text) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

// The special tokens' ids (the vision placeholders by their text, as Qwen's tokenizer names
// them; the end of a turn and of text) and the tokenizer's own.
Status special_ids(const GgufFile& f, GgufCheckpoint* ck) {
  Qwen3VLConfig& cfg = ck->cfg;
  const std::pair<const char*, int64_t*> vision[] = {
      {"<|image_pad|>", &cfg.image_token_id},
      {"<|video_pad|>", &cfg.video_token_id},
      {"<|vision_start|>", &cfg.vision_start_token_id},
      {"<|vision_end|>", &cfg.vision_end_token_id},
  };
  for (const auto& [text, id] : vision) {
    auto found = token_id(f, text);
    if (found) {
      *id = *found;
    } else if (cfg.has_vision) {
      return not_found(f.name() + ": the vocabulary has no " + text +
                       " token, which images and video need");
    }
  }
  const auto tokens = f.find("tokenizer.ggml.tokens");
  auto text_of = [&](int64_t id) {
    return tokens != nullptr && id >= 0 && static_cast<size_t>(id) < tokens->strings.size()
               ? std::string(tokens->strings[static_cast<size_t>(id)])
               : std::string();
  };
  if (auto eos = f.get_int("tokenizer.ggml.eos_token_id"); eos.ok()) {
    ck->eos_id = static_cast<int32_t>(*eos);
    ck->eos_token = text_of(*eos);
    cfg.eos_token_id.push_back(*eos);
  }
  if (auto pad = f.get_int("tokenizer.ggml.padding_token_id"); pad.ok()) {
    ck->pad_id = static_cast<int32_t>(*pad);
  }
  if (auto bos = f.get_int("tokenizer.ggml.bos_token_id"); bos.ok()) ck->bos_token = text_of(*bos);
  // A chat turn ends at <|im_end|> and text at <|endoftext|>, whichever the file calls eos.
  for (const char* text : {"<|im_end|>", "<|endoftext|>"}) {
    auto id = token_id(f, text);
    if (id && std::find(cfg.eos_token_id.begin(), cfg.eos_token_id.end(), *id) ==
                  cfg.eos_token_id.end()) {
      cfg.eos_token_id.push_back(*id);
    }
  }
  return ok_status();
}

uint64_t file_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return in ? static_cast<uint64_t>(in.tellg()) : 0;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

Result<std::string> gguf_tokenizer_json(const GgufFile& f) {
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.status().with_context(f.name());
  if (*model != "gpt2") {
    return invalid_argument(f.name() + ": tokenizer.ggml.model '" + std::string(*model) +
                            "' is not the byte-level BPE (gpt2) of Qwen's models");
  }
  auto pre = f.get_string("tokenizer.ggml.pre");
  if (!pre.ok()) return pre.status().with_context(f.name());
  const PreTokenizer* split = nullptr;
  for (const PreTokenizer& p : kPreTokenizers) {
    if (*pre == p.name) split = &p;
  }
  if (split == nullptr) {
    return invalid_argument(f.name() + ": tokenizer.ggml.pre '" + std::string(*pre) +
                            "' is not a pre-tokenizer vlm knows (qwen2, qwen35)");
  }
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  const GgufValue* merges = f.find("tokenizer.ggml.merges");
  if (tokens == nullptr || tokens->elem != GgufType::kString || merges == nullptr ||
      merges->elem != GgufType::kString) {
    return not_found(f.name() +
                     ": tokenizer.ggml.tokens and tokenizer.ggml.merges (arrays of "
                     "strings) are needed");
  }
  VLM_ASSIGN_OR_RETURN(std::vector<int64_t> types, int_array(f, "tokenizer.ggml.token_type"));
  if (types.size() != tokens->strings.size()) {
    return invalid_argument(f.name() + ": tokenizer.ggml.token_type has " +
                            std::to_string(types.size()) + " entries for " +
                            std::to_string(tokens->strings.size()) + " tokens");
  }
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string text(tokens->strings[i]);
    if (types[i] == kUnused) continue;  // the converter's [PAD<i>] rows past the vocabulary
    if (types[i] == kControl || types[i] == kUserDefined) {
      added.push_back({{"id", i},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[i] == kControl}});
    }
    vocab[text] = i;
  }
  json merge_list = json::array();
  for (std::string_view m : merges->strings) merge_list.push_back(std::string(m));
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  json doc = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", split->regex}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       byte_level})}}},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
  return doc.dump();
}

Result<GgufCheckpoint> open_gguf_checkpoint(const std::string& model_path,
                                            const std::string& mmproj_path) {
  auto hold = std::make_shared<Holder>();
  hold->files.reserve(2);  // `f` below stays valid while the vision file joins it
  VLM_ASSIGN_OR_RETURN(GgufFile model, GgufFile::open(model_path));
  hold->files.push_back(std::move(model));
  const GgufFile& f = hold->files.back();
  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return arch.status().with_context(f.name());
  if (*arch != "qwen3vl" && *arch != "qwen3vlmoe") {
    return invalid_argument(f.name() + ": architecture '" + std::string(*arch) +
                            "' is not one vlm runs from GGUF (qwen3vl, qwen3vlmoe)");
  }
  if (auto type = f.get_string("general.type"); type.ok() && *type == "mmproj") {
    return invalid_argument(f.name() + " is a vision (mmproj) file: give it as --mmproj");
  }
  GgufCheckpoint ck;
  VLM_ASSIGN_OR_RETURN(ck.cfg, text_config(f, std::string(*arch)));
  ck.file_bytes = file_size(model_path);
  Mapper m(hold.get());
  VLM_RETURN_IF_ERROR(map_text(f, ck.cfg.text_config, ck.cfg.tie_word_embeddings, &m));
  if (!mmproj_path.empty()) {
    VLM_ASSIGN_OR_RETURN(GgufFile vis, GgufFile::open(mmproj_path));
    hold->files.push_back(std::move(vis));
    const GgufFile& v = hold->files.back();
    VLM_RETURN_IF_ERROR(vision_config(v, &ck.cfg));
    if (ck.cfg.vision_config.out_hidden_size != ck.cfg.text_config.hidden_size) {
      return invalid_argument(v.name() + ": its projection width " +
                              std::to_string(ck.cfg.vision_config.out_hidden_size) +
                              " is not the text model's hidden size " +
                              std::to_string(ck.cfg.text_config.hidden_size) +
                              " (a vision file of another model?)");
    }
    VLM_RETURN_IF_ERROR(map_vision(v, ck.cfg.vision_config, &m));
    VLM_ASSIGN_OR_RETURN(ck.image_mean, float_array(v, "clip.vision.image_mean"));
    VLM_ASSIGN_OR_RETURN(ck.image_std, float_array(v, "clip.vision.image_std"));
    ck.file_bytes += file_size(mmproj_path);
  }
  VLM_RETURN_IF_ERROR(special_ids(f, &ck));
  if (f.find("tokenizer.ggml.tokens") != nullptr) {
    VLM_ASSIGN_OR_RETURN(ck.tokenizer_json, gguf_tokenizer_json(f));
  }
  if (auto tpl = f.get_string("tokenizer.chat_template"); tpl.ok()) {
    ck.chat_template = std::string(*tpl);
  }
  if (!m.dequantized_types().empty()) {
    std::string types;
    for (GgmlType t : m.dequantized_types()) {
      types += (types.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    }
    ck.notes.push_back("GGUF tensors of type " + types + " dequantized to f32 at load (" +
                       std::to_string(m.dequantized_bytes() >> 20) + " MiB)");
  }
  ck.dequantized_bytes = m.dequantized_bytes();
  ck.store = std::make_unique<WeightStore>(WeightStore::from_views(
      model_path, m.take_views(), m.take_origin(), std::shared_ptr<const void>(hold, hold.get())));
  return ck;
}

}  // namespace vlm
