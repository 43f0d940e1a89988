#include "model/qwen3vl_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "core/half.h"
#include "ops/ops.h"
#include "vlm/progress.h"

namespace vlm {
namespace {

// transformers >= 4.52 writes "model.language_model."; older Qwen-VL exports used "model.".
constexpr const char* kPrefixes[] = {"model.language_model.", "model."};

constexpr std::initializer_list<DType> kFloatTypes = {DType::kF32, DType::kBF16, DType::kF16};
// (kI4: a GGUF file's Q4_0 matrices, repacked, or a pre-quantized checkpoint's 4-bit ones; kI8
// and kQ8_0 a pre-quantized checkpoint's 8-bit and FP8 ones: model/prequant.h.)
constexpr std::initializer_list<DType> kMatrixTypes = {DType::kF32,  DType::kBF16, DType::kF16,
                                                       DType::kQ8_0, DType::kQ4K,  DType::kQ5K,
                                                       DType::kQ6K,  DType::kI4,   DType::kI8};

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
  // A GGUF checkpoint's text matrices may be block types, multiplied and gathered as stored.
  const bool blocks_ok = w.matrix != nullptr && w.kind != WeightKind::kVisionLinear &&
                         w.kind != WeightKind::kFusedExperts;
  VLM_ASSIGN_OR_RETURN(TensorView v, s.get(w.name, shape, blocks_ok ? kMatrixTypes : kFloatTypes));
  if (w.values != nullptr) {
    *w.values = to_f32(v);
  } else {
    *w.matrix = v;
    w.matrix->shape = w.shape;  // the patch Conv3d with stride = kernel is one matmul
  }
  return ok_status();
}

// A Gated DeltaNet layer's weights (prefix `a`: "...layers.N.linear_attn."), for for_each_weight.
Status walk_delta_net(const std::string& a, const Qwen3VLTextConfig& t, DeltaNetWeights* d,
                      const WeightFn& fn) {
  const int64_t H = t.hidden_size, conv = t.linear_conv_dim(), nv = t.linear_num_value_heads,
                vd = nv * t.linear_value_head_dim, K = t.linear_conv_kernel_dim;
  auto slot = [&](const std::string& name, std::vector<int64_t> shape, TensorView* m,
                  std::vector<float>* v, std::vector<int64_t> stored = {}) {
    WeightSlot w;
    w.name = a + name;
    w.shape = std::move(shape);
    w.stored_shape = std::move(stored);
    w.kind = m != nullptr ? WeightKind::kLayerLinear : WeightKind::kVector;
    w.matrix = m;
    w.values = v;
    return fn(w);
  };
  VLM_RETURN_IF_ERROR(slot("in_proj_qkv.weight", {conv, H}, &d->in_proj_qkv, nullptr));
  VLM_RETURN_IF_ERROR(slot("in_proj_z.weight", {vd, H}, &d->in_proj_z, nullptr));
  VLM_RETURN_IF_ERROR(slot("in_proj_b.weight", {nv, H}, &d->in_proj_b, nullptr));
  VLM_RETURN_IF_ERROR(slot("in_proj_a.weight", {nv, H}, &d->in_proj_a, nullptr));
  VLM_RETURN_IF_ERROR(slot("conv1d.weight", {conv, K}, nullptr, &d->conv1d, {conv, 1, K}));
  VLM_RETURN_IF_ERROR(slot("A_log", {nv}, nullptr, &d->a_log));
  VLM_RETURN_IF_ERROR(slot("dt_bias", {nv}, nullptr, &d->dt_bias));
  VLM_RETURN_IF_ERROR(slot("norm.weight", {t.linear_value_head_dim}, nullptr, &d->norm));
  return slot("out_proj.weight", {H, vd}, &d->out_proj, nullptr);
}

// Rows [r0, r0 + n) of a [N, K] matrix view (quantized or not) as a view of its own.
TensorView row_block(const TensorView& v, int64_t r0, int64_t n) {
  const int64_t K = v.dim(1);
  TensorView out = v;
  out.shape = {n, K};
  out.data = static_cast<const uint8_t*>(v.data) + dtype_nbytes(v.dtype, r0 * K);
  if (v.scale != nullptr) out.scale = v.scale + r0;
  if (v.int4.scale != nullptr) {
    const int64_t groups = K / v.int4.group;
    out.int4.scale = v.int4.scale + r0 * groups;
    if (v.int4.zero != nullptr) out.int4.zero = v.int4.zero + r0 * groups;
  }
  return out;
}

// Splits Qwen3.5 MoE's fused expert tensors ([E, 2·I, H]: gate rows then up rows; [E, H, I]),
// nn.Linear's layout expert by expert, into views of each expert's rows, and clears them.
void view_linear_layout_experts(MoeWeights* m) {
  if (m->fused_gate_up.data == nullptr) return;
  const int64_t E = m->fused_gate_up.dim(0), I = m->fused_gate_up.dim(1) / 2,
                H = m->fused_gate_up.dim(2);
  TensorView gate_up = m->fused_gate_up, down = m->fused_down;  // as [E·2I, H] and [E·H, I]
  gate_up.shape = {E * 2 * I, H};
  down.shape = {E * H, I};
  for (auto* v : {&m->gate, &m->up, &m->down}) v->resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    m->gate[e] = row_block(gate_up, 2 * I * e, I);
    m->up[e] = row_block(gate_up, 2 * I * e + I, I);
    m->down[e] = row_block(down, H * e, H);
  }
  m->fused_gate_up = TensorView{};
  m->fused_down = TensorView{};
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
    // One decoder layer (prefix p: "...layers.N.").
    auto layer = [&](const std::string& p, TextLayerWeights& L) -> Status {
      VLM_RETURN_IF_ERROR(values(p + "input_layernorm.weight", {H}, &L.input_layernorm));
      if (L.linear) {
        VLM_RETURN_IF_ERROR(walk_delta_net(p + "linear_attn.", t, &L.delta, fn));
      } else {
        VLM_RETURN_IF_ERROR(
            matrix(p + "self_attn.q_proj.weight", {t.q_proj_rows(), H}, lin, &L.q_proj));
        VLM_RETURN_IF_ERROR(matrix(p + "self_attn.k_proj.weight", {kv_out, H}, lin, &L.k_proj));
        VLM_RETURN_IF_ERROR(matrix(p + "self_attn.v_proj.weight", {kv_out, H}, lin, &L.v_proj));
        VLM_RETURN_IF_ERROR(matrix(p + "self_attn.o_proj.weight", {H, q_out}, lin, &L.o_proj));
        VLM_RETURN_IF_ERROR(values(p + "self_attn.q_norm.weight", {t.head_dim}, &L.q_norm));
        VLM_RETURN_IF_ERROR(values(p + "self_attn.k_norm.weight", {t.head_dim}, &L.k_norm));
      }
      VLM_RETURN_IF_ERROR(
          values(p + "post_attention_layernorm.weight", {H}, &L.post_attention_layernorm));
      if (!L.sparse) {
        VLM_RETURN_IF_ERROR(matrix(p + "mlp.gate_proj.weight", {I, H}, lin, &L.gate_proj));
        VLM_RETURN_IF_ERROR(matrix(p + "mlp.up_proj.weight", {I, H}, lin, &L.up_proj));
        return matrix(p + "mlp.down_proj.weight", {H, I}, lin, &L.down_proj);
      }
      MoeWeights& m = L.moe;
      const int64_t E = t.num_experts, Ie = t.moe_intermediate_size,
                    Is = t.shared_expert_intermediate_size;
      VLM_RETURN_IF_ERROR(matrix(p + "mlp.gate.weight", {E, H}, WeightKind::kRouter, &m.router));
      if (m.gate.empty()) {  // the fused layout, not yet split (Qwen3.5's: nn.Linear's per expert)
        const bool linear_layout = t.family == ModelFamily::kQwen35;
        VLM_RETURN_IF_ERROR(matrix(
            p + "mlp.experts.gate_up_proj",
            linear_layout ? std::vector<int64_t>{E, 2 * Ie, H} : std::vector<int64_t>{E, H, 2 * Ie},
            WeightKind::kFusedExperts, &m.fused_gate_up));
        VLM_RETURN_IF_ERROR(
            matrix(p + "mlp.experts.down_proj",
                   linear_layout ? std::vector<int64_t>{E, H, Ie} : std::vector<int64_t>{E, Ie, H},
                   WeightKind::kFusedExperts, &m.fused_down));
      } else {
        for (size_t e = 0; e < m.gate.size(); ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          VLM_RETURN_IF_ERROR(matrix(x + "gate_proj.weight", {Ie, H}, lin, &m.gate[e]));
          VLM_RETURN_IF_ERROR(matrix(x + "up_proj.weight", {Ie, H}, lin, &m.up[e]));
          VLM_RETURN_IF_ERROR(matrix(x + "down_proj.weight", {H, Ie}, lin, &m.down[e]));
        }
      }
      if (m.shared) {
        const std::string x = p + "mlp.shared_expert.";
        VLM_RETURN_IF_ERROR(matrix(x + "gate_proj.weight", {Is, H}, lin, &m.shared_gate));
        VLM_RETURN_IF_ERROR(matrix(x + "up_proj.weight", {Is, H}, lin, &m.shared_up));
        VLM_RETURN_IF_ERROR(matrix(x + "down_proj.weight", {H, Is}, lin, &m.shared_down));
        VLM_RETURN_IF_ERROR(matrix(p + "mlp.shared_expert_gate.weight", {1, H}, WeightKind::kRouter,
                                   &m.shared_expert_gate));
      }
      return ok_status();
    };
    for (size_t l = 0; l < text->layers.size(); ++l) {
      VLM_RETURN_IF_ERROR(layer(tp + "layers." + std::to_string(l) + ".", text->layers[l]));
    }
    VLM_RETURN_IF_ERROR(values(tp + "norm.weight", {H}, &text->norm));
    VLM_RETURN_IF_ERROR(matrix(cfg.tie_word_embeddings ? "" : "lm_head.weight", {t.vocab_size, H},
                               WeightKind::kHead, &text->lm_head));
    MtpWeights& mtp = text->mtp;
    if (!mtp.layers.empty()) {  // Qwen3.5's MTP head, at the checkpoint's top level
      VLM_RETURN_IF_ERROR(matrix("mtp.fc.weight", {H, 2 * H}, lin, &mtp.fc));
      VLM_RETURN_IF_ERROR(values("mtp.pre_fc_norm_embedding.weight", {H}, &mtp.norm_embedding));
      VLM_RETURN_IF_ERROR(values("mtp.pre_fc_norm_hidden.weight", {H}, &mtp.norm_hidden));
      for (size_t l = 0; l < mtp.layers.size(); ++l) {
        VLM_RETURN_IF_ERROR(layer("mtp.layers." + std::to_string(l) + ".", mtp.layers[l]));
      }
      VLM_RETURN_IF_ERROR(values("mtp.norm.weight", {H}, &mtp.norm));
    }
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
    if (w.matrix != nullptr && w.kind != WeightKind::kFusedExperts &&
        (w.kind != WeightKind::kEmbedding || tied))
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
  int64_t to_read = 0;  // the copy's bytes, not its alignment
  for (const auto& [src, r] : ranges) to_read += static_cast<int64_t>(r.bytes);
  ProgressStep step("reading the weights", to_read, "bytes");
  for (const auto& [src, r] : ranges) {
    const auto* from = static_cast<const uint8_t*>(src);
    for (size_t done = 0; done < r.bytes; done += kSlice) {
      const size_t n = std::min(kSlice, r.bytes - done);
      std::memcpy(buf.data() + r.offset + done, from + done, n);
      store.release_pages(from + done, n);
      step.advance(static_cast<int64_t>(n));
    }
  }
  step.finish();
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

Result<TextWeights> load_text_weights(const WeightStore& s, const Qwen3VLConfig& cfg, bool mtp,
                                      bool head_optional) {
  std::string prefix = kPrefixes[0];
  for (const char* p : kPrefixes) {
    if (s.has(std::string(p) + "embed_tokens.weight")) {
      prefix = p;
      break;
    }
  }
  TextWeights w;
  const Qwen3VLTextConfig& t = cfg.text_config;
  if (mtp) {
    if (t.family != ModelFamily::kQwen35 || t.mtp_num_hidden_layers == 0 ||
        !s.has("mtp.fc.weight")) {
      return not_found(
          "this checkpoint has no MTP head (Qwen3.5's mtp.* tensors and its config's "
          "mtp_num_hidden_layers): --spec mtp needs one");
    }
    if (t.mtp_num_hidden_layers != 1) {
      return unimplemented("an MTP head of " + std::to_string(t.mtp_num_hidden_layers) +
                           " layers (vlm runs Qwen3.5's one)");
    }
    w.mtp.layers.resize(1);
  }
  w.layers.resize(static_cast<size_t>(t.num_hidden_layers));
  // Each layer's kind; a sparse layer's experts: fused tensors, or else one tensor per expert.
  auto shape = [&](const std::string& p, TextLayerWeights& L, bool sparse, bool linear) {
    L.sparse = sparse;
    L.linear = linear;
    L.moe.shared = L.sparse && t.shared_expert_intermediate_size > 0;
    if (L.sparse && !s.has(p + "mlp.experts.gate_up_proj")) {
      for (auto* v : {&L.moe.gate, &L.moe.up, &L.moe.down})
        v->resize(static_cast<size_t>(t.num_experts));
    }
  };
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto li = static_cast<int64_t>(l);
    shape(prefix + "layers." + std::to_string(l) + ".", w.layers[l], t.sparse_layer(li),
          t.linear_layer(li));
  }
  for (size_t l = 0; l < w.mtp.layers.size(); ++l) {  // full attention, sparse in an MoE model
    shape("mtp.layers." + std::to_string(l) + ".", w.mtp.layers[l], t.num_experts > 0, false);
  }
  w.head_missing = head_optional && !cfg.tie_word_embeddings && !s.has("lm_head.weight");
  VLM_RETURN_IF_ERROR(for_each_weight(&w, nullptr, cfg, prefix, "", [&](const WeightSlot& slot) {
    if (slot.kind == WeightKind::kHead && w.head_missing) {
      *slot.matrix = w.embed_tokens;
      return ok_status();
    }
    return load_slot(s, slot, &w.embed_tokens);
  }));
  if (t.family == ModelFamily::kQwen35) {  // nn.Linear's layout per expert: viewed in place
    for (TextLayerWeights& L : w.layers) view_linear_layout_experts(&L.moe);
    for (TextLayerWeights& L : w.mtp.layers) view_linear_layout_experts(&L.moe);
  }
  if (t.zero_centered_norms) {  // Qwen3_5RMSNorm scales by (1 + w), computed in f32
    auto one_plus = [](std::vector<float>* v) {
      for (float& x : *v) x = 1.0f + x;
    };
    for (auto* layers : {&w.layers, &w.mtp.layers}) {
      for (TextLayerWeights& L : *layers) {
        for (auto* v : {&L.input_layernorm, &L.post_attention_layernorm, &L.q_norm, &L.k_norm})
          one_plus(v);
      }
    }
    for (auto* v : {&w.norm, &w.mtp.norm_embedding, &w.mtp.norm_hidden, &w.mtp.norm}) one_plus(v);
  }
  return w;
}

