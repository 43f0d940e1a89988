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

// The f32 values of a stored F32 / BF16 / F16 tensor.
std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (v.dtype) {
      case DType::kF32:
        out[i] = static_cast<const float*>(v.data)[i];
        break;
      case DType::kBF16:
        out[i] = bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
        break;
      case DType::kF16:
        out[i] = f16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
        break;
      default:
        break;
    }
  }
  return out;
}

// Fills one slot from the store: a view (reshaped to the model's shape) or an f32 copy.
Status load_slot(const WeightStore& s, const WeightSlot& w, const TensorView* embed_tokens) {
  if (w.name.empty()) {  // a tied lm_head: the embedding table's second view
    *w.matrix = *embed_tokens;
    return ok_status();
  }
  const std::vector<int64_t>& shape = w.stored_shape.empty() ? w.shape : w.stored_shape;
  VLM_ASSIGN_OR_RETURN(TensorView v, s.get(w.name, shape, kFloatTypes));
  if (w.values != nullptr) {
    *w.values = to_f32(v);
  } else {
    *w.matrix = v;
    w.matrix->shape = w.shape;  // the patch Conv3d with stride = kernel is one matmul
  }
  return ok_status();
}

}  // namespace

Status for_each_weight(TextWeights* text, VisionWeights* vision, const Qwen3VLConfig& cfg,
                       const std::string& tp, const std::string& vp, const WeightFn& fn) {
  auto matrix = [&](const std::string& name, std::vector<int64_t> shape, WeightKind kind,
                    TensorView* m) {
    WeightSlot w;
    w.name = name;
    w.shape = std::move(shape);
    w.kind = kind;
    w.matrix = m;
    return fn(w);
  };
  auto values = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float>* v,
                    WeightKind kind = WeightKind::kVector) {
    WeightSlot w;
    w.name = name;
    w.shape = std::move(shape);
    w.kind = kind;
    w.values = v;
    return fn(w);
  };
  if (text != nullptr) {
    const Qwen3VLTextConfig& t = cfg.text_config;
    const int64_t H = t.hidden_size, q_out = t.num_attention_heads * t.head_dim,
                  kv_out = t.num_key_value_heads * t.head_dim, I = t.intermediate_size;
    const WeightKind lin = WeightKind::kLayerLinear;
    VLM_RETURN_IF_ERROR(matrix(tp + "embed_tokens.weight", {t.vocab_size, H},
                               WeightKind::kEmbedding, &text->embed_tokens));
    for (size_t l = 0; l < text->layers.size(); ++l) {
      const std::string p = tp + "layers." + std::to_string(l) + ".";
      TextLayerWeights& L = text->layers[l];
      VLM_RETURN_IF_ERROR(values(p + "input_layernorm.weight", {H}, &L.input_layernorm));
      VLM_RETURN_IF_ERROR(matrix(p + "self_attn.q_proj.weight", {q_out, H}, lin, &L.q_proj));
      VLM_RETURN_IF_ERROR(matrix(p + "self_attn.k_proj.weight", {kv_out, H}, lin, &L.k_proj));
      VLM_RETURN_IF_ERROR(matrix(p + "self_attn.v_proj.weight", {kv_out, H}, lin, &L.v_proj));
      VLM_RETURN_IF_ERROR(matrix(p + "self_attn.o_proj.weight", {H, q_out}, lin, &L.o_proj));
      VLM_RETURN_IF_ERROR(values(p + "self_attn.q_norm.weight", {t.head_dim}, &L.q_norm));
      VLM_RETURN_IF_ERROR(values(p + "self_attn.k_norm.weight", {t.head_dim}, &L.k_norm));
      VLM_RETURN_IF_ERROR(
          values(p + "post_attention_layernorm.weight", {H}, &L.post_attention_layernorm));
      VLM_RETURN_IF_ERROR(matrix(p + "mlp.gate_proj.weight", {I, H}, lin, &L.gate_proj));
      VLM_RETURN_IF_ERROR(matrix(p + "mlp.up_proj.weight", {I, H}, lin, &L.up_proj));
      VLM_RETURN_IF_ERROR(matrix(p + "mlp.down_proj.weight", {H, I}, lin, &L.down_proj));
    }
    VLM_RETURN_IF_ERROR(values(tp + "norm.weight", {H}, &text->norm));
    VLM_RETURN_IF_ERROR(matrix(cfg.tie_word_embeddings ? "" : "lm_head.weight", {t.vocab_size, H},
                               WeightKind::kHead, &text->lm_head));
  }
  if (vision == nullptr) return ok_status();
  const Qwen3VLVisionConfig& v = cfg.vision_config;
  const int64_t D = v.hidden_size, I = v.intermediate_size;
  const int64_t wide = D * v.spatial_merge_size * v.spatial_merge_size;
  const WeightKind lin = WeightKind::kVisionLinear;
  {
    WeightSlot w;
    w.name = vp + "patch_embed.proj.weight";
    w.shape = {D, v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size};
    w.stored_shape = {D, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size};
    w.kind = lin;
    w.matrix = &vision->patch_embed;
    VLM_RETURN_IF_ERROR(fn(w));
  }
  VLM_RETURN_IF_ERROR(values(vp + "patch_embed.proj.bias", {D}, &vision->patch_embed_b));
  // f32: the interpolation weights and sum are built in f32.
  VLM_RETURN_IF_ERROR(values(vp + "pos_embed.weight", {v.num_position_embeddings, D},
                             &vision->pos_embed, WeightKind::kTable));
  for (size_t b = 0; b < vision->blocks.size(); ++b) {
    const std::string p = vp + "blocks." + std::to_string(b) + ".";
    VisionBlockWeights& B = vision->blocks[b];
    VLM_RETURN_IF_ERROR(values(p + "norm1.weight", {D}, &B.norm1_w));
    VLM_RETURN_IF_ERROR(values(p + "norm1.bias", {D}, &B.norm1_b));
    VLM_RETURN_IF_ERROR(matrix(p + "attn.qkv.weight", {3 * D, D}, lin, &B.qkv));
    VLM_RETURN_IF_ERROR(values(p + "attn.qkv.bias", {3 * D}, &B.qkv_b));
    VLM_RETURN_IF_ERROR(matrix(p + "attn.proj.weight", {D, D}, lin, &B.proj));
    VLM_RETURN_IF_ERROR(values(p + "attn.proj.bias", {D}, &B.proj_b));
    VLM_RETURN_IF_ERROR(values(p + "norm2.weight", {D}, &B.norm2_w));
    VLM_RETURN_IF_ERROR(values(p + "norm2.bias", {D}, &B.norm2_b));
    VLM_RETURN_IF_ERROR(matrix(p + "mlp.linear_fc1.weight", {I, D}, lin, &B.fc1));
    VLM_RETURN_IF_ERROR(values(p + "mlp.linear_fc1.bias", {I}, &B.fc1_b));
    VLM_RETURN_IF_ERROR(matrix(p + "mlp.linear_fc2.weight", {D, I}, lin, &B.fc2));
    VLM_RETURN_IF_ERROR(values(p + "mlp.linear_fc2.bias", {D}, &B.fc2_b));
  }
  // The main merger norms D values before the 2×2 concat, the DeepStack ones all of them after.
  auto merger = [&](const std::string& p, int64_t norm_dim, VisionMergerWeights* m) -> Status {
    VLM_RETURN_IF_ERROR(values(p + "norm.weight", {norm_dim}, &m->norm_w));
    VLM_RETURN_IF_ERROR(values(p + "norm.bias", {norm_dim}, &m->norm_b));
    VLM_RETURN_IF_ERROR(matrix(p + "linear_fc1.weight", {wide, wide}, lin, &m->fc1));
    VLM_RETURN_IF_ERROR(values(p + "linear_fc1.bias", {wide}, &m->fc1_b));
    VLM_RETURN_IF_ERROR(matrix(p + "linear_fc2.weight", {v.out_hidden_size, wide}, lin, &m->fc2));
    return values(p + "linear_fc2.bias", {v.out_hidden_size}, &m->fc2_b);
  };
  VLM_RETURN_IF_ERROR(merger(vp + "merger.", D, &vision->merger));
  for (size_t k = 0; k < vision->deepstack_mergers.size(); ++k) {
    VLM_RETURN_IF_ERROR(merger(vp + "deepstack_merger_list." + std::to_string(k) + ".", wide,
                               &vision->deepstack_mergers[k]));
  }
  return ok_status();
}

