// Engine: model loading, and the calls that run requests through its engine core.
#include "vlm/engine.h"

#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <optional>

#include "engine/engine_impl.h"
#include "model/gguf_checkpoint.h"
#include "ops/autotune.h"
#include "ops/cpu_backend.h"
#include "ops/ops.h"
#ifdef VLM_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace vlm {

namespace {

// The one of `values` whose name is `name`.
template <typename E>
std::optional<E> find_named(std::string_view name, std::initializer_list<E> values,
                            const char* (*name_of)(E)) {
  for (E v : values) {
    if (name == name_of(v)) return v;
  }
  return std::nullopt;
}

// The one of `values` named `name`, else "WHAT 'NAME' is not a, b or c".
template <typename E>
Result<E> parse_named(std::string_view name, std::initializer_list<E> values,
                      const char* (*name_of)(E), const char* what) {
  if (auto v = find_named(name, values, name_of)) return *v;
  std::string list;
  size_t i = 0;
  for (E v : values) {
    if (i > 0) list += i + 1 == values.size() ? " or " : ", ";
    list += name_of(v);
    ++i;
  }
  return invalid_argument(std::string(what) + " '" + std::string(name) + "' is not " + list);
}

}  // namespace

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }
const char* quant_name(Quant q) {
  switch (q) {
    case Quant::kNone:
      return "none";
    case Quant::kInt8:
      return "int8";
    case Quant::kInt4:
      return "int4";
    case Quant::kFp8:
      return "fp8";
  }
  return "?";
}
const char* gpu_dtype_name(GpuDtype t) { return t == GpuDtype::kF32 ? "f32" : "bf16"; }
const char* precision_name(Precision p) { return p == Precision::kF32 ? "f32" : "auto"; }
const char* kv_cache_dtype_name(KvCacheDtype t) {
  switch (t) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kF32:
      return "f32";
    case KvCacheDtype::kBF16:
      return "bf16";
    case KvCacheDtype::kInt8:
      return "int8";
  }
  return "?";
}
Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view name) {
  return parse_named(
      name, {KvCacheDtype::kAuto, KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kInt8},
      kv_cache_dtype_name, "KV cache dtype");
}

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kNgram:
      return "ngram";
    case SpecMethod::kDraft:
      return "draft";
    case SpecMethod::kMtp:
      return "mtp";
    case SpecMethod::kCustom:
      return "custom";
  }
  return "?";
}
Result<SpecMethod> parse_spec_method(std::string_view name) {
  return parse_named(name,
                     {SpecMethod::kNone, SpecMethod::kNgram, SpecMethod::kDraft, SpecMethod::kMtp},
                     spec_method_name, "speculative decoding method");
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx2Vnni:
      return "avx2vnni";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}
Result<CpuIsa> parse_cpu_isa(std::string_view name) {
  return parse_named(name,
                     {CpuIsa::kAuto, CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx2Vnni,
                      CpuIsa::kAvx512, CpuIsa::kAvx512Vnni},
                     cpu_isa_name, "CPU ISA level");
}

const char* bf16_gemm_name(Bf16Gemm g) {
  switch (g) {
    case Bf16Gemm::kAuto:
      return "auto";
    case Bf16Gemm::kF32:
      return "f32";
    case Bf16Gemm::kDpbf16:
      return "dpbf16";
    case Bf16Gemm::kAmx:
      return "amx";
  }
  return "?";
}
Result<Bf16Gemm> parse_bf16_gemm(std::string_view name) {
  return parse_named(name, {Bf16Gemm::kAuto, Bf16Gemm::kF32, Bf16Gemm::kDpbf16, Bf16Gemm::kAmx},
                     bf16_gemm_name, "BF16 kernel choice");
}

Result<Device> parse_device(std::string_view name) {
  if (auto d = find_named(name, {Device::kCpu, Device::kCuda}, device_name)) return *d;
  return invalid_argument("unknown device '" + std::string(name) + "' (cpu or cuda)");
}
Result<Quant> parse_quant(std::string_view name) {
  if (auto q =
          find_named(name, {Quant::kNone, Quant::kInt8, Quant::kInt4, Quant::kFp8}, quant_name)) {
    return *q;
  }
  return invalid_argument("unknown quantization '" + std::string(name) +
                          "' (none, int8, int4, or fp8 on the GPU)");
}
Result<Precision> parse_precision(std::string_view name) {
  return parse_named(name, {Precision::kAuto, Precision::kF32}, precision_name, "precision");
}
Result<GpuDtype> parse_gpu_dtype(std::string_view name) {
  return parse_named(name, {GpuDtype::kBF16, GpuDtype::kF32}, gpu_dtype_name, "gpu dtype");
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

namespace {

static_assert(kInt4DefaultGroupSize == kInt4DefaultGroup, "the API's default is the kernels'");

// The options alone, before anything is read: what this build and these values allow.
Status validate_options(const EngineOptions& o) {
  const bool on_gpu = o.device == Device::kCuda;
  if (!int4_group_ok(o.int4_group)) {
    return invalid_argument("--int4-group must be 32, 64 or 128, got " +
                            std::to_string(o.int4_group));
  }
  if (o.int4_group != kInt4DefaultGroupSize && o.quant != Quant::kInt4) {
    return invalid_argument("--int4-group " + std::to_string(o.int4_group) +
                            " applies to --quant int4 only");
  }
  if (o.quant == Quant::kFp8 && (!on_gpu || o.gpu_dtype != GpuDtype::kBF16)) {
    return invalid_argument("--quant fp8 needs --device cuda with bf16 activations");
  }
  if (on_gpu) {
#ifndef VLM_HAVE_CUDA
    return invalid_argument("this vlm was built without the CUDA backend (nvcc was not found)");
#endif
    if (o.quant == Quant::kInt4) {
      return invalid_argument(
          "--quant int4 is CPU-only for now; the GPU runs the weights as "
          "stored (bf16 or f32) or as int8");
    }
    if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1)) {
      return invalid_argument("gpu memory utilization must be in (0, 1]");
    }
  }
  return ok_status();
}