bool has_fused_experts(const TextWeights& w) {
  for (const TextLayerWeights& L : w.layers) {
    if (L.moe.fused_gate_up.data != nullptr || L.moe.fused_down.data != nullptr) return true;
  }
  return false;
}

namespace {

// dst [C, R] = src [R, C] transposed, in tiles of 32 × 32 (threads split C).
template <typename T>
void transpose(const T* src, int64_t R, int64_t C, T* dst, ThreadPool& pool) {
  constexpr int64_t kTile = 32;
  pool.parallel_for((C + kTile - 1) / kTile, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t c0 = b0 * kTile; c0 < std::min(C, b1 * kTile); c0 += kTile) {
      const int64_t c1 = std::min(C, c0 + kTile);
      for (int64_t r0 = 0; r0 < R; r0 += kTile) {
        const int64_t r1 = std::min(R, r0 + kTile);
        for (int64_t c = c0; c < c1; ++c) {
          for (int64_t r = r0; r < r1; ++r) dst[c * R + r] = src[r * C + c];
        }
      }
    }
  });
}

// Expert e's [C, R] matrix of a fused [E, R, C] tensor, transposed into dst.
void expert_transposed(const TensorView& fused, int64_t e, void* dst, ThreadPool& pool) {
  const int64_t R = fused.dim(1), C = fused.dim(2);
  const size_t size = dtype_size(fused.dtype);
  const auto* src = static_cast<const uint8_t*>(fused.data) + static_cast<size_t>(e * R * C) * size;
  if (size == 4) {
    transpose(reinterpret_cast<const uint32_t*>(src), R, C, static_cast<uint32_t*>(dst), pool);
  } else {
    transpose(reinterpret_cast<const uint16_t*>(src), R, C, static_cast<uint16_t*>(dst), pool);
  }
}

}  // namespace

