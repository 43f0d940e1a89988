#include "model/gguf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "core/half.h"
#include "io/gguf_quants.h"
#include "vlm/progress.h"

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
enum TokenType : int64_t { kControl = 3, kUserDefined = 4, kUnused = 5 };

// What keeps the checkpoint's bytes alive: the files' mappings and the dequantized tensors.
struct Holder {
  std::vector<GgufFile> files;
  std::vector<std::vector<float>> buffers;
  std::vector<std::vector<uint16_t>> bf16_buffers;  // and Q4_0's scales
  std::vector<std::vector<uint8_t>> byte_buffers;   // Q4_0's nibbles
};

// The tensors under transformers' names, as views into the mapping or into dequantized copies.
class Mapper {
 public:
  // `exact`: every type but F32 and BF16 dequantized to f32; else to BF16 (rounded to nearest
  // even from the exact f32 values).
  Mapper(Holder* h, bool exact) : h_(h), exact_(exact) {}

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

  // The tensor as f32 in memory of its own (a copy for F32 and BF16), for the caller to undo
  // what the converter did to it and then put().
  Result<float*> read_f32(const GgufFile& f, const std::string& gname,
                          const std::vector<int64_t>& shape) {
    VLM_ASSIGN_OR_RETURN(const GgufTensor* t, find(f, gname, shape));
    return own_f32(f, *t);
  }

  std::vector<float>& buffer(size_t n) { return h_->buffers.emplace_back(n); }
  void put(const std::string& hname, const TensorView& v, const std::string& origin) {
    views_[hname] = v;
    origin_[hname] = origin;
  }
  // An f32 tensor this mapper made (read_f32, buffer).
  void put_f32(const std::string& hname, const float* data, const std::vector<int64_t>& shape,
               const std::string& origin) {
    TensorView v;
    v.dtype = DType::kF32;
    v.shape = shape;
    v.data = data;
    put(hname, v, origin);
  }
  std::map<std::string, TensorView> take_views() { return std::move(views_); }
  std::map<std::string, std::string> take_origin() { return std::move(origin_); }
  std::vector<GgmlType> dequantized_types() const { return {deq_types_.begin(), deq_types_.end()}; }
  uint64_t dequantized_bytes() const { return deq_bytes_; }
  std::vector<GgmlType> native_types() const {
    return {native_types_.begin(), native_types_.end()};
  }
  uint64_t native_bytes() const { return native_bytes_; }
  uint64_t repacked_bytes() const { return repacked_bytes_; }  // Q4_0 as kI4
  // Whether add() keeps the 2-D matrices of a block type the kernels multiply (Q8_0, Q4_K, Q5_K,
  // Q6_K) as stored (the text decoder's; without --precision f32) rather than dequantized.
  bool keep_blocks = false;

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

  // Tensor t decoded to f32 in a buffer the checkpoint keeps.
  Result<float*> own_f32(const GgufFile& f, const GgufTensor& t) {
    std::vector<float>& out = h_->buffers.emplace_back(static_cast<size_t>(t.numel()));
    VLM_RETURN_IF_ERROR(dequantize(t, out).with_context(f.name()));
    if (t.type != GgmlType::kF32 && t.type != GgmlType::kBF16) deq_types_.insert(t.type);
    deq_bytes_ += out.size() * sizeof(float);
    return out.data();
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
    if (const DType block = native_type(t->type);
        keep_blocks && !exact_ && shape.size() >= 2 && block != DType::kF32) {
      v.dtype = block;  // the blocks as stored, multiplied by the block kernels
      v.data = t->data;
      native_types_.insert(t->type);
      native_bytes_ += t->nbytes;
      return v;
    }
    if (t->type == GgmlType::kQ4_0 && keep_blocks && !exact_ && shape.size() == 2) {
      return repack_q4_0(f, *t, shape);
    }
    if (exact_) {
      VLM_ASSIGN_OR_RETURN(const float* out, own_f32(f, *t));
      v.dtype = DType::kF32;
      v.data = out;
      return v;
    }
    deq_types_.insert(t->type);
    scratch_.resize(static_cast<size_t>(t->numel()));
    VLM_RETURN_IF_ERROR(dequantize(*t, scratch_).with_context(f.name()));
    std::vector<uint16_t>& out = h_->bf16_buffers.emplace_back(scratch_.size());
    for (size_t i = 0; i < scratch_.size(); ++i) out[i] = f32_to_bf16(scratch_[i]);
    deq_bytes_ += out.size() * sizeof(uint16_t);
    v.dtype = DType::kBF16;
    v.data = out.data();
    return v;
  }