// The CPU's share of the quantization (fp8 is the GPU's own, done there at upload).
WeightQuant host_quant(Quant q) {
  switch (q) {
    case Quant::kInt8:
      return WeightQuant::kInt8;
    case Quant::kInt4:
      return WeightQuant::kInt4;
    case Quant::kNone:
    case Quant::kFp8:
      break;
  }
  return WeightQuant::kNone;
}

// The vision tower's patch geometry from its config (it wins over a preprocessor file's: the two
// agree in real checkpoints), and the video decoder's, which follows it.
void set_vision_geometry(const EngineOptions& options, EngineImpl* impl) {
  impl->preprocess.patch_size = impl->cfg.vision_config.patch_size;
  impl->preprocess.merge_size = impl->cfg.vision_config.spatial_merge_size;
  impl->preprocess.temporal_patch_size = impl->cfg.vision_config.temporal_patch_size;
  impl->video.limits.seek = options.video_seek;
  PreprocessOptions& v = impl->video.config.pixels;
  v.patch_size = impl->preprocess.patch_size;
  v.merge_size = impl->preprocess.merge_size;
  v.temporal_patch_size = impl->preprocess.temporal_patch_size;
  if (v.merge_size != v.temporal_patch_size && impl->video.unsupported.empty()) {
    impl->video.unsupported = "the vision tower's spatial_merge_size " +
                              std::to_string(v.merge_size) + " differs from its " +
                              "temporal_patch_size " + std::to_string(v.temporal_patch_size) +
                              ": Qwen3-VL's video timestamps assume they are equal";
  }
}

// What follows the tokenizer: the eos ids (generation_config.json's; without one, the config's
// and the tokenizer's), the chat template (`tpl`: the checkpoint's, or its error), structured
// output's grammars, the context limit.
void finish_load(const EngineOptions& options, Result<ChatTemplate> tpl, EngineImpl* impl) {
  for (int64_t id : impl->gen.eos_token_id) impl->eos_ids.push_back(static_cast<int32_t>(id));
  if (impl->eos_ids.empty()) {
    for (int64_t id : impl->cfg.eos_token_id) {
      if (id >= 0 && id < impl->cfg.text_config.vocab_size) {
        impl->eos_ids.push_back(static_cast<int32_t>(id));
      }
    }
    const auto tok_eos = impl->tokenizer ? impl->tokenizer->eos_token_id() : std::nullopt;
    if (tok_eos &&
        std::find(impl->eos_ids.begin(), impl->eos_ids.end(), *tok_eos) == impl->eos_ids.end()) {
      impl->eos_ids.push_back(*tok_eos);
    }
  }
  if (impl->tokenizer) {
    // One that does not parse or render is kept as its error: Engine::chat_template() and
    // chat_stream() return it, never a fallback, while raw token ids and logits need no template.
    if (tpl.ok()) {
      impl->chat_template = std::move(tpl).value();
    } else {
      impl->chat_template_error = tpl.status();
    }
    impl->structured =
        std::make_unique<StructuredOutputs>(impl->tokenizer, impl->cfg.text_config.vocab_size);
  }
  const Qwen3VLTextConfig& t = impl->cfg.text_config;
  impl->max_context = options.max_context > 0
                          ? std::min(options.max_context, t.max_position_embeddings)
                          : t.max_position_embeddings;
}

// A GGUF model file and its vision file (EngineOptions::mmproj): the configuration, tokenizer and
// chat template from their metadata, the weights under transformers' names.
Status load_gguf(const EngineOptions& options, EngineImpl* impl) {
  VLM_ASSIGN_OR_RETURN(GgufCheckpoint ck, open_gguf_checkpoint(options.model_dir, options.mmproj,
                                                               options.precision == Precision::kF32,
                                                               options.device == Device::kCpu));
  impl->cfg = ck.cfg;
  impl->store = std::move(ck.store);
  impl->load_notes = ck.notes;
  VLM_ASSIGN_OR_RETURN(
      impl->weights,
      load_text_weights(*impl->store, impl->cfg, options.batching.spec.method == SpecMethod::kMtp,
                        options.pooling_only));
  impl->has_vision = impl->cfg.has_vision;
  if (impl->has_vision) {
    VLM_ASSIGN_OR_RETURN(impl->vision_weights, load_vision_weights(*impl->store, impl->cfg));
    for (int c = 0; c < 3; ++c) {
      if (ck.image_mean.size() == 3)
        impl->preprocess.mean[c] = static_cast<float>(ck.image_mean[c]);
      if (ck.image_std.size() == 3) impl->preprocess.std[c] = static_cast<float>(ck.image_std[c]);
    }
    impl->video.config = default_video_config(impl->preprocess);
    set_vision_geometry(options, impl);
    impl->load_notes.push_back(
        "the GGUF files do not store the image and video sizes (min/max pixels, frame sampling): "
        "Qwen3-VL's defaults apply");
  } else {
    impl->load_notes.push_back("no --mmproj vision file: text only (images and video are refused)");
  }
  if (!ck.tokenizer_json.empty()) {
    VLM_ASSIGN_OR_RETURN(
        std::unique_ptr<Tokenizer> tok,
        Tokenizer::from_json(ck.tokenizer_json, options.model_dir + " (tokenizer.ggml.*)",
                             ck.eos_id, ck.pad_id));
    impl->tokenizer = std::move(tok);
  } else if (options.require_tokenizer) {
    return not_found(options.model_dir + " holds no tokenizer (tokenizer.ggml.tokens)");
  }
  Result<ChatTemplate> tpl = ChatTemplate::builtin();
  if (!options.chat_template.empty()) {
    tpl = ChatTemplate::from_file(options.chat_template);
  } else if (!ck.chat_template.empty()) {
    tpl = ChatTemplate::from_source(ck.chat_template,
                                    options.model_dir + " (tokenizer.chat_template)", ck.bos_token,
                                    ck.eos_token);
  }
  finish_load(options, std::move(tpl), impl);
  return ok_status();
}