Status quantize_text_weights(TextWeights* w, WeightQuant quant, ThreadPool& pool,
                             const WeightStore* store, int64_t int4_group) {
  if (quant == WeightQuant::kNone && !has_fused_experts(*w)) return ok_status();
  // Works on a copy (views and small norm vectors) so a failure leaves *w as it was.
  TextWeights qw = *w;
  auto int8 = std::make_shared<std::vector<Int8Weight>>();
  auto int4 = std::make_shared<std::vector<Int4Weight>>();
  auto copies = std::make_shared<std::vector<std::vector<uint8_t>>>();
  // The quantized copy of a [N, K] view (F32 / BF16 / F16) as an I8 / I4 view into int8 / int4.
  auto quantized = [&](const TensorView& v, const std::string& name) -> Result<TensorView> {
    TensorView out;
    out.shape = v.shape;
    if (quant == WeightQuant::kInt8) {
      Int8Weight& q = int8->emplace_back();
      q.q.resize(static_cast<size_t>(v.numel()));
      q.scale.resize(static_cast<size_t>(v.dim(0)));
      VLM_RETURN_IF_ERROR(
          ops::quantize_int8(v, q.q.data(), q.scale.data(), pool).with_context(name));
      out.dtype = DType::kI8;
      out.data = q.q.data();
      out.scale = q.scale.data();
    } else {
      Int4Weight& q = int4->emplace_back();
      q.q.resize(dtype_nbytes(DType::kI4, v.numel()));
      q.scale.resize(static_cast<size_t>(v.dim(0) * (v.dim(1) / int4_group)));
      VLM_RETURN_IF_ERROR(
          ops::quantize_int4(v, int4_group, q.q.data(), q.scale.data(), pool).with_context(name));
      out.dtype = DType::kI4;
      out.data = q.q.data();
      out.int4.scale = q.scale.data();
      out.int4.group = int4_group;
    }
    return out;
  };

  // The fused experts, expert by expert: transposed into a scratch [out, in] copy (or, kept as
  // stored, straight into the layer's own buffer), then quantized.
  std::vector<uint8_t> scratch;
  std::set<const TensorView*> split;  // the experts made here
  const std::string to = quant == WeightQuant::kInt8 ? "int8" : "int4";
  int64_t fused_layers = 0;
  for (const TextLayerWeights& L : qw.layers) fused_layers += L.moe.fused_gate_up.data != nullptr;
  std::optional<ProgressStep> expert_step;
  if (fused_layers > 0) {
    expert_step.emplace(
        quant == WeightQuant::kNone ? "laying out the experts" : "quantizing the experts to " + to,
        fused_layers, "layers");
  }
  for (size_t l = 0; l < qw.layers.size(); ++l) {
    MoeWeights& m = qw.layers[l].moe;
    if (m.fused_gate_up.data == nullptr) continue;
    const std::string where = "layer " + std::to_string(l) + " experts";
    const int64_t E = m.fused_gate_up.dim(0), H = m.fused_gate_up.dim(1),
                  I2 = m.fused_gate_up.dim(2), I = I2 / 2;
    if (m.fused_down.data == nullptr || m.fused_down.dim(0) != E || m.fused_down.dim(1) != I ||
        m.fused_down.dim(2) != H || I2 % 2 != 0) {
      return invalid_argument(where + ": gate_up_proj and down_proj shapes disagree");
    }
    for (auto* v : {&m.gate, &m.up, &m.down}) v->assign(static_cast<size_t>(E), TensorView{});
    for (const TensorView* fused : {&m.fused_gate_up, &m.fused_down}) {
      const bool gate_up = fused == &m.fused_gate_up;
      const int64_t rows = gate_up ? I2 : H, cols = gate_up ? H : I;  // per expert, [out, in]
      const size_t bytes = dtype_nbytes(fused->dtype, rows * cols);
      uint8_t* keep = nullptr;
      if (quant == WeightQuant::kNone) {
        keep = copies->emplace_back(bytes * static_cast<size_t>(E)).data();
      } else {
        scratch.resize(bytes);
      }
      for (int64_t e = 0; e < E; ++e) {
        uint8_t* dst = keep != nullptr ? keep + bytes * static_cast<size_t>(e) : scratch.data();
        expert_transposed(*fused, e, dst, pool);
        TensorView x;
        x.dtype = fused->dtype;
        x.shape = {rows, cols};
        x.data = dst;
        if (quant != WeightQuant::kNone) {
          VLM_ASSIGN_OR_RETURN(x, quantized(x, where + " " + std::to_string(e)));
        }
        if (gate_up) {
          m.gate[e] = row_block(x, 0, I);
          m.up[e] = row_block(x, I, I);
          split.insert(&m.gate[e]);
          split.insert(&m.up[e]);
        } else {
          m.down[e] = x;
          split.insert(&m.down[e]);
        }
      }
      if (store != nullptr) store->release_pages(*fused);
    }
    m.fused_gate_up = TensorView{};
    m.fused_down = TensorView{};
    expert_step->advance();
  }
  if (expert_step) expert_step->finish();

  // Every layer's products (each expert's too) and the head. Tied: lm_head is a second view of
  // the embedding table; only that view is quantized.
  if (quant != WeightQuant::kNone) {
    const auto n_layers = static_cast<int64_t>(qw.layers.size());
    ProgressStep step("quantizing the text decoder to " + to, n_layers, "layers");
    VLM_RETURN_IF_ERROR(
        for_each_weight(&qw, nullptr, Qwen3VLConfig{}, "", "", [&](const WeightSlot& s) {
          // The walk goes layer by layer ("layers.N."): at layer N, the N before it are done.
          if (s.name.rfind("layers.", 0) == 0) {
            const int64_t at =
                std::min<int64_t>(std::strtoll(s.name.c_str() + 7, nullptr, 10), n_layers);
            if (at > step.done()) step.advance(at - step.done());
          }
          if (s.kind != WeightKind::kLayerLinear && s.kind != WeightKind::kHead) return ok_status();
          if (split.count(s.matrix) != 0) return ok_status();  // quantized above
          // A GGUF file's quantized blocks stay as stored (they are the file's quantization), and
          // so do its Q4_0 matrices, repacked as I4 (I4 weights that this function made, held
          // in int4_storage, are refused as before).
          if (is_ggml_block(s.matrix->dtype)) return ok_status();
          if (s.matrix->dtype == DType::kI4 && w->int4_storage == nullptr) return ok_status();
          VLM_ASSIGN_OR_RETURN(TensorView q,
                               quantized(*s.matrix, s.name.empty() ? "lm_head" : s.name));
          if (store != nullptr) store->release_pages(*s.matrix);
          *s.matrix = std::move(q);
          return ok_status();
        }));
    step.advance(n_layers - step.done());
    step.finish();
  }
  if (!int8->empty()) qw.int8_storage = std::move(int8);
  if (!int4->empty()) qw.int4_storage = std::move(int4);
  if (!copies->empty()) qw.expert_copies = std::move(copies);
  *w = std::move(qw);
  return ok_status();
}

}  // namespace vlm