  // A Q4_0 matrix as a kI4 one (core/tensor.h), bit for bit: a block's f16 d becomes its group
  // scale and its 16 bytes of nibbles (q + 8, element j low and j + 16 high: kI4's layout) flip
  // to two's complement (x ^ 0x88). The same bytes as the file's; its pages are released.
  TensorView repack_q4_0(const GgufFile& f, const GgufTensor& t,
                         const std::vector<int64_t>& shape) {
    const int64_t blocks = t.numel() / 32;
    const auto* src = static_cast<const uint8_t*>(t.data);
    std::vector<uint8_t>& q = h_->byte_buffers.emplace_back(static_cast<size_t>(blocks * 16));
    std::vector<uint16_t>& d = h_->bf16_buffers.emplace_back(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      std::memcpy(&d[b], src + 18 * b, 2);
      for (int j = 0; j < 16; ++j) q[16 * b + j] = src[18 * b + 2 + j] ^ 0x88;
    }
    if (f.mapping() != nullptr) f.mapping()->release_pages(t.data, t.nbytes);
    repacked_bytes_ += q.size() + 2 * d.size();
    TensorView v;
    v.dtype = DType::kI4;
    v.shape = shape;
    v.data = q.data();
    v.int4.scale = d.data();
    v.int4.group = 32;
    return v;
  }

  // The DType of a GGUF block type the kernels multiply as stored; kF32 for the others.
  static DType native_type(GgmlType t) {
    switch (t) {
      case GgmlType::kQ8_0:
        return DType::kQ8_0;
      case GgmlType::kQ4_K:
        return DType::kQ4K;
      case GgmlType::kQ5_K:
        return DType::kQ5K;
      case GgmlType::kQ6_K:
        return DType::kQ6K;
      default:
        return DType::kF32;
    }
  }

  Holder* h_;
  bool exact_;
  std::vector<float> scratch_;  // one tensor's f32 values on their way to BF16
  std::map<std::string, TensorView> views_;
  std::map<std::string, std::string> origin_;
  std::set<GgmlType> deq_types_, native_types_;
  uint64_t deq_bytes_ = 0, native_bytes_ = 0, repacked_bytes_ = 0;
};

// A key's value (the errors, from GgufFile, name the file and the key).
Result<int64_t> int_key(const GgufFile& f, const std::string& key) { return f.get_int(key); }

Result<double> float_key(const GgufFile& f, const std::string& key) { return f.get_float(key); }

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

// The architectures vlm reads from GGUF: llama.cpp's name, transformers' model_type.
struct Arch {
  const char* gguf;
  const char* model_type;
  bool moe;
  bool hybrid;  // Qwen3.5: Gated DeltaNet and gated attention layers
};
constexpr Arch kArchs[] = {
    {"qwen3vl", "qwen3_vl", false, false},
    {"qwen3vlmoe", "qwen3_vl_moe", true, false},
    {"qwen35", "qwen3_5", false, true},
    {"qwen35moe", "qwen3_5_moe", true, true},
};

// Qwen3.5's Gated DeltaNet geometry (ssm.*: state_size is the key head dim, group_count the key
// heads, time_step_rank the value heads, inner_size their width) and each layer's kind.
Status hybrid_config_json(const GgufFile& f, const std::string& a, json* t) {
  VLM_ASSIGN_OR_RETURN(int64_t kernel, int_key(f, a + "ssm.conv_kernel"));
  VLM_ASSIGN_OR_RETURN(int64_t dk, int_key(f, a + "ssm.state_size"));
  VLM_ASSIGN_OR_RETURN(int64_t nk, int_key(f, a + "ssm.group_count"));
  VLM_ASSIGN_OR_RETURN(int64_t nv, int_key(f, a + "ssm.time_step_rank"));
  VLM_ASSIGN_OR_RETURN(int64_t inner, int_key(f, a + "ssm.inner_size"));
  if (nv <= 0 || inner <= 0 || inner % nv != 0) {
    return invalid_argument(f.name() + ": " + a + "ssm.inner_size must be a positive multiple of " +
                            a + "ssm.time_step_rank (the value heads)");
  }
  (*t)["linear_conv_kernel_dim"] = kernel;
  (*t)["linear_key_head_dim"] = dk;
  (*t)["linear_num_key_heads"] = nk;
  (*t)["linear_num_value_heads"] = nv;
  (*t)["linear_value_head_dim"] = inner / nv;
  json types = json::array();
  const auto L = (*t)["num_hidden_layers"].get<int64_t>();
  for (int64_t l = 0; l < L && l < (int64_t{1} << 20); ++l) {
    const bool linear = f.tensor("blk." + std::to_string(l) + ".ssm_a") != nullptr;
    types.push_back(linear ? "linear_attention" : "full_attention");
  }
  (*t)["layer_types"] = types;
  return ok_status();
}