// A pre-quantized checkpoint's store in the layouts the loaders read (model/prequant.h): f32 with
// --precision f32, else the CPU's INT4 / INT8 / Q8_0. Refused on the GPU (no kernels proven
// there) and with --quant (the checkpoint is quantized already).
Result<WeightStore> open_prequantized(const EngineOptions& options, WeightStore store,
                                      EngineImpl* impl) {
  const std::string what =
      options.model_dir + " is already quantized (" + impl->cfg.prequant.describe() + ")";
  if (options.device == Device::kCuda) {
    return unimplemented("--device cuda: " + what +
                         ", and vlm has no CUDA kernels for pre-quantized weights yet; run it "
                         "with --device cpu");
  }
  if (options.quant != Quant::kNone) {
    return invalid_argument("--quant " + std::string(quant_name(options.quant)) + ": " + what +
                            "; leave --quant out to run it as it came");
  }
  const PrequantLayout layout =
      options.precision == Precision::kF32 ? PrequantLayout::kExact : PrequantLayout::kFast;
  VLM_ASSIGN_OR_RETURN(PrequantStore p, open_prequant_store(std::move(store), impl->cfg.prequant,
                                                            layout, impl->pool.get()));
  for (std::string& n : p.notes) impl->load_notes.push_back(std::move(n));
  return std::move(p.store);
}

// The checkpoint directory: config, generation config, weights (views into the mapping), the
// preprocessor config and the tokenizer; or a GGUF file.
Status load_checkpoint(const EngineOptions& options, EngineImpl* impl) {
  namespace fs = std::filesystem;
  const std::string& dir = options.model_dir;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    if (is_gguf_file(dir)) return load_gguf(options, impl);
    return invalid_argument(dir +
                            " is a file but not a GGUF file: -m takes a checkpoint "
                            "directory (config.json, *.safetensors) or a .gguf file");
  }
  if (!options.mmproj.empty()) {
    return invalid_argument("--mmproj " + options.mmproj + " goes with a GGUF model file; " + dir +
                            " is not one");
  }
  if (!fs::is_directory(dir, ec)) return not_found("model directory " + dir + " does not exist");
  VLM_ASSIGN_OR_RETURN(impl->cfg, load_qwen3vl_config(dir));
  VLM_ASSIGN_OR_RETURN(impl->gen, load_generation_config(dir));
  {
    VLM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(dir));
    if (impl->cfg.prequant.quantized()) {
      VLM_ASSIGN_OR_RETURN(store, open_prequantized(options, std::move(store), impl));
    }
    impl->store = std::make_unique<WeightStore>(std::move(store));
  }
  VLM_ASSIGN_OR_RETURN(
      impl->weights,
      load_text_weights(*impl->store, impl->cfg, options.batching.spec.method == SpecMethod::kMtp,
                        options.pooling_only));
  if (impl->weights.head_missing) {
    impl->load_notes.push_back(
        "no lm_head.weight (an embedding checkpoint): the model pools, it does not generate");
  }
  // A Qwen3-VL checkpoint carries its vision tower; a plain Qwen3 text export does not.
  impl->has_vision =
      impl->cfg.has_vision && (impl->store->has("model.visual.patch_embed.proj.weight") ||
                               impl->store->has("visual.patch_embed.proj.weight"));
  if (impl->has_vision) {
    VLM_ASSIGN_OR_RETURN(impl->vision_weights, load_vision_weights(*impl->store, impl->cfg));
    const fs::path pp = fs::path(dir) / "preprocessor_config.json";
    if (fs::exists(pp, ec)) {
      VLM_ASSIGN_OR_RETURN(std::string text, read_text_file(pp.string()));
      VLM_ASSIGN_OR_RETURN(impl->preprocess, parse_preprocessor_config(text, pp.string()));
    }
    // Videos: video_preprocessor_config.json, else preprocessor_config.json (transformers falls
    // back to it too), over Qwen3VLVideoProcessor's class defaults.
    impl->video.config = default_video_config(impl->preprocess);
    for (const char* name : {"video_preprocessor_config.json", "preprocessor_config.json"}) {
      const fs::path vp = fs::path(dir) / name;
      if (!fs::exists(vp, ec)) continue;
      // A video setting this engine does not implement leaves images and text served: videos are
      // refused with its reason.
      VLM_ASSIGN_OR_RETURN(std::string text, read_text_file(vp.string()));
      auto parsed = parse_video_preprocessor_config(text, vp.string(), impl->video.config);
      if (parsed.ok()) {
        impl->video.config = *parsed;
      } else {
        impl->video.unsupported = parsed.status().message();
      }
      break;
    }
    set_vision_geometry(options, impl);
  }
  if (fs::exists(fs::path(dir) / "tokenizer.json", ec)) {
    VLM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::load(dir));
    impl->tokenizer = std::move(tok);
  } else if (options.require_tokenizer) {
    return not_found(dir + "/tokenizer.json not found (the model directory needs its tokenizer)");
  }
  // The checkpoint's own chat template (or EngineOptions::chat_template).
  finish_load(options,
              impl->tokenizer == nullptr      ? Result<ChatTemplate>(ChatTemplate::builtin())
              : options.chat_template.empty() ? ChatTemplate::from_model_dir(dir)
                                              : ChatTemplate::from_file(options.chat_template),
              impl);
  return ok_status();
}

