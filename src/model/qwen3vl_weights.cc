#include "model/qwen3vl_weights.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/half.h"
#include "ops/ops.h"

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

Result<TensorView> load_matrix(const WeightStore& s, const std::string& name, int64_t rows,
                               int64_t cols) {
  return s.get(name, {rows, cols}, kFloatTypes);
}

Status load_merger(const WeightStore& s, const std::string& p, int64_t norm_dim, int64_t wide,
                   int64_t out, VisionMergerWeights* m) {
  VLM_ASSIGN_OR_RETURN(m->norm_w, load_vector(s, p + "norm.weight", norm_dim));
  VLM_ASSIGN_OR_RETURN(m->norm_b, load_vector(s, p + "norm.bias", norm_dim));
  VLM_ASSIGN_OR_RETURN(m->fc1, load_matrix(s, p + "linear_fc1.weight", wide, wide));
  VLM_ASSIGN_OR_RETURN(m->fc1_b, load_vector(s, p + "linear_fc1.bias", wide));
  VLM_ASSIGN_OR_RETURN(m->fc2, load_matrix(s, p + "linear_fc2.weight", out, wide));
  VLM_ASSIGN_OR_RETURN(m->fc2_b, load_vector(s, p + "linear_fc2.bias", out));
  return ok_status();
}

}  // namespace

Result<HugePageBuffer> copy_weights_to_huge_pages(TextWeights* text, VisionWeights* vision,
                                                  const WeightStore& store) {
  // embed_tokens only as lm_head's bytes (tied, not quantized): alone it serves one row per
  // token, which the file mapping does as well, and a quantized tied lm_head released its pages.
  std::vector<TensorView*> views = {&text->lm_head};
  if (text->embed_tokens.data == text->lm_head.data) views.push_back(&text->embed_tokens);
  for (TextLayerWeights& L : text->layers) {
    for (TensorView* v : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj,
                          &L.down_proj}) {
      views.push_back(v);
    }
  }
  if (vision != nullptr) {
    views.push_back(&vision->patch_embed);
    for (VisionBlockWeights& B : vision->blocks) {
      for (TensorView* v : {&B.qkv, &B.proj, &B.fc1, &B.fc2}) views.push_back(v);
    }
    views.push_back(&vision->merger.fc1);
    views.push_back(&vision->merger.fc2);
    for (VisionMergerWeights& M : vision->deepstack_mergers) {
      views.push_back(&M.fc1);
      views.push_back(&M.fc2);
    }
  }
  // Distinct source ranges, each at a 64-byte aligned offset of the buffer.
  struct Range {
    size_t offset, bytes;
  };
  constexpr size_t kAlign = 64;
  std::map<const void*, Range> ranges;  // source bytes -> where they go
  size_t total = 0;
  for (TensorView* v : views) {
    if (v->data == nullptr || !store.holds(v->data, v->nbytes())) continue;
    if (ranges.emplace(v->data, Range{total, v->nbytes()}).second) {
      total += (v->nbytes() + kAlign - 1) / kAlign * kAlign;
    }
  }
  VLM_ASSIGN_OR_RETURN(HugePageBuffer buf, HugePageBuffer::allocate(total));
  // Copied a slice at a time, each slice's file pages released right after: the process never
  // holds much more than one copy of the weights (peak RSS).
  constexpr size_t kSlice = size_t{64} << 20;
  for (const auto& [src, r] : ranges) {
    const auto* from = static_cast<const uint8_t*>(src);
    for (size_t done = 0; done < r.bytes; done += kSlice) {
      const size_t n = std::min(kSlice, r.bytes - done);
      std::memcpy(buf.data() + r.offset + done, from + done, n);
      store.release_pages(from + done, n);
    }
  }
  for (TensorView* v : views) {
    auto it = ranges.find(v->data);
    if (it != ranges.end()) v->data = buf.data() + it->second.offset;
  }
  return buf;
}