// The text config.json transformers would hold for the file, from its `ARCH.*` keys (the
// vocabulary from token_embd's rows; a Qwen3.5 layer's kind from its tensors: Gated DeltaNet
// where it has ssm_a).
Result<json> text_config_json(const GgufFile& f, const Arch& arch) {
  const std::string a = std::string(arch.gguf) + ".";
  json t = {{"model_type", std::string(arch.model_type) + "_text"}, {"hidden_act", "silu"}};
  for (const auto& [hf, key] : {std::pair{"hidden_size", "embedding_length"},
                                std::pair{"num_attention_heads", "attention.head_count"},
                                std::pair{"num_key_value_heads", "attention.head_count_kv"},
                                std::pair{"max_position_embeddings", "context_length"}}) {
    VLM_ASSIGN_OR_RETURN(t[hf], int_key(f, a + key));
  }
  VLM_ASSIGN_OR_RETURN(int64_t blocks, int_key(f, a + "block_count"));
  int64_t nextn = 0;
  if (f.find(a + "nextn_predict_layers") != nullptr) {
    VLM_ASSIGN_OR_RETURN(nextn, int_key(f, a + "nextn_predict_layers"));
  }
  if (blocks <= 0 || nextn < 0 || nextn >= blocks) {
    return invalid_argument(f.name() + ": " + a + "block_count (" + std::to_string(blocks) +
                            ") must exceed " + a + "nextn_predict_layers (" +
                            std::to_string(nextn) + "), which must not be negative");
  }
  t["num_hidden_layers"] = blocks - nextn;
  if (f.find(a + "attention.key_length") != nullptr) {
    VLM_ASSIGN_OR_RETURN(t["head_dim"], int_key(f, a + "attention.key_length"));
  } else {
    t["head_dim"] =
        t["hidden_size"].get<int64_t>() / std::max<int64_t>(1, t["num_attention_heads"]);
  }
  VLM_ASSIGN_OR_RETURN(t["rms_norm_eps"], float_key(f, a + "attention.layer_norm_rms_epsilon"));
  const GgufTensor* embd = f.tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) {
    return not_found(f.name() + ": tensor 'token_embd.weight' not found (or not 2-D)");
  }
  t["vocab_size"] = embd->shape[1];
  t["tie_word_embeddings"] = f.tensor("output.weight") == nullptr;
  // rope.dimension_sections: M-RoPE's [t, h, w] sections, then a fourth (0) llama.cpp keeps.
  VLM_ASSIGN_OR_RETURN(std::vector<int64_t> sections, int_array(f, a + "rope.dimension_sections"));
  while (sections.size() > 3 && sections.back() == 0) sections.pop_back();
  VLM_ASSIGN_OR_RETURN(double theta, float_key(f, a + "rope.freq_base"));
  json rope = {{"rope_type", "default"}, {"mrope_section", sections}, {"mrope_interleaved", true}};
  if (arch.hybrid) {
    const auto head_dim = t["head_dim"].get<int64_t>();
    int64_t rotary = head_dim / 4;
    if (f.find(a + "rope.dimension_count") != nullptr) {
      VLM_ASSIGN_OR_RETURN(rotary, int_key(f, a + "rope.dimension_count"));
    }
    rope["rope_theta"] = theta;
    rope["partial_rotary_factor"] =
        static_cast<double>(rotary) / static_cast<double>(std::max<int64_t>(1, head_dim));
    t["rope_parameters"] = rope;
  } else {
    t["rope_theta"] = theta;
    t["rope_scaling"] = rope;
  }
  if (!arch.moe) {
    VLM_ASSIGN_OR_RETURN(t["intermediate_size"], int_key(f, a + "feed_forward_length"));
  } else {
    VLM_ASSIGN_OR_RETURN(t["num_experts"], int_key(f, a + "expert_count"));
    VLM_ASSIGN_OR_RETURN(t["num_experts_per_tok"], int_key(f, a + "expert_used_count"));
    VLM_ASSIGN_OR_RETURN(t["moe_intermediate_size"], int_key(f, a + "expert_feed_forward_length"));
    if (arch.hybrid) {
      VLM_ASSIGN_OR_RETURN(t["shared_expert_intermediate_size"],
                           int_key(f, a + "expert_shared_feed_forward_length"));
    } else {
      // Every layer's MLP is the sparse block; a dense one's width, when the file gives it.
      t["intermediate_size"] = 0;
      if (f.find(a + "feed_forward_length") != nullptr) {
        VLM_ASSIGN_OR_RETURN(t["intermediate_size"], int_key(f, a + "feed_forward_length"));
      }
      t["norm_topk_prob"] = true;
    }
  }
  if (arch.hybrid) {
    VLM_RETURN_IF_ERROR(hybrid_config_json(f, a, &t));
    t["mtp_num_hidden_layers"] = nextn;
  }
  return t;
}