// What the CPU multiplies BF16 weights with: the text decoder's choice, and the vision tower's.
struct CpuKernels {
  ops::Bf16Gemm text = ops::Bf16Gemm::kWidenF32;
  std::optional<ops::Bf16Gemm> vision;  // unset: the text decoder's
  ops::DecodeKernels decode;            // the text decoder's one-row products
};

ops::Bf16Gemm gemm_named(const std::string& name) {
  for (ops::Bf16Gemm g : {ops::Bf16Gemm::kDotBf16, ops::Bf16Gemm::kAmx}) {
    if (name == ops::bf16_gemm_name(g)) return g;
  }
  return ops::Bf16Gemm::kWidenF32;
}

// The text decoder's linear weights that decode family f takes, in the order a decode step
// reads them.
std::vector<const TensorView*> decode_weights(const TextWeights& w, ops::DecodeFamily f) {
  std::vector<const TensorView*> out;
  const auto add = [&](const TensorView& v) {
    if (v.data != nullptr && ops::decode_family_takes(f, v.dtype) && v.rank() == 2) {
      out.push_back(&v);
    }
  };
  for (const TextLayerWeights& l : w.layers) {
    for (const TensorView* v : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj}) add(*v);
    const DeltaNetWeights& d = l.delta;  // a Gated DeltaNet layer's (Qwen3.5)
    for (const TensorView* v :
         {&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a, &d.out_proj}) {
      add(*v);
    }
    if (!l.sparse) {
      for (const TensorView* v : {&l.gate_proj, &l.up_proj, &l.down_proj}) add(*v);
      continue;
    }
    for (size_t e = 0; e < l.moe.gate.size(); ++e) {
      add(l.moe.gate[e]);
      add(l.moe.up[e]);
      add(l.moe.down[e]);
    }
    for (const TensorView* v : {&l.moe.shared_gate, &l.moe.shared_up, &l.moe.shared_down}) add(*v);
  }
  add(w.lm_head);
  return out;
}

// --precision f32: the exact kernels (a forced choice that contradicts it is refused). Else forced
// (EngineOptions::bf16_gemm, else VLM_CPU_KERNELS), exact f32 where the weights or the ISA level
// ask for it, else measured on the model's own products (once per CPU, build, threads and shape:
// cached): the text decoder's gate|up at a prefill chunk, and the vision tower's fc1 at 1024
// patches. FP16 arithmetic for the tower stays the user's choice (--vision-fp16): its range is not
// BF16's, which is what the reference runs a BF16 checkpoint in.
Result<CpuKernels> choose_gemm_kernels(const EngineOptions& o, const EngineImpl& m,
                                       std::string* how) {
  CpuKernels k;
  std::optional<ops::Bf16Gemm> forced;
  if (o.bf16_gemm != Bf16Gemm::kAuto) {
    forced = o.bf16_gemm == Bf16Gemm::kDpbf16 ? ops::Bf16Gemm::kDotBf16
             : o.bf16_gemm == Bf16Gemm::kAmx  ? ops::Bf16Gemm::kAmx
                                              : ops::Bf16Gemm::kWidenF32;
    if (o.precision == Precision::kF32 && *forced != ops::Bf16Gemm::kWidenF32) {
      return invalid_argument(std::string("the CPU kernel choice bf16_gemm=") +
                              bf16_gemm_name(o.bf16_gemm) +
                              " contradicts --precision f32 (the exact kernels)");
    }
    if (!ops::bf16_gemm_available(*forced)) {
      return invalid_argument(std::string("the CPU kernel choice bf16_gemm=") +
                              bf16_gemm_name(o.bf16_gemm) + " does not run on this CPU");
    }
  } else if (o.precision != Precision::kF32) {
    VLM_ASSIGN_OR_RETURN(ops::ForcedKernels env, ops::cpu_kernels_from_env());
    forced = env.bf16_gemm;
  }
  if (forced) {
    if (*forced != ops::Bf16Gemm::kWidenF32 && m.isa < ops::Isa::kAvx512) {
      return invalid_argument(std::string("the CPU kernel choice bf16_gemm=") +
                              ops::bf16_gemm_name(*forced) +
                              " needs the avx512 ISA level, which is capped below it here");
    }
    *how = std::string("bf16_gemm: ") + ops::bf16_gemm_name(*forced) + " (forced)";
    k.text = *forced;
    return k;
  }
  const Qwen3VLTextConfig& t = m.cfg.text_config;
  const bool bf16_weights = !decode_weights(m.weights, ops::DecodeFamily::kBf16).empty();
  const char* why = o.precision == Precision::kF32 ? "--precision f32"
                    : !bf16_weights                ? "weights not BF16"
                    : !o.autotune                  ? "--no-autotune"
                    : m.isa < ops::Isa::kAvx512    ? "the CPU ISA level is below avx512"
                    : !ops::bf16_gemm_available(ops::Bf16Gemm::kDotBf16) &&
                            !ops::bf16_gemm_available(ops::Bf16Gemm::kAmx)
                        ? "no other candidate on this CPU"
                        : nullptr;
  if (why != nullptr) {
    *how = std::string("bf16_gemm: f32 (") + why + ")";
    return k;
  }
  const int64_t M = std::clamp<int64_t>(o.prefill_chunk, 32, 256);
  // The gate|up product's width: the dense MLP's, else (every layer a mixture of experts) the
  // shared expert's or an expert's.
  const int64_t I = t.intermediate_size > 0
                        ? t.intermediate_size
                        : std::max(t.shared_expert_intermediate_size, t.moe_intermediate_size);
  const int64_t N = std::max<int64_t>(std::min<int64_t>(2 * I, 4096) / 16 * 16, 16);
  VLM_ASSIGN_OR_RETURN(ops::KernelChoice c, ops::choose_bf16_gemm(*m.pool, m.isa, M, t.hidden_size,
                                                                  N, ops::kernel_cache_dir()));
  *how = ops::describe(c);
  k.text = gemm_named(c.chosen);
  const bool vision_bf16 = m.has_vision && !m.vision_weights.blocks.empty() &&
                           m.vision_weights.blocks.front().fc1.dtype == DType::kBF16;
  if (vision_bf16 && !o.vision_fp16) {  // --vision-fp16 asks for FP16 arithmetic there
    const Qwen3VLVisionConfig& v = m.cfg.vision_config;
    const int64_t Nv =
        std::max<int64_t>(std::min<int64_t>(v.intermediate_size, 4096) / 16 * 16, 16);
    VLM_ASSIGN_OR_RETURN(ops::KernelChoice vc,
                         ops::choose_bf16_gemm(*m.pool, m.isa, 1024, v.hidden_size, Nv,
                                               ops::kernel_cache_dir(), "vision_gemm"));
    *how += "; " + ops::describe(vc);
    k.vision = gemm_named(vc.chosen);
  }
  return k;
}