Result<VisionWeights> load_vision_weights(const WeightStore& s, const Qwen3VLConfig& cfg) {
  const Qwen3VLVisionConfig& v = cfg.vision_config;
  const std::string p = s.has("model.visual.patch_embed.proj.weight") ? "model.visual." : "visual.";
  const int64_t D = v.hidden_size, I = v.intermediate_size;
  const int64_t m2 = v.spatial_merge_size * v.spatial_merge_size;
  const int64_t patch_in = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size;
  VisionWeights w;
  VLM_ASSIGN_OR_RETURN(TensorView pe, s.get(p + "patch_embed.proj.weight",
                                            {D, v.in_channels, v.temporal_patch_size, v.patch_size,
                                             v.patch_size},
                                            kFloatTypes));
  w.patch_embed = pe;
  w.patch_embed.shape = {D, patch_in};  // the Conv3d with stride = kernel is this one matmul
  VLM_ASSIGN_OR_RETURN(w.patch_embed_b, load_vector(s, p + "patch_embed.proj.bias", D));
  {
    VLM_ASSIGN_OR_RETURN(TensorView pos, s.get(p + "pos_embed.weight", {v.num_position_embeddings, D},
                                               kFloatTypes));
    // f32 copy: the interpolation weights and sum are built in f32 (design note §3.2).
    w.pos_embed.resize(static_cast<size_t>(pos.numel()));
    for (int64_t i = 0; i < pos.numel(); ++i) {
      switch (pos.dtype) {
        case DType::kF32: w.pos_embed[i] = static_cast<const float*>(pos.data)[i]; break;
        case DType::kBF16: w.pos_embed[i] = bf16_to_f32(static_cast<const uint16_t*>(pos.data)[i]); break;
        case DType::kF16: w.pos_embed[i] = f16_to_f32(static_cast<const uint16_t*>(pos.data)[i]); break;
        default: break;
      }
    }
  }
  w.blocks.resize(v.depth);
  for (int64_t b = 0; b < v.depth; ++b) {
    const std::string bp = p + "blocks." + std::to_string(b) + ".";
    VisionBlockWeights& B = w.blocks[b];
    VLM_ASSIGN_OR_RETURN(B.norm1_w, load_vector(s, bp + "norm1.weight", D));
    VLM_ASSIGN_OR_RETURN(B.norm1_b, load_vector(s, bp + "norm1.bias", D));
    VLM_ASSIGN_OR_RETURN(B.qkv, load_matrix(s, bp + "attn.qkv.weight", 3 * D, D));
    VLM_ASSIGN_OR_RETURN(B.qkv_b, load_vector(s, bp + "attn.qkv.bias", 3 * D));
    VLM_ASSIGN_OR_RETURN(B.proj, load_matrix(s, bp + "attn.proj.weight", D, D));
    VLM_ASSIGN_OR_RETURN(B.proj_b, load_vector(s, bp + "attn.proj.bias", D));
    VLM_ASSIGN_OR_RETURN(B.norm2_w, load_vector(s, bp + "norm2.weight", D));
    VLM_ASSIGN_OR_RETURN(B.norm2_b, load_vector(s, bp + "norm2.bias", D));
    VLM_ASSIGN_OR_RETURN(B.fc1, load_matrix(s, bp + "mlp.linear_fc1.weight", I, D));
    VLM_ASSIGN_OR_RETURN(B.fc1_b, load_vector(s, bp + "mlp.linear_fc1.bias", I));
    VLM_ASSIGN_OR_RETURN(B.fc2, load_matrix(s, bp + "mlp.linear_fc2.weight", D, I));
    VLM_ASSIGN_OR_RETURN(B.fc2_b, load_vector(s, bp + "mlp.linear_fc2.bias", D));
  }
  VLM_RETURN_IF_ERROR(load_merger(s, p + "merger.", D, D * m2, v.out_hidden_size, &w.merger));
  w.deepstack_mergers.resize(v.deepstack_visual_indexes.size());
  for (size_t k = 0; k < w.deepstack_mergers.size(); ++k) {
    VLM_RETURN_IF_ERROR(load_merger(s, p + "deepstack_merger_list." + std::to_string(k) + ".",
                                    D * m2, D * m2, v.out_hidden_size, &w.deepstack_mergers[k]));
  }
  return w;
}

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