// The vision config.json from the vision file's clip.vision.* keys (its patch and position
// tables' shapes from the tensors).
Result<json> vision_config_json(const GgufFile& v) {
  auto proj = v.get_string("clip.projector_type");
  if (!proj.ok()) return proj.status();
  if (*proj != "qwen3vl_merger") {
    return invalid_argument(v.name() + ": projector type '" + std::string(*proj) +
                            "' is not Qwen3-VL's (qwen3vl_merger)");
  }
  json c = {{"hidden_act", "gelu_pytorch_tanh"}, {"temporal_patch_size", 2}};
  for (const auto& [hf, key] :
       {std::pair{"depth", "block_count"}, std::pair{"hidden_size", "embedding_length"},
        std::pair{"num_heads", "attention.head_count"},
        std::pair{"intermediate_size", "feed_forward_length"},
        std::pair{"patch_size", "patch_size"},
        std::pair{"spatial_merge_size", "spatial_merge_size"},
        std::pair{"out_hidden_size", "projection_dim"}}) {
    VLM_ASSIGN_OR_RETURN(c[hf], int_key(v, std::string("clip.vision.") + key));
  }
  const GgufTensor* pos = v.tensor("v.position_embd.weight");
  const GgufTensor* patch = v.tensor("v.patch_embd.weight");
  if (pos == nullptr || pos->shape.size() != 2 || patch == nullptr || patch->shape.size() != 4) {
    return not_found(v.name() +
                     ": tensors 'v.position_embd.weight' (2-D) and 'v.patch_embd.weight' (4-D) "
                     "are needed");
  }
  c["num_position_embeddings"] = pos->shape[1];
  c["in_channels"] = patch->shape[2];
  std::vector<int64_t> deepstack;
  if (v.find("clip.vision.is_deepstack_layers") != nullptr) {
    VLM_ASSIGN_OR_RETURN(std::vector<int64_t> ds, int_array(v, "clip.vision.is_deepstack_layers"));
    for (size_t l = 0; l < ds.size(); ++l) {
      if (ds[l] != 0) deepstack.push_back(static_cast<int64_t>(l));
    }
  }
  c["deepstack_visual_indexes"] = deepstack;
  return c;
}

// The configuration, checked as a config.json is (parse_qwen3vl_config).
Result<Qwen3VLConfig> gguf_config(const GgufFile& f, const Arch& arch, const GgufFile* vis) {
  json j = {{"model_type", arch.model_type}};
  VLM_ASSIGN_OR_RETURN(j["text_config"], text_config_json(f, arch));
  j["tie_word_embeddings"] = j["text_config"]["tie_word_embeddings"];
  if (vis != nullptr) {
    VLM_ASSIGN_OR_RETURN(j["vision_config"], vision_config_json(*vis));
  }
  const std::string where = f.name() + (vis != nullptr ? " and " + vis->name() : std::string()) +
                            " (metadata, read as transformers' config.json)";
  return parse_qwen3vl_config(j.dump(), where);
}