// The decode kernel of family f (ops.h: DecodeKernels) for its weights ws: forced by
// VLM_CPU_KERNELS (a candidate that is not exact contradicts --precision f32), else the default
// without autotune or where it is the only candidate, else measured on the model's own weights
// (cached as the GEMM's choice is). Appends how it was chosen to *how.
Result<int> pick_decode_kernel(const EngineOptions& o, const EngineImpl& m, ops::DecodeFamily f,
                               const std::vector<const TensorView*>& ws,
                               const ops::ForcedKernels& env, std::string* how) {
  const auto cands = ops::decode_candidates(f);
  const std::string family = ops::decode_family_name(f);
  if (const std::optional<int>& pick = env.decode[static_cast<int>(f)]; pick) {
    const std::string item = family + "=" + cands[*pick].name;
    if (!ops::decode_candidate_runs(f, *pick, m.isa)) {
      return invalid_argument("the CPU kernel choice " + item + " does not run at the " +
                              ops::isa_name(m.isa) + " ISA level");
    }
    if (o.precision == Precision::kF32 && !cands[*pick].exact) {
      return invalid_argument("the CPU kernel choice " + item +
                              " contradicts --precision f32 (the exact kernels)");
    }
    *how += "; " + item + " (forced)";
    return *pick;
  }
  int runnable = 0;
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    runnable += ops::decode_candidate_runs(f, i, m.isa) &&
                (o.precision != Precision::kF32 || cands[i].exact);
  }
  if (!o.autotune || runnable < 2) {
    *how += "; " + family + ": " + cands[0].name + " (" +
            (!o.autotune ? "--no-autotune" : "the only candidate here") + ")";
    return 0;
  }
  VLM_ASSIGN_OR_RETURN(
      ops::KernelChoice c,
      ops::choose_decode_kernel(*m.pool, m.isa, f, ws, o.precision == Precision::kF32,
                                ops::kernel_cache_dir()));
  *how += "; " + ops::describe(c);
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    if (c.chosen == cands[i].name) return i;
  }
  return 0;
}

// The choices, and (*how) how they were made; (*names) the names alone ("bf16_gemm=dpbf16,...",
// then each decode family that takes some of the text decoder's weights).
Result<CpuKernels> choose_cpu_kernels(const EngineOptions& o, const EngineImpl& m, std::string* how,
                                      std::string* names) {
  VLM_ASSIGN_OR_RETURN(CpuKernels k, choose_gemm_kernels(o, m, how));
  *names = std::string("bf16_gemm=") + ops::bf16_gemm_name(k.text);
  if (k.vision) *names += std::string(",vision_gemm=") + ops::bf16_gemm_name(*k.vision);
  VLM_ASSIGN_OR_RETURN(ops::ForcedKernels env, ops::cpu_kernels_from_env());
  for (ops::DecodeFamily f : ops::kDecodeFamilies) {
    const std::vector<const TensorView*> ws = decode_weights(m.weights, f);
    if (ws.empty()) continue;
    VLM_ASSIGN_OR_RETURN(k.decode.of(f), pick_decode_kernel(o, m, f, ws, env, how));
    *names += std::string(",") + ops::decode_family_name(f) + "=" +
              ops::decode_candidates(f)[k.decode.of(f)].name;
  }
  return k;
}