Result<HugePageBuffer> copy_weights_to_huge_pages(TextWeights* text, VisionWeights* vision,
                                                  const WeightStore& store) {
  // The products' weights. embed_tokens only as lm_head's bytes (tied, not quantized): alone it
  // serves one row per token, which the file mapping does as well, and a quantized tied lm_head
  // released its pages.
  std::vector<TensorView*> views;
  const bool tied = text->embed_tokens.data == text->lm_head.data;
  for_each_weight(text, vision, Qwen3VLConfig{}, "", "", [&](const WeightSlot& w) {
    if (w.matrix != nullptr && (w.kind != WeightKind::kEmbedding || tied))
      views.push_back(w.matrix);
    return ok_status();
  });
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
  const std::string p = s.has("model.visual.patch_embed.proj.weight") ? "model.visual." : "visual.";
  VisionWeights w;
  w.blocks.resize(static_cast<size_t>(cfg.vision_config.depth));
  w.deepstack_mergers.resize(cfg.vision_config.deepstack_visual_indexes.size());
  VLM_RETURN_IF_ERROR(for_each_weight(nullptr, &w, cfg, "", p, [&](const WeightSlot& slot) {
    return load_slot(s, slot, nullptr);
  }));
  return w;
}

Result<TextWeights> load_text_weights(const WeightStore& s, const Qwen3VLConfig& cfg) {
  std::string prefix = kPrefixes[0];
  for (const char* p : kPrefixes) {
    if (s.has(std::string(p) + "embed_tokens.weight")) {
      prefix = p;
      break;
    }
  }
  TextWeights w;
  w.layers.resize(static_cast<size_t>(cfg.text_config.num_hidden_layers));
  VLM_RETURN_IF_ERROR(for_each_weight(&w, nullptr, cfg, prefix, "", [&](const WeightSlot& slot) {
    return load_slot(s, slot, &w.embed_tokens);
  }));
  return w;
}

Status quantize_text_weights(TextWeights* w, WeightQuant quant, ThreadPool& pool,
                             const WeightStore* store) {
  switch (quant) {
    case WeightQuant::kNone:
      return ok_status();
    case WeightQuant::kInt8:
      break;
    case WeightQuant::kInt4:
      break;
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
  // Every layer's products and the head. Tied: lm_head is a second view of the embedding table;
  // only that view is quantized.
  VLM_RETURN_IF_ERROR(
      for_each_weight(&qw, nullptr, Qwen3VLConfig{}, "", "", [&](const WeightSlot& s) {
        if (s.kind != WeightKind::kLayerLinear && s.kind != WeightKind::kHead) return ok_status();
        return quantize(s.matrix, s.name.empty() ? "lm_head" : s.name);
      }));
  if (quant == WeightQuant::kInt8) qw.int8_storage = std::move(int8);
  if (quant == WeightQuant::kInt4) qw.int4_storage = std::move(int4);
  *w = std::move(qw);
  return ok_status();
}

}  // namespace vlm