// A norm weight: Qwen3.5's (1 + w) norms are stored as 1 + w (the converter adds 1).
Status add_norm(Mapper* m, const GgufFile& f, const std::string& g, const std::string& h, int64_t n,
                bool zero_centered) {
  if (!zero_centered) return m->add(f, g, h, {n});
  VLM_ASSIGN_OR_RETURN(float* w, m->read_f32(f, g, {n}));
  for (int64_t i = 0; i < n; ++i) w[i] -= 1.0f;
  m->put_f32(h, w, {n}, f.name() + ", GGUF tensor '" + g + "' less 1");
  return ok_status();
}

// A Gated DeltaNet layer (`g`: "blk.N.", `q`: "...layers.N.linear_attn."): what the converter did
// undone (A_log stored as -exp(A_log), the conv1d's middle dimension dropped). The converter also
// orders the value heads by repeat, then key head (transformers' head g * r + j, r = value heads
// per key head, is stored as j * nk + g) in every tensor that has them: they stay so, the layer
// runs in that order (Qwen3VLTextConfig::linear_value_heads_tiled), and its matrices stay as
// stored.
Status map_linear(const GgufFile& f, const Qwen3VLTextConfig& t, const std::string& g,
                  const std::string& q, Mapper* m) {
  const int64_t H = t.hidden_size, nv = t.linear_num_value_heads, dv = t.linear_value_head_dim,
                K = t.linear_conv_kernel_dim, C = t.linear_conv_dim();
  const std::string from = f.name() + ", GGUF tensor '" + g;
  VLM_ASSIGN_OR_RETURN(float* a, m->read_f32(f, g + "ssm_a", {nv}));
  for (int64_t i = 0; i < nv; ++i) {
    // The converter stored -exp(A_log): negative and finite in any file it wrote.
    if (!(a[i] < 0) || !std::isfinite(a[i])) {
      return invalid_argument(from + "ssm_a' holds " + std::to_string(a[i]) +
                              ", not a negative -exp(A_log)");
    }
    a[i] = std::log(-a[i]);
  }
  m->put_f32(q + "A_log", a, {nv}, from + "ssm_a' as log(-a)");
  VLM_ASSIGN_OR_RETURN(float* dt, m->read_f32(f, g + "ssm_dt.bias", {nv}));
  m->put_f32(q + "dt_bias", dt, {nv}, from + "ssm_dt.bias'");
  VLM_ASSIGN_OR_RETURN(float* conv, m->read_f32(f, g + "ssm_conv1d.weight", {C, K}));
  m->put_f32(q + "conv1d.weight", conv, {C, 1, K}, from + "ssm_conv1d.weight'");
  for (const auto& [gn, hn, rows, cols] :
       {std::tuple{"ssm_alpha.weight", "in_proj_a.weight", nv, H},
        std::tuple{"ssm_beta.weight", "in_proj_b.weight", nv, H},
        std::tuple{"attn_qkv.weight", "in_proj_qkv.weight", C, H},
        std::tuple{"attn_gate.weight", "in_proj_z.weight", nv * dv, H},
        std::tuple{"ssm_out.weight", "out_proj.weight", H, nv * dv}}) {
    VLM_RETURN_IF_ERROR(m->add(f, g + gn, q + hn, {rows, cols}));
  }
  return m->add(f, g + "ssm_norm.weight", q + "norm.weight", {dv});
}

// A gated or plain attention layer's tensors (`g`: "blk.N.", `q`: "...layers.N.").
Status map_attention(const GgufFile& f, const Qwen3VLTextConfig& t, const std::string& g,
                     const std::string& q, Mapper* m) {
  const int64_t H = t.hidden_size, hd = t.head_dim, kv = t.num_key_value_heads * hd;
  for (const auto& [gn, hn, rows, cols] :
       {std::tuple{"attn_q.weight", "q_proj", t.q_proj_rows(), H},
        std::tuple{"attn_k.weight", "k_proj", kv, H}, std::tuple{"attn_v.weight", "v_proj", kv, H},
        std::tuple{"attn_output.weight", "o_proj", H, t.num_attention_heads * hd}}) {
    VLM_RETURN_IF_ERROR(m->add(f, g + gn, q + "self_attn." + hn + ".weight", {rows, cols}));
  }
  VLM_RETURN_IF_ERROR(add_norm(m, f, g + "attn_q_norm.weight", q + "self_attn.q_norm.weight", hd,
                               t.zero_centered_norms));
  return add_norm(m, f, g + "attn_k_norm.weight", q + "self_attn.k_norm.weight", hd,
                  t.zero_centered_norms);
}