// The KV cache's type from EngineOptions::kv_cache_dtype: auto is BF16 on the CPU for a BF16
// checkpoint (else f32) and the activation type on a device.
Result<DType> resolve_kv_dtype(const EngineImpl& m) {
  const ops::Backend& be = m.decoder->backend();
  const bool cpu = be.device() == ops::Device::kCpu;
  DType t = DType::kF32;
  switch (m.opts.kv_cache_dtype) {
    case KvCacheDtype::kAuto:
      // (A GGUF file's quantized table, as stored or its Q4_0 repacked as I4, stands for the
      // BF16 checkpoint it was made from.)
      t = !cpu ? be.act_dtype()
          : m.weights.embed_tokens.dtype == DType::kBF16 ||
                  is_ggml_block(m.weights.embed_tokens.dtype) ||
                  m.weights.embed_tokens.dtype == DType::kI4
              ? DType::kBF16
              : DType::kF32;
      break;
    case KvCacheDtype::kF32:
      t = DType::kF32;
      break;
    case KvCacheDtype::kBF16:
      t = DType::kBF16;
      break;
    case KvCacheDtype::kInt8:
      t = DType::kI8;
      break;
  }
  if (!be.supports_kv_dtype(t)) {
    return invalid_argument(std::string("--kv-cache-dtype ") +
                            kv_cache_dtype_name(m.opts.kv_cache_dtype) + " is not available on " +
                            (cpu ? "the CPU" : "this device") +
                            " (on cuda the KV cache is in the activation type: bf16, or f32 with "
                            "--gpu-dtype f32)");
  }
  return t;
}

// The backend the model runs on: the CPU at the chosen ISA level, or the GPU.
Result<std::unique_ptr<ops::Backend>> build_backend(const EngineOptions& options, ThreadPool& pool,
                                                    ops::Isa isa, const CpuKernels& kernels) {
  if (options.device == Device::kCuda) {
#ifdef VLM_HAVE_CUDA
    ops::CudaBackendOptions co;
    co.f32 = options.gpu_dtype == GpuDtype::kF32;
    co.fp8 = options.quant == Quant::kFp8;
    co.max_tokens = std::max<int64_t>(1, options.prefill_chunk);
    return ops::make_cuda_backend(co);
#endif
  }
  auto cpu = std::make_unique<ops::CpuBackend>(pool, isa, kernels.text);
  cpu->set_decode_kernels(kernels.decode);
  return std::unique_ptr<ops::Backend>(std::move(cpu));
}

}  // namespace

