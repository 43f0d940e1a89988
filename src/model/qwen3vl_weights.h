// Qwen3-VL weights: views into the mmap'd checkpoint (no copies), plus f32 copies of the small
// norm vectors. Shapes are [out, in] as stored (nn.Linear layout). With --quant int8 / int4 the
// text decoder's linear weights become I8 / I4 views into buffers the TextWeights own
// (quantize_text_weights).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/huge_page_buffer.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "vlm/status.h"

namespace vlm {

// A sparse layer's MLP (a mixture of experts): the router and its experts, each expert's weights
// in the nn.Linear layout ([out, in]) like the dense MLP's.
struct MoeWeights {
  TensorView router;                 // [E, hidden]: mlp.gate.weight, never quantized
  std::vector<TensorView> gate, up;  // [E] of [I, hidden]
  std::vector<TensorView> down;      // [E] of [hidden, I]
  // Qwen3-VL MoE's fused layout as stored (transformers 4.57, the published checkpoints),
  // transposed against nn.Linear: viewed at load, then split into the vectors above by
  // quantize_text_weights, which clears these. Empty for a checkpoint that stores one tensor per
  // expert, and for Qwen3.5 MoE, whose fused tensors ([E, 2·I, hidden] gate rows then up rows,
  // [E, hidden, I]) are nn.Linear's layout expert by expert: the loader views each expert's
  // rows in place.
  TensorView fused_gate_up;  // [E, hidden, 2·I]: gate columns, then up
  TensorView fused_down;     // [E, I, hidden]
  // Qwen3.5 MoE's shared expert (mlp.shared_expert.*, an MLP of shared_expert_intermediate_size
  // every row goes through) and its gate (mlp.shared_expert_gate, [1, hidden], never quantized):
  // the layer's output is the routed sum + sigmoid(gate · x) · shared(x). `shared` says there is
  // one (the loader sets it from the config).
  bool shared = false;
  TensorView shared_gate, shared_up;  // [Is, hidden]
  TensorView shared_down;             // [hidden, Is]
  TensorView shared_expert_gate;      // [1, hidden]
};

// A Gated DeltaNet layer's token mixer (Qwen3.5's linear_attn.*), nn.Linear layouts.
struct DeltaNetWeights {
  TensorView in_proj_qkv;             // [2·nk·dk + nv·dv, hidden]: q | k | v
  TensorView in_proj_z;               // [nv·dv, hidden]: the gated norm's gate
  TensorView in_proj_b;               // [nv, hidden]: β = sigmoid(b)
  TensorView in_proj_a;               // [nv, hidden]: the decay's input
  std::vector<float> conv1d;          // [conv_dim, kernel] (stored [conv_dim, 1, kernel])
  std::vector<float> a_log, dt_bias;  // [nv]
  std::vector<float> norm;            // [dv]: the gated RMSNorm's weight (plain, not 1 + w)
  TensorView out_proj;                // [hidden, nv·dv]
};

struct TextLayerWeights {
  bool sparse = false;  // the MLP is `moe`, not gate/up/down_proj
  MoeWeights moe;
  // Qwen3.5: a Gated DeltaNet layer (`delta`, no self_attn weights).
  bool linear = false;
  DeltaNetWeights delta;
  std::vector<float> input_layernorm;           // [hidden]
  TensorView q_proj;                            // [n_heads * head_dim (· 2 gated), hidden]
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

// One linear weight quantized to INT8 at load time: w[n, k] ≈ q[n, k] · scale[n].
struct Int8Weight {
  std::vector<int8_t> q;     // [N, K]
  std::vector<float> scale;  // [N]
};

// One linear weight quantized to INT4 at load time: w[n, k] ≈ q[n, k] · scale[n, k / G], q
// packed two per byte as core/tensor.h documents for DType::kI4, scales f16 (Int4Params).
struct Int4Weight {
  std::vector<uint8_t> q;       // [N, K / 2]
  std::vector<uint16_t> scale;  // [N, K / G]
};

// Qwen3.5's multi-token-prediction head (the checkpoint's top-level mtp.* tensors): the next
// token's embedding and the trunk's last hidden state (after its final norm), each through its
// own RMSNorm, concatenated in that order, fc to hidden, its decoder layers (full attention, the
// trunk's kind of MLP), its own final norm, then the trunk's head.
struct MtpWeights {
  TensorView fc;                                   // [hidden, 2·hidden]
  std::vector<float> norm_embedding, norm_hidden;  // pre_fc_norm_embedding / _hidden [hidden]
  std::vector<TextLayerWeights> layers;            // mtp.layers.N.*
  std::vector<float> norm;                         // [hidden]
};

struct TextWeights {
  TensorView embed_tokens;  // [vocab, hidden]; always as stored (the lookup stays exact)
  std::vector<TextLayerWeights> layers;
  std::vector<float> norm;  // [hidden]
  TensorView lm_head;       // [vocab, hidden]; = embed_tokens when tied (until quantized)
  // The checkpoint has no lm_head.weight (load_text_weights' head_optional): lm_head is the
  // embedding table's view, and no logits of it mean anything.
  bool head_missing = false;
  // Loaded when asked for (load_text_weights' `mtp`); no layers: none.
  MtpWeights mtp;
  // Own the buffers of the I8 / I4 views above once quantize_text_weights ran (the one of the
  // chosen quantization); null before. Shared so copies and moves of TextWeights keep the views
  // valid.
  std::shared_ptr<const std::vector<Int8Weight>> int8_storage;
  std::shared_ptr<const std::vector<Int4Weight>> int4_storage;
  // Own the fused experts' per-expert copies kept in their stored type (quantize_text_weights
  // with kNone), one buffer per layer and fused tensor.
  std::shared_ptr<const std::vector<std::vector<uint8_t>>> expert_copies;
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
  TensorView patch_embed;            // [D, 3·T·P·P]: the Conv3d kernel flattened (C, T, kh, kw)
  std::vector<float> patch_embed_b;  // [D]
  std::vector<float> pos_embed;      // [num_position_embeddings, D] as f32
  std::vector<VisionBlockWeights> blocks;
  VisionMergerWeights merger;
  std::vector<VisionMergerWeights> deepstack_mergers;  // one per deepstack_visual_indexes entry
};

// What a weight is to the model.
enum class WeightKind {
  kEmbedding,     // embed_tokens: rows looked up
  kLayerLinear,   // a decoder layer's q/k/v/o, gate/up/down (an expert's too)
  kRouter,        // a sparse layer's router (mlp.gate) or shared expert gate: kept as stored
  kFusedExperts,  // a sparse layer's fused expert tensor (MoeWeights::fused_*), 3-D as stored
  kHead,          // lm_head (a second view of embed_tokens when tied)
  kVisionLinear,  // the vision tower's and its mergers' products
  kVector,        // a norm's weight or a bias (f32 copy)
  kTable,         // the vision tower's learned position table (f32 copy, [positions, D])
};

// One weight as for_each_weight hands it out: its checkpoint name, the shape the model uses, and
// where it lives in TextWeights / VisionWeights (`matrix` for the products and the embedding,
// `values` for f32 copies).
struct WeightSlot {
  std::string name;                   // the checkpoint's; empty for a tied lm_head
  std::vector<int64_t> shape;         // as the model uses it
  std::vector<int64_t> stored_shape;  // the checkpoint's, where it differs (the patch Conv3d)
  WeightKind kind = WeightKind::kVector;
  TensorView* matrix = nullptr;
  std::vector<float>* values = nullptr;
};
using WeightFn = std::function<Status(const WeightSlot&)>;

// The one walk over the model's weights, in checkpoint order: loading (load_text_weights,
// load_vision_weights), quantization and the huge-page copy all go through it (the backends take
// the weights from the model, which groups them into its products). It visits the layers, blocks
// and mergers the structs hold (a loader sizes them from the config first); names and shapes come
// from `cfg` and the prefixes (the text decoder's, e.g. "model.language_model.", and the
// tower's) and matter to a loader only. `text` or `vision` may be null. The first error stops the
// walk.
Status for_each_weight(TextWeights* text, VisionWeights* vision, const Qwen3VLConfig& cfg,
                       const std::string& text_prefix, const std::string& vision_prefix,
                       const WeightFn& fn);

// Loads and checks every text-decoder tensor (name, shape, dtype). The store must outlive the
// returned views. Errors name the file and the tensor. Qwen3.5's zero-centred RMSNorm weights are
// stored as 1 + w (what they scale by); its mtp.* tensors are read only with `mtp` (refused for a
// checkpoint without them).
// With `head_optional`, an untied checkpoint without lm_head.weight loads (head_missing).
Result<TextWeights> load_text_weights(const WeightStore& store, const Qwen3VLConfig& cfg,
                                      bool mtp = false, bool head_optional = false);

// The host's weight quantization at load time (the CPU's; the engine maps EngineOptions::quant).
enum class WeightQuant { kNone, kInt8, kInt4 };

// Whether a fused expert tensor still waits to be split (then quantize_text_weights must run
// before a decoder is built from `w`, whatever the quantization).
bool has_fused_experts(const TextWeights& w);

// First, every fused expert tensor is split into per-expert [out, in] matrices, expert by
// expert, each transposed into a scratch copy and kept in its stored type (kNone, owned by
// `w`) or quantized as below; each fused tensor's pages are released (with `store`) when its
// layer is done. Then:
// kInt8: replaces q/k/v/o, gate/up/down of every layer (each expert's too) and lm_head (also when
// tied: the tied embedding is quantized as lm_head only, embed_tokens keeps the stored table for
// lookups) with per-output-row INT8 copies (ops::quantize_int8) owned by `w`. kInt4: the same
// weights become INT4 copies with one f16 scale per int4_group (32, 64 or 128) inputs
// (ops::quantize_int4; every input dimension must be a multiple of it, which all Qwen3-VL sizes
// are). kNone: nothing. The vision
// tower is not touched, nor is a router or a shared expert's gate. With `store` (the one the views
// came from), each source weight's pages are released (WeightStore::release_pages) once quantized,
// so the process holds the quantized copy rather than both; the bytes stay readable (the embedding
// lookup faults back the rows it reads). On error *w is left as it was.
Status quantize_text_weights(TextWeights* w, WeightQuant quant, ThreadPool& pool,
                             const WeightStore* store = nullptr,
                             int64_t int4_group = kInt4DefaultGroup);

// Copies every matmul weight view of `text` and `vision` that still points into `store`'s
// mappings (all of them as loaded; after quantize_text_weights the text linear weights point to
// their own buffers and are skipped; embed_tokens only when it is a tied lm_head) onto 2 MiB
// pages (HugePageBuffer, see its NOTE on why), repoints the views there and releases the file pages
// (WeightStore::release_pages), so the process holds one copy. Views sharing their bytes (a tied
// lm_head and embed_tokens) share the copy. Returns the buffer, which must outlive the views;
// vision may be null.
Result<HugePageBuffer> copy_weights_to_huge_pages(TextWeights* text, VisionWeights* vision,
                                                  const WeightStore& store);

// Loads and checks every vision-tower tensor ("model.visual.*").
Result<VisionWeights> load_vision_weights(const WeightStore& store, const Qwen3VLConfig& cfg);

}  // namespace vlm