// A layer's MLP: dense, or the router, the stacked experts and (Qwen3.5) the shared expert.
Status map_mlp(const GgufFile& f, const Qwen3VLTextConfig& t, bool sparse, const std::string& g,
               const std::string& q, Mapper* m) {
  const int64_t H = t.hidden_size;
  if (!sparse) {
    const int64_t I = t.intermediate_size;
    VLM_RETURN_IF_ERROR(m->add(f, g + "ffn_gate.weight", q + "mlp.gate_proj.weight", {I, H}));
    VLM_RETURN_IF_ERROR(m->add(f, g + "ffn_up.weight", q + "mlp.up_proj.weight", {I, H}));
    return m->add(f, g + "ffn_down.weight", q + "mlp.down_proj.weight", {H, I});
  }
  const int64_t E = t.num_experts, I = t.moe_intermediate_size;
  VLM_RETURN_IF_ERROR(m->add(f, g + "ffn_gate_inp.weight", q + "mlp.gate.weight", {E, H}));
  for (const auto& [gn, proj] :
       {std::pair{"ffn_gate_exps.weight", "gate_proj"}, std::pair{"ffn_up_exps.weight", "up_proj"},
        std::pair{"ffn_down_exps.weight", "down_proj"}}) {
    const bool down = std::strcmp(proj, "down_proj") == 0;
    const std::string pr = proj;
    VLM_RETURN_IF_ERROR(m->add_experts(
        f, g + gn,
        [&](int64_t e) { return q + "mlp.experts." + std::to_string(e) + "." + pr + ".weight"; },
        down ? std::vector<int64_t>{E, H, I} : std::vector<int64_t>{E, I, H}));
  }
  const int64_t S = t.shared_expert_intermediate_size;
  if (S == 0) return ok_status();
  const std::string se = q + "mlp.shared_expert.";
  VLM_RETURN_IF_ERROR(m->add(f, g + "ffn_gate_shexp.weight", se + "gate_proj.weight", {S, H}));
  VLM_RETURN_IF_ERROR(m->add(f, g + "ffn_up_shexp.weight", se + "up_proj.weight", {S, H}));
  VLM_RETURN_IF_ERROR(m->add(f, g + "ffn_down_shexp.weight", se + "down_proj.weight", {H, S}));
  return m->add(f, g + "ffn_gate_inp_shexp.weight", q + "mlp.shared_expert_gate.weight", {1, H});
}