namespace {

// A checkpoint made ready to run, without an engine core: the weights (quantized as asked, on
// huge pages), the kernels, the backend, the text decoder and the vision tower. `pool`: the
// threads to run on (null: a new pool of options.n_threads).
Result<std::unique_ptr<EngineImpl>> load_model(const EngineOptions& options,
                                               std::shared_ptr<ThreadPool> pool) {
  const bool on_gpu = options.device == Device::kCuda;
  auto impl = std::make_unique<EngineImpl>();
  impl->opts = options;
  impl->isa = ops::detected_isa();
  if (options.cpu_isa != CpuIsa::kAuto) {
    bool found = false;
    for (ops::Isa isa : ops::runnable_isas()) {
      if (std::string_view(cpu_isa_name(options.cpu_isa)) == ops::isa_name(isa)) {
        impl->isa = isa;
        found = true;
      }
    }
    if (!found) {
      return invalid_argument(std::string("the CPU ISA level ") + cpu_isa_name(options.cpu_isa) +
                              " does not run on this CPU");
    }
  }
  impl->pool = pool ? std::move(pool) : std::make_shared<ThreadPool>(options.n_threads);
  VLM_RETURN_IF_ERROR(load_checkpoint(options, impl.get()));
  if (on_gpu && impl->cfg.text_config.family == ModelFamily::kQwen35) {
    return unimplemented("--device cuda: Qwen3.5 (model_type " + impl->cfg.model_type +
                         ") has no CUDA kernels yet (its Gated DeltaNet layers are proven on the "
                         "CPU only); run it with --device cpu");
  }
  if (options.quant == Quant::kFp8 && impl->cfg.text_config.num_experts > 0) {
    return invalid_argument(
        "--quant fp8 has no expert kernels for a mixture of experts; use --quant int8");
  }
  VLM_RETURN_IF_ERROR(
      quantize_text_weights(&impl->weights, host_quant(options.quant), *impl->pool,
                            impl->store.get(), options.int4_group)
          .with_context(std::string("quantizing the text decoder to ") + quant_name(options.quant) +
                        (options.quant == Quant::kInt4
                             ? " (--int4-group " + std::to_string(options.int4_group) + ")"
                             : std::string())));
  if (!options.mmap_weights && !on_gpu) {
    VLM_ASSIGN_OR_RETURN(
        impl->weight_pages,
        copy_weights_to_huge_pages(
            &impl->weights, impl->has_vision ? &impl->vision_weights : nullptr, *impl->store));
  }
  CpuKernels kernels;
  if (!on_gpu) {
    VLM_ASSIGN_OR_RETURN(
        kernels, choose_cpu_kernels(options, *impl, &impl->cpu_kernels, &impl->cpu_kernel_choice));
  }
  VLM_ASSIGN_OR_RETURN(impl->backend, build_backend(options, *impl->pool, impl->isa, kernels));
  const int64_t chunk = std::max<int64_t>(1, options.prefill_chunk);
  VLM_ASSIGN_OR_RETURN(impl->decoder,
                       TextDecoder::create(impl->cfg, impl->weights, *impl->backend, chunk)
                           .with_context(std::string("loading the text decoder on ") +
                                         ops::device_name(impl->backend->device())));
  if (impl->has_vision) {
    VLM_ASSIGN_OR_RETURN(impl->vision,
                         VisionEncoder::create(impl->cfg, impl->vision_weights, *impl->backend,
                                               options.vision_fp16, kernels.vision)
                             .with_context(std::string("loading the vision tower on ") +
                                           ops::device_name(impl->backend->device())));
    // A backend that patchifies takes the resized image (a quarter of the f32 patches' bytes).
    if (impl->vision->takes_rgb()) impl->preprocess.patchify = false;
  }
  return impl;
}

// Why `draft` cannot propose for `target`, or ok: the same tokenizer (every id the same token,
// the same special ids), or without tokenizers the same vocabulary size; the same image and video
// ids; and, where the target takes images and the draft sees them too, the same patch geometry
// (the draft's tower runs on the target's preprocessed pixels: an image is as many tokens at the
// same positions for both).
Status check_draft(const EngineImpl& target, const EngineImpl& draft, const std::string& dir) {
  const std::string refused = "the draft model " + dir + " cannot propose for this model: ";
  const Tokenizer* t = target.tokenizer.get();
  const Tokenizer* d = draft.tokenizer.get();
  if ((t == nullptr) != (d == nullptr)) {
    return invalid_argument(refused + (t ? "it has no tokenizer.json"
                                         : "it has a tokenizer.json "
                                           "and this model has none"));
  }
  if (t != nullptr) {
    if (t->vocab_size() != d->vocab_size()) {
      return invalid_argument(refused + "its tokenizer has " + std::to_string(d->vocab_size()) +
                              " tokens, this model's " + std::to_string(t->vocab_size()));
    }
    for (int32_t id = 0; id < t->vocab_size(); ++id) {
      if (t->token_bytes(id) != d->token_bytes(id) || t->is_special(id) != d->is_special(id)) {
        return invalid_argument(refused + "its tokenizer differs at id " + std::to_string(id) +
                                " (" + d->id_to_token(id) + " where this model has " +
                                t->id_to_token(id) + ")");
      }
    }
  } else if (target.cfg.text_config.vocab_size != draft.cfg.text_config.vocab_size) {
    return invalid_argument(
        refused + "its vocabulary is " + std::to_string(draft.cfg.text_config.vocab_size) +
        " ids, this model's " + std::to_string(target.cfg.text_config.vocab_size));
  }
  const Qwen3VLConfig& a = target.cfg;
  const Qwen3VLConfig& b = draft.cfg;
  if (b.text_config.vocab_size < a.text_config.vocab_size) {
    return invalid_argument(refused + "its embedding has " +
                            std::to_string(b.text_config.vocab_size) +
                            " rows, fewer than this "
                            "model's " +
                            std::to_string(a.text_config.vocab_size) + " ids");
  }
  if (a.image_token_id != b.image_token_id || a.video_token_id != b.video_token_id ||
      a.vision_start_token_id != b.vision_start_token_id) {
    return invalid_argument(refused + "its image and video token ids differ");
  }
  if (target.has_vision && draft.has_vision) {
    const auto& va = a.vision_config;
    const auto& vb = b.vision_config;
    if (va.patch_size != vb.patch_size || va.spatial_merge_size != vb.spatial_merge_size ||
        va.temporal_patch_size != vb.temporal_patch_size) {
      return invalid_argument(refused +
                              "its vision tower cuts images otherwise (the patch, merge or "
                              "temporal patch size differs)");
    }
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  VLM_RETURN_IF_ERROR(validate_options(options));
  // NOTE(vlm): allocations of 4 MiB and more (decoded images above all) go straight to mmap and
  // back to the system when freed. glibc's default raises that threshold to the size of the
  // last large block freed (up to 32 MiB) and then serves such blocks from per-thread arenas,
  // which keep them: every thread that once decoded a large image (each HTTP worker) would hold
  // its size for good, whatever the in-flight pixel budget says.
  static const bool kMmapThreshold = [] { return mallopt(M_MMAP_THRESHOLD, 4 << 20) == 1; }();
  (void)kMmapThreshold;
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, load_model(options, nullptr));
  const SpecOptions& spec = options.batching.spec;
  if (spec.method == SpecMethod::kDraft) {
    if (spec.draft_model.empty()) {
      return invalid_argument(
          "--spec draft needs the draft model's directory (--spec-draft-model)");
    }
    EngineOptions d = options;
    d.model_dir = spec.draft_model;
    d.mmproj.clear();  // the target's vision file is not the draft's
    d.chat_template.clear();
    d.batching = BatchingOptions{};
    d.on_step = nullptr;
    d.on_encode = nullptr;
    VLM_ASSIGN_OR_RETURN(impl->draft,
                         load_model(d, impl->pool).with_context("loading the draft model"));
    VLM_RETURN_IF_ERROR(check_draft(*impl, *impl->draft, spec.draft_model));
  } else if (!spec.draft_model.empty()) {
    return invalid_argument("--spec-draft-model is for --spec draft (the method is " +
                            std::string(spec_method_name(spec.method)) + ")");
  }
  CoreModel core_model = impl->core_model();
  VLM_ASSIGN_OR_RETURN(core_model.kv_dtype, resolve_kv_dtype(*impl));
  if (impl->draft) {
    VLM_ASSIGN_OR_RETURN(core_model.draft.kv_dtype, resolve_kv_dtype(*impl->draft));
  }
  VLM_ASSIGN_OR_RETURN(impl->core, EngineCore::create(std::move(core_model), options.batching,
                                                      options.on_step, options.on_encode));
  // The load's transient heap (the tokenizer's and the checkpoint's parse) goes back to the
  // system rather than staying resident in the heap's free pages.
  malloc_trim(0);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const Tokenizer* Engine::tokenizer() const { return impl_->tokenizer.get(); }
int64_t Engine::vocab_size() const { return impl_->cfg.text_config.vocab_size; }
int64_t Engine::max_context() const { return impl_->max_context; }
const std::vector<int32_t>& Engine::eos_token_ids() const { return impl_->eos_ids; }
// The public level of the kernels in use: the op layer's levels have the same names.
CpuIsa Engine::cpu_isa() const { return parse_cpu_isa(ops::isa_name(impl_->isa)).value(); }
Quant Engine::quant() const { return impl_->opts.quant; }
std::string Engine::checkpoint_quantization() const {
  return impl_->cfg.prequant.quantized() ? impl_->cfg.prequant.describe() : std::string();
}
bool Engine::vision_fp16() const { return impl_->vision != nullptr && impl_->vision->fp16(); }
int Engine::n_threads() const { return impl_->pool->n_threads(); }
int64_t Engine::decode_weight_bytes() const { return impl_->decoder->decode_weight_bytes(); }
int64_t Engine::decode_weight_count() const { return impl_->decoder->decode_weight_count(); }
int64_t Engine::decode_state_bytes() const { return impl_->decoder->decode_state_bytes(); }
std::string Engine::device() const { return impl_->backend->description(); }

const std::string& Engine::cpu_kernels() const { return impl_->cpu_kernels; }
const std::string& Engine::cpu_kernel_choice() const { return impl_->cpu_kernel_choice; }
const std::vector<std::string>& Engine::load_notes() const { return impl_->load_notes; }

int64_t Engine::cuda_graph_replays() const { return impl_->graph_replays.load(); }

bool Engine::gpu_stats(GpuStats* out) const {
  ops::DeviceStats s;
  if (!impl_->backend->device_stats(&s)) return false;
  out->utilization_percent = s.utilization_percent;
  out->memory_used = s.memory_used;
  out->memory_total = s.memory_total;
  out->power_watts = s.power_watts;
  return true;
}
bool Engine::has_vision() const { return impl_->has_vision; }

Result<std::vector<float>> Engine::logits(std::span<const int32_t> ids) {
  return logits(ids, {}, nullptr);
}

Result<std::vector<float>> Engine::logits(std::span<const int32_t> ids,
                                          const std::vector<ImageInput>& images,
                                          std::vector<int32_t>* expanded_ids) {
  LogitsOptions o;
  o.expanded_ids = expanded_ids;
  return logits(ids, images, o);
}

Result<std::vector<float>> Engine::logits(std::span<const int32_t> ids,
                                          const std::vector<ImageInput>& images,
                                          const LogitsOptions& options) {
  if (ids.empty()) return invalid_argument("no token ids given");
  GenerateRequest req;
  req.videos = options.videos;
  req.prompt_ids.assign(ids.begin(), ids.end());
  req.images = images;
  // A prefill-only request (PromptOutputs::logits): it ends once its prompt is computed and
  // samples nothing, but like every request its budget holds one token past the prompt.
  req.max_new_tokens = 1;
  req.ignore_eos = true;
  req.sampling.do_sample = false;
  std::vector<float> out;
  std::vector<int32_t> expanded;
  VLM_ASSIGN_OR_RETURN(
      auto stream,
      impl_->core->submit(std::move(req), {}, {&out, &expanded, options.read_prefix_cache}));
  RequestOutput piece;
  while (stream->next(&piece)) {
    if (!piece.error.ok()) return piece.error;
    if (piece.finished && options.cached_tokens != nullptr)
      *options.cached_tokens = piece.stats.cached_tokens;
  }
  if (options.expanded_ids) *options.expanded_ids = std::move(expanded);
  return out;
}

Result<std::vector<int32_t>> Engine::prompt_tokens(GenerateRequest request) const {
  return impl_->core->prompt_tokens(std::move(request));
}

Result<std::unique_ptr<RequestStream>> Engine::submit(GenerateRequest request,
                                                      std::function<void()> notify) {
  return impl_->core->submit(std::move(request), std::move(notify));
}

Engine::CoreStats Engine::core_stats() const { return impl_->core->stats(); }
std::chrono::steady_clock::time_point Engine::last_heartbeat() const {
  return impl_->core->last_heartbeat();
}
void Engine::wait_idle() { impl_->core->wait_idle(); }

Result<GenerateResult> Engine::generate(const GenerateRequest& req,
                                        const std::function<bool(const TokenEvent&)>& on_token) {
  if (req.pooling.enabled) {
    return invalid_argument(
        "a pooling request has no reply to generate: submit() it and read "
        "the final piece's pooled_hidden / pooled_logits");
  }
  VLM_ASSIGN_OR_RETURN(auto stream, submit(req));
  GenerateResult res;
  res.output_ids.reserve(static_cast<size_t>(stream->max_new_tokens()));
  RequestOutput piece;
  while (stream->next(&piece)) {
    if (!piece.error.ok()) return piece.error;
    if (piece.token_id >= 0) res.output_ids.push_back(piece.token_id);
    res.text += piece.text;
    if (piece.finished) res.finish_reason = piece.finish_reason;
    // Every piece carries the stats so far: a reply stopped by the callback keeps them too.
    const RequestStats& st = piece.stats;
    res.prompt_tokens = st.prompt_tokens;
    res.vision_tokens = st.vision_tokens;
    res.image_decode_ms = st.image_decode_ms;
    res.video_decode_ms = st.video_decode_ms;
    res.video_frames = st.video_frames;
    res.video_tokens = st.video_tokens;
    res.preprocess_ms = st.preprocess_ms;
    res.vision_encode_ms = st.encode_ms;
    res.prefill_ms = st.prefill_ms;
    res.decode_ms = st.decode_ms;
    // The callback sees each token with the text it completes (the last one with the text held
    // back until the end); a piece without a token is passed on only when it carries text.
    if (on_token && (piece.token_id >= 0 || !piece.text.empty())) {
      TokenEvent ev;
      ev.token_id = piece.token_id;
      ev.text = piece.text;
      if (!on_token(ev)) {
        stream->cancel();
        res.finish_reason = FinishReason::kNone;
        break;
      }
    }
  }
  return res;
}

}  // namespace vlm