Result<WeightQuant> parse_weight_quant(const std::string& name) {
  if (name.empty()) return WeightQuant::kNone;
  if (name == "int8") return WeightQuant::kInt8;
  if (name == "int4") return WeightQuant::kInt4;
  return invalid_argument("unknown quantization '" + name +
                          "' (supported: \"int8\", \"int4\", and \"fp8\" on the GPU; empty keeps "
                          "the weights as stored)");
}

Status quantize_text_weights(TextWeights* w, WeightQuant quant, ThreadPool& pool,
                             const WeightStore* store) {
  switch (quant) {
    case WeightQuant::kNone: return ok_status();
    case WeightQuant::kInt8: break;
    case WeightQuant::kInt4: break;
  }
  // Works on a copy (views and small norm vectors) so a failure leaves *w as it was.
  TextWeights qw = *w;
  auto int8 = std::make_shared<std::vector<Int8Weight>>();
  auto int4 = std::make_shared<std::vector<Int4Weight>>();
  if (quant == WeightQuant::kInt8) int8->reserve(qw.layers.size() * 7 + 1);
  if (quant == WeightQuant::kInt4) int4->reserve(qw.layers.size() * 7 + 1);
  auto quantize = [&](TensorView* v, const std::string& name) -> Status {
    TensorView out;
    out.shape = v->shape;
    if (quant == WeightQuant::kInt8) {
      Int8Weight& q = int8->emplace_back();
      q.q.resize(static_cast<size_t>(v->numel()));
      q.scale.resize(static_cast<size_t>(v->dim(0)));
      VLM_RETURN_IF_ERROR(
          ops::quantize_int8(*v, q.q.data(), q.scale.data(), pool).with_context(name));
      out.dtype = DType::kI8;
      out.data = q.q.data();
      out.scale = q.scale.data();
    } else {
      Int4Weight& q = int4->emplace_back();
      q.q.resize(dtype_nbytes(DType::kI4, v->numel()));
      q.scale.resize(static_cast<size_t>(v->dim(0) * (v->dim(1) / kInt4Group)));
      VLM_RETURN_IF_ERROR(
          ops::quantize_int4(*v, q.q.data(), q.scale.data(), pool).with_context(name));
      out.dtype = DType::kI4;
      out.data = q.q.data();
      out.scale = q.scale.data();
    }
    if (store != nullptr) store->release_pages(*v);
    *v = std::move(out);
    return ok_status();
  };
  for (size_t l = 0; l < qw.layers.size(); ++l) {
    TextLayerWeights& L = qw.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    VLM_RETURN_IF_ERROR(quantize(&L.q_proj, p + "q_proj"));
    VLM_RETURN_IF_ERROR(quantize(&L.k_proj, p + "k_proj"));
    VLM_RETURN_IF_ERROR(quantize(&L.v_proj, p + "v_proj"));
    VLM_RETURN_IF_ERROR(quantize(&L.o_proj, p + "o_proj"));
    VLM_RETURN_IF_ERROR(quantize(&L.gate_proj, p + "gate_proj"));
    VLM_RETURN_IF_ERROR(quantize(&L.up_proj, p + "up_proj"));
    VLM_RETURN_IF_ERROR(quantize(&L.down_proj, p + "down_proj"));
  }
  // Tied: lm_head is a second view of the embedding table; only that view is quantized.
  VLM_RETURN_IF_ERROR(quantize(&qw.lm_head, "lm_head"));
  if (quant == WeightQuant::kInt8) qw.int8_storage = std::move(int8);
  if (quant == WeightQuant::kInt4) qw.int4_storage = std::move(int4);
  *w = std::move(qw);
  return ok_status();
}

}  // namespace vlm