// The text decoder's tensors, as transformers names them; Qwen3.5's MTP head (stored as the
// blocks after the decoder's, llama.cpp's nextn layers) as mtp.*.
Status map_text(const GgufFile& f, const Qwen3VLConfig& cfg, Mapper* m) {
  const Qwen3VLTextConfig& t = cfg.text_config;
  const bool zc = t.zero_centered_norms;
  const std::string p = "model.language_model.";
  const int64_t H = t.hidden_size, V = t.vocab_size;
  VLM_RETURN_IF_ERROR(m->add(f, "token_embd.weight", p + "embed_tokens.weight", {V, H}));
  VLM_RETURN_IF_ERROR(add_norm(m, f, "output_norm.weight", p + "norm.weight", H, zc));
  if (!cfg.tie_word_embeddings) {
    VLM_RETURN_IF_ERROR(m->add(f, "output.weight", "lm_head.weight", {V, H}));
  }
  // llama.cpp's name for the norm after attention: ffn_norm (Qwen3-VL), post_attention_norm
  // (Qwen3.5).
  const char* post =
      t.family == ModelFamily::kQwen35 ? "post_attention_norm.weight" : "ffn_norm.weight";
  auto layer = [&](int64_t l, const std::string& q, bool linear, bool sparse) -> Status {
    const std::string g = "blk." + std::to_string(l) + ".";
    VLM_RETURN_IF_ERROR(
        add_norm(m, f, g + "attn_norm.weight", q + "input_layernorm.weight", H, zc));
    VLM_RETURN_IF_ERROR(add_norm(m, f, g + post, q + "post_attention_layernorm.weight", H, zc));
    VLM_RETURN_IF_ERROR(linear ? map_linear(f, t, g, q + "linear_attn.", m)
                               : map_attention(f, t, g, q, m));
    return map_mlp(f, t, sparse, g, q, m);
  };
  ProgressStep step("loading the GGUF text decoder", t.num_hidden_layers + t.mtp_num_hidden_layers,
                    "layers");
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) {
    VLM_RETURN_IF_ERROR(
        layer(l, p + "layers." + std::to_string(l) + ".", t.linear_layer(l), t.sparse_layer(l)));
    step.advance();
  }
  for (int64_t k = 0; k < t.mtp_num_hidden_layers; ++k) {
    const int64_t l = t.num_hidden_layers + k;
    VLM_RETURN_IF_ERROR(
        layer(l, "mtp.layers." + std::to_string(k) + ".", false, t.num_experts > 0));
    step.advance();
  }
  step.finish();
  if (t.mtp_num_hidden_layers > 0) {
    const std::string g = "blk." + std::to_string(t.num_hidden_layers) + ".nextn.";
    VLM_RETURN_IF_ERROR(m->add(f, g + "eh_proj.weight", "mtp.fc.weight", {H, 2 * H}));
    VLM_RETURN_IF_ERROR(
        add_norm(m, f, g + "enorm.weight", "mtp.pre_fc_norm_embedding.weight", H, zc));
    VLM_RETURN_IF_ERROR(add_norm(m, f, g + "hnorm.weight", "mtp.pre_fc_norm_hidden.weight", H, zc));
    VLM_RETURN_IF_ERROR(add_norm(m, f, g + "shared_head_norm.weight", "mtp.norm.weight", H, zc));
  }
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
  m->put_f32(p + "patch_embed.proj.weight", conv.data(), {h, C, 2, P, P},
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
  ProgressStep step("loading the GGUF vision tower", c.depth, "blocks");
  for (int64_t l = 0; l < c.depth; ++l) {
    for (const Entry& e : block) {
      VLM_RETURN_IF_ERROR(m->add(v, "v.blk." + std::to_string(l) + "." + e.gguf,
                                 p + "blocks." + std::to_string(l) + "." + e.hf, e.shape));
    }
    step.advance();
  }
  step.finish();
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
  const int64_t n_tokens = tokens != nullptr ? static_cast<int64_t>(tokens->strings.size()) : 0;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"}) {
    auto id = f.get_int(key);
    if (!id.ok()) continue;
    if (*id < 0 || *id >= n_tokens) {
      return invalid_argument(f.name() + ": " + key + " " + std::to_string(*id) +
                              " is not a token of its vocabulary (" + std::to_string(n_tokens) +
                              ")");
    }
    if (std::strcmp(key, "tokenizer.ggml.eos_token_id") == 0) {
      ck->eos_id = static_cast<int32_t>(*id);
      ck->eos_token = text_of(*id);
      cfg.eos_token_id.push_back(*id);
    } else {
      ck->pad_id = static_cast<int32_t>(*id);
    }
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

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

Result<std::string> gguf_tokenizer_json(const GgufFile& f) {
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return invalid_argument(f.name() + ": tokenizer.ggml.model '" + std::string(*model) +
                            "' is not the byte-level BPE (gpt2) of Qwen's models");
  }
  auto pre = f.get_string("tokenizer.ggml.pre");
  if (!pre.ok()) return pre.status();
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
  try {
    return doc.dump();
  } catch (const json::exception&) {  // text that is not UTF-8, which JSON cannot carry
    return invalid_argument(f.name() +
                            ": tokenizer.ggml.tokens or tokenizer.ggml.merges hold text that is "
                            "not valid UTF-8");
  }
}

Result<GgufCheckpoint> open_gguf_checkpoint(const std::string& model_path,
                                            const std::string& mmproj_path, bool exact,
                                            bool native_blocks) {
  auto hold = std::make_shared<Holder>();
  hold->files.reserve(2);  // `f` below stays valid while the vision file joins it
  VLM_ASSIGN_OR_RETURN(GgufFile model, GgufFile::open(model_path));
  hold->files.push_back(std::move(model));
  const GgufFile& f = hold->files.back();
  auto name = f.get_string("general.architecture");
  if (!name.ok()) return name.status();
  const Arch* arch = nullptr;
  for (const Arch& a : kArchs) {
    if (*name == a.gguf) arch = &a;
  }
  if (arch == nullptr) {
    return invalid_argument(f.name() + ": architecture '" + std::string(*name) +
                            "' is not one vlm runs from GGUF (qwen3vl, qwen3vlmoe, qwen35, "
                            "qwen35moe)");
  }
  if (auto type = f.get_string("general.type"); type.ok() && *type == "mmproj") {
    return invalid_argument(f.name() + " is a vision (mmproj) file: give it as --mmproj");
  }
  const GgufFile* v = nullptr;
  if (!mmproj_path.empty()) {
    VLM_ASSIGN_OR_RETURN(GgufFile vis, GgufFile::open(mmproj_path));
    hold->files.push_back(std::move(vis));
    v = &hold->files.back();
  }
  GgufCheckpoint ck;
  VLM_ASSIGN_OR_RETURN(ck.cfg, gguf_config(f, *arch, v));
  ck.cfg.text_config.linear_value_heads_tiled = arch->hybrid;  // map_linear's order
  ck.file_bytes = f.size();
  Mapper m(hold.get(), exact);
  m.keep_blocks = native_blocks;
  VLM_RETURN_IF_ERROR(map_text(f, ck.cfg, &m));
  m.keep_blocks = false;
  if (v != nullptr) {
    VLM_RETURN_IF_ERROR(map_vision(*v, ck.cfg.vision_config, &m));
    VLM_ASSIGN_OR_RETURN(ck.image_mean, float_array(*v, "clip.vision.image_mean"));
    VLM_ASSIGN_OR_RETURN(ck.image_std, float_array(*v, "clip.vision.image_std"));
    const bool rgb = (ck.image_mean.empty() || ck.image_mean.size() == 3) &&
                     (ck.image_std.empty() || ck.image_std.size() == 3);
    const bool positive =
        std::all_of(ck.image_std.begin(), ck.image_std.end(), [](double x) { return x > 0; });
    if (!rgb || !positive) {
      return invalid_argument(v->name() +
                              ": clip.vision.image_mean and image_std must hold 3 values (R, G, "
                              "B), the std ones positive");
    }
    ck.file_bytes += v->size();
  }
  VLM_RETURN_IF_ERROR(special_ids(f, &ck));
  if (f.find("tokenizer.ggml.tokens") != nullptr) {
    VLM_ASSIGN_OR_RETURN(ck.tokenizer_json, gguf_tokenizer_json(f));
  }
  if (auto tpl = f.get_string("tokenizer.chat_template"); tpl.ok()) {
    ck.chat_template = std::string(*tpl);
  }
  auto mib = [](uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return std::string(buf);
  };
  const auto type_list = [](const std::vector<GgmlType>& ts) {
    std::string types;
    for (GgmlType t : ts) types += (types.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    return types;
  };
  if (m.repacked_bytes() > 0) {
    ck.notes.push_back(
        "GGUF tensors of type Q4_0 repacked bit for bit into vlm's INT4 layout (--quant int4's: "
        "32 nibbles and an f16 scale per block) and multiplied by its kernels: " +
        mib(m.repacked_bytes()));
  }
  if (!m.native_types().empty()) {
    ck.notes.push_back("GGUF tensors of type " + type_list(m.native_types()) +
                       " multiplied as stored (by the CPU's block kernels over x quantized to INT8 "
                       "per 32 values, or, at the generic ISA level, dequantized 32 rows at a "
                       "time): " +
                       mib(m.native_bytes()));
  }
  if (!m.dequantized_types().empty()) {
    const std::string types = type_list(m.dequantized_types());
    ck.notes.push_back(
        "GGUF tensors of type " + types +
        (exact ? " dequantized to f32 at load (--precision f32: exact): "
               : " dequantized and rounded to BF16 at load (each weight within 2^-8 of its "
                 "value, relative; --precision f32 keeps them exact in f32): ") +
        mib(m.dequantized_bytes()) + " in memory, the files " + mib(ck.file_bytes));
  }
  ck.dequantized_bytes = m.dequantized_bytes();
  // (The engine copies the products' weights onto 2 MiB pages from these mappings, releasing
  // their file pages as it goes, as from a safetensors checkpoint's.)
  std::vector<const MappedFile*> mappings;
  for (GgufFile& g : hold->files) {
    if (g.mapping() != nullptr) mappings.push_back(g.mapping());
    g.release_header();  // everything above is copied out of it
  }
  ck.store = std::make_unique<WeightStore>(
      WeightStore::from_views(model_path, m.take_views(), m.take_origin(),
                              std::shared_ptr<const void>(hold, hold.get()), mappings));
  return ck;
}

}  // namespace vlm
