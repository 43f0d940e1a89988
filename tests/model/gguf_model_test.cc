// GGUF checkpoints (src/model/gguf_checkpoint.h): tiny Qwen3-VL checkpoints converted by
// llama.cpp's own convert_hf_to_gguf.py (tests/model/fixtures/gguf,
// scripts/make_gguf_model_fixtures.py) read back as the checkpoints they came from: every tensor
// equal to the safetensors one under its transformers name (the vision patch embedding's two
// halves joined again, the DeepStack mergers renumbered, the experts unstacked), the
// configuration the same, and the engine's logits and greedy continuations, text and images,
// within 1e-4 of transformers' (the F32 files hold the very weights the references ran). The
// tokenizer read from a GGUF file encodes the tokenizer corpus as tokenizer.json does. Bad files
// and mismatched pairs are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "core/sha256.h"
#include "io/gguf_quants.h"
#include "io/npy.h"
#include "model/gguf_checkpoint.h"
#include "test_util.h"
#include "vlm/engine.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;
const std::string kGguf = kFixtures + "/gguf";
const std::string kImages = std::string(VLM_TESTDATA_DIR) + "/images";

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(test_util::read_file(path));
}

using test_util::rel_err;

std::unique_ptr<Engine> load(const std::string& model, const std::string& mmproj,
                             Precision precision = Precision::kAuto, CpuIsa isa = CpuIsa::kAuto) {
  EngineOptions o;
  o.model_dir = model;
  o.mmproj = mmproj;
  o.precision = precision;
  o.cpu_isa = isa;
  o.n_threads = 2;
  o.prefill_chunk = 16;
  o.kv_cache_dtype = KvCacheDtype::kF32;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Elements of `got` further than tol · max(1, |want|) from `want` (tol 0: equal).
int64_t count_differ(const float* got, const float* want, int64_t n, double tol) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = want[i];
    differ += !(std::fabs(got[i] - w) <= tol * std::max(1.0, std::fabs(w)));
  }
  return differ;
}

// transformers' fused experts against the per-expert [out, in] tensors the GGUF file's stacks
// give. Qwen3-VL (transformers 4.57): gate_up_proj [E, H, 2I] (x · W, gate then up), down_proj
// [E, I, H]; Qwen3.5 (transformers 5, `linear`): gate_up_proj [E, 2I, H], down_proj [E, H, I].
size_t expect_same_experts(const TensorView& fused, const std::string& name, const WeightStore& g,
                           bool linear, double tol) {
  const bool gate_up = name.ends_with("gate_up_proj");
  const std::string p = name.substr(0, name.size() - (gate_up ? 12 : 9));  // "...mlp.experts."
  const int64_t E = fused.dim(0), d1 = fused.dim(1), d2 = fused.dim(2);
  const auto* w = static_cast<const float*>(fused.data);
  size_t compared = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (const char* proj : gate_up ? std::vector<const char*>{"gate_proj", "up_proj"}
                                    : std::vector<const char*>{"down_proj"}) {
      auto got = g.get(p + std::to_string(e) + "." + proj + ".weight");
      EXPECT_TRUE(got.ok()) << got.status().message();
      if (!got.ok()) return compared;
      const int64_t out = got->dim(0), in = got->dim(1);
      const int64_t off = std::strcmp(proj, "up_proj") == 0 ? out : 0;
      std::vector<float> want(static_cast<size_t>(out * in));
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          want[o * in + i] =
              linear ? w[(e * d1 + off + o) * d2 + i] : w[(e * d1 + i) * d2 + off + o];
        }
      }
      EXPECT_EQ(out * in * (gate_up ? 2 : 1), d1 * d2);
      EXPECT_EQ(count_differ(static_cast<const float*>(got->data), want.data(), out * in, tol), 0)
          << proj << " of expert " << e;
      ++compared;
    }
  }
  return compared;
}

// A Gated DeltaNet tensor of transformers' (`name`, its value heads in their order) with its
// value heads in the GGUF converter's (Qwen3VLTextConfig::linear_value_heads_tiled: head g·r + j
// stored as j·nk + g), as the checkpoint keeps them; other tensors as they are.
std::vector<float> tiled_value_heads(const std::string& name, const TensorView& w,
                                     const Qwen3VLTextConfig& t) {
  const auto* src = static_cast<const float*>(w.data);
  std::vector<float> out(src, src + w.numel());
  if (!t.linear_value_heads_tiled || name.find(".linear_attn.") == std::string::npos) return out;
  const int64_t nk = t.linear_num_key_heads, r = t.linear_num_value_heads / nk,
                dv = t.linear_value_head_dim, qk = 2 * nk * t.linear_key_head_dim;
  const int64_t inner = w.shape.back();  // values per row (of 2-D and 3-D tensors)
  // (first row, values per head) of the value-head rows; out_proj's are its columns.
  int64_t row0 = 0, per_head = 0;
  if (name.ends_with("A_log") || name.ends_with("dt_bias")) per_head = 1;
  if (name.ends_with("in_proj_a.weight") || name.ends_with("in_proj_b.weight")) per_head = inner;
  if (name.ends_with("in_proj_z.weight")) per_head = dv * inner;
  if (name.ends_with("in_proj_qkv.weight")) row0 = qk * inner, per_head = dv * inner;
  if (name.ends_with("conv1d.weight")) row0 = qk * inner, per_head = dv * inner;
  if (name.ends_with("out_proj.weight")) {
    for (int64_t i = 0; i < w.shape[0]; ++i) {
      for (int64_t g = 0; g < nk; ++g) {
        for (int64_t j = 0; j < r; ++j) {
          std::copy_n(src + i * inner + (g * r + j) * dv, dv, &out[i * inner + (j * nk + g) * dv]);
        }
      }
    }
    return out;
  }
  for (int64_t g = 0; per_head > 0 && g < nk; ++g) {
    for (int64_t j = 0; j < r; ++j) {
      std::copy_n(src + row0 + (g * r + j) * per_head, per_head,
                  &out[row0 + (j * nk + g) * per_head]);
    }
  }
  return out;
}

// Every tensor of the safetensors checkpoint (and of `extra`, a file of more tensors), under its
// name, from the GGUF files: same shape, f32 values equal (tol 0) or within tol (Qwen3.5: the
// converter stored A_log as -exp(A_log) and norm weights plus 1, which reading undoes).
void expect_same_tensors(const std::string& fixture, const std::string& model,
                         const std::string& mmproj, double tol = 0, bool linear = false,
                         const std::string& extra = "") {
  auto st = WeightStore::open_dir(kFixtures + "/" + fixture);
  ASSERT_TRUE(st.ok()) << st.status().message();
  std::vector<std::pair<std::string, TensorView>> want;
  for (const std::string& name : st->names()) want.emplace_back(name, *st->get(name));
  std::optional<SafetensorsFile> more;
  if (!extra.empty()) {
    auto f = SafetensorsFile::open(extra);
    ASSERT_TRUE(f.ok()) << f.status().message();
    more.emplace(std::move(f).value());
    for (const std::string& name : more->names()) want.emplace_back(name, *more->get(name));
  }
  auto ck = open_gguf_checkpoint(model, mmproj);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  size_t compared = 0;
  for (const auto& [name, w] : want) {
    SCOPED_TRACE(name);
    // A tied checkpoint's lm_head is its embedding; the converter writes it once.
    if (name == "lm_head.weight" && !ck->store->has(name)) continue;
    if (mmproj.empty() && name.starts_with("model.visual.")) continue;  // its vision file's
    ASSERT_EQ(w.dtype, DType::kF32);
    if (name.ends_with("mlp.experts.gate_up_proj") || name.ends_with("mlp.experts.down_proj")) {
      compared += expect_same_experts(w, name, *ck->store, linear, tol);
      continue;
    }
    auto got = ck->store->get(name);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->shape, w.shape);
    ASSERT_EQ(got->dtype, DType::kF32);
    const std::vector<float> want_here = tiled_value_heads(name, w, ck->cfg.text_config);
    EXPECT_EQ(count_differ(static_cast<const float*>(got->data), want_here.data(), w.numel(), tol),
              0);
    ++compared;
  }
  EXPECT_GT(compared, 20u);
}

TEST(GgufCheckpoint, DenseTensorsAndVisionTowerAreTheSafetensorsOnes) {
  expect_same_tensors("vision-f32", kGguf + "/vision-f32.gguf", kGguf + "/vision-f32-mmproj.gguf");
}

TEST(GgufCheckpoint, MoeExpertsAreTheSafetensorsOnes) {
  // The fixture stores one tensor per expert; the GGUF file stacks them [E, I, H].
  expect_same_tensors("moe-f32-tie", kGguf + "/moe-f32-tie.gguf", "");
}

// Qwen3.5: A_log, the conv1d's shape, the (1 + w) norms, the shared expert and the MTP head (the
// converter's extra block) undone; the value heads (twice the key heads here) in its order.
TEST(GgufCheckpoint, Qwen35TensorsAreTheSafetensorsOnes) {
  expect_same_tensors("qwen35-f32-b", kGguf + "/qwen35-f32-b.gguf",
                      kGguf + "/qwen35-f32-b-mmproj.gguf", 2e-6, true);
  expect_same_tensors("qwen35moe-f32-a", kGguf + "/qwen35moe-mtp.gguf", "", 2e-6, true,
                      kFixtures + "/qwen35-mtp/mtp-qwen35moe-f32-a.safetensors");
}

TEST(GgufCheckpoint, ConfigurationIsTheCheckpoints) {
  for (const auto& [fixture, file, mmproj] :
       {std::tuple{"vision-f32", "vision-f32.gguf", "vision-f32-mmproj.gguf"},
        std::tuple{"moe-f32-tie", "moe-f32-tie.gguf", ""},
        std::tuple{"qwen35-f32-b", "qwen35-f32-b.gguf", "qwen35-f32-b-mmproj.gguf"},
        std::tuple{"qwen35moe-f32-a", "qwen35moe-mtp.gguf", ""}}) {
    SCOPED_TRACE(fixture);
    auto want = load_qwen3vl_config(kFixtures + "/" + fixture);
    ASSERT_TRUE(want.ok());
    const std::string vis = *mmproj ? kGguf + "/" + mmproj : std::string();
    auto ck = open_gguf_checkpoint(kGguf + "/" + file, vis);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    const Qwen3VLTextConfig& a = ck->cfg.text_config;
    const Qwen3VLTextConfig& b = want->text_config;
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
    EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
    EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.mrope_section, b.mrope_section);
    EXPECT_FLOAT_EQ(static_cast<float>(a.rope_theta), static_cast<float>(b.rope_theta));
    EXPECT_FLOAT_EQ(static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));
    EXPECT_EQ(a.num_experts, b.num_experts);
    EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
    EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
    EXPECT_EQ(ck->cfg.tie_word_embeddings, want->tie_word_embeddings);
    EXPECT_EQ(a.family, b.family);
    EXPECT_EQ(a.rotary_dims(), b.rotary_dims());
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.zero_centered_norms, b.zero_centered_norms);
    EXPECT_EQ(a.attn_output_gate, b.attn_output_gate);
    EXPECT_EQ(a.layer_types, b.layer_types);
    EXPECT_EQ(a.linear_num_key_heads, b.linear_num_key_heads);
    EXPECT_EQ(a.linear_num_value_heads, b.linear_num_value_heads);
    EXPECT_EQ(a.linear_key_head_dim, b.linear_key_head_dim);
    EXPECT_EQ(a.linear_value_head_dim, b.linear_value_head_dim);
    EXPECT_EQ(a.linear_conv_kernel_dim, b.linear_conv_kernel_dim);
    // A GGUF file's Gated DeltaNet layers run in its value-head order; a config.json's never.
    EXPECT_EQ(a.linear_value_heads_tiled, std::string(file).starts_with("qwen35"));
    EXPECT_FALSE(b.linear_value_heads_tiled);
    EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
    // The MTP file's head (the safetensors fixture keeps it in a file of its own).
    EXPECT_EQ(a.mtp_num_hidden_layers, std::string(file) == "qwen35moe-mtp.gguf" ? 1 : 0);
    EXPECT_EQ(ck->cfg.has_vision, *mmproj != '\0');
    if (ck->cfg.has_vision) {
      const Qwen3VLVisionConfig& v = ck->cfg.vision_config;
      const Qwen3VLVisionConfig& w = want->vision_config;
      EXPECT_EQ(v.depth, w.depth);
      EXPECT_EQ(v.hidden_size, w.hidden_size);
      EXPECT_EQ(v.num_heads, w.num_heads);
      EXPECT_EQ(v.intermediate_size, w.intermediate_size);
      EXPECT_EQ(v.out_hidden_size, w.out_hidden_size);
      EXPECT_EQ(v.num_position_embeddings, w.num_position_embeddings);
      EXPECT_EQ(v.deepstack_visual_indexes, w.deepstack_visual_indexes);
      EXPECT_EQ(ck->cfg.image_token_id, want->image_token_id);
      EXPECT_EQ(ck->cfg.vision_start_token_id, want->vision_start_token_id);
    }
  }
}

// A fixture's text logits and greedy continuations (reference.json) from its GGUF file.
void expect_text_reference(const std::string& fixture, const std::string& model, Engine* e) {
  const std::string dir = kFixtures + "/" + fixture;
  const auto ref = read_json(dir + "/reference.json");
  for (const auto& entry : ref["logits"]) {
    auto ids = entry["ids"].get<std::vector<int32_t>>();
    auto got = e->logits(ids);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto want = read_npy(dir + "/" + entry["file"].get<std::string>());
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(got->size(), want->f32.size());
    EXPECT_LE(rel_err(*got, want->f32), 1e-4) << ids.size() << " ids";
  }
  for (const auto& g : ref["greedy"]) {
    GenerateRequest req;
    req.prompt_ids = g["prompt_ids"].get<std::vector<int32_t>>();
    req.max_new_tokens = g["max_new_tokens"].get<int64_t>();
    req.sampling.do_sample = false;
    req.ignore_eos = true;
    auto res = e->generate(req);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_EQ(res->output_ids, g["output_ids"].get<std::vector<int32_t>>());
  }
}

TEST(GgufModel, TextLogitsAndGreedyMatchTransformers) {
  for (const auto& [fixture, file] : {std::pair{"moe-f32-tie", "moe-f32-tie.gguf"},
                                      std::pair{"qwen35-f32-b", "qwen35-f32-b.gguf"},
                                      std::pair{"qwen35moe-f32-a", "qwen35moe-mtp.gguf"}}) {
    SCOPED_TRACE(file);
    auto e = load(kGguf + "/" + file, "");
    ASSERT_NE(e, nullptr);
    EXPECT_FALSE(e->has_vision());
    bool said_text_only = false;
    for (const std::string& n : e->load_notes())
      said_text_only |= n.find("text only") != std::string::npos;
    EXPECT_TRUE(said_text_only);
    expect_text_reference(fixture, file, e.get());
  }
}

// The MTP head read from the file proposes (--spec mtp), and the reply is the plain one.
TEST(GgufModel, MtpHeadFromTheFileDrafts) {
  EngineOptions o;
  o.model_dir = kGguf + "/qwen35moe-mtp.gguf";
  o.n_threads = 2;
  o.kv_cache_dtype = KvCacheDtype::kF32;
  o.batching.spec.method = SpecMethod::kMtp;
  o.batching.spec.num_tokens = 2;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  expect_text_reference("qwen35moe-f32-a", "qwen35moe-mtp.gguf", e->get());
  // A file without a head refuses --spec mtp by name.
  o.model_dir = kGguf + "/qwen35-f32-b.gguf";
  auto none = Engine::load(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("MTP"), std::string::npos) << none.status().message();
}

TEST(GgufModel, ImageLogitsAndGreedyMatchTransformers) {
  const std::string dir = kFixtures + "/vision-f32";
  auto e = load(kGguf + "/vision-f32.gguf", kGguf + "/vision-f32-mmproj.gguf");
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->has_vision());
  const auto ref = read_json(dir + "/reference.json");
  auto image = [&](const std::string& name) {
    const auto& im = ref["images"][name];
    const std::string src = im["source"];
    ImageInput in;
    in.path = (src.rfind("synthetic", 0) == 0 ? dir : kImages) + "/" + src;
    in.min_pixels = im["min_pixels"].get<int64_t>();
    in.max_pixels = im["max_pixels"].get<int64_t>();
    return in;
  };
  for (const auto& c : ref["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<ImageInput> images;
    for (const auto& name : c["images"]) images.push_back(image(name));
    std::vector<int32_t> expanded;
    auto got = e->logits(c["prompt_ids"].get<std::vector<int32_t>>(), images, &expanded);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(expanded, c["input_ids"].get<std::vector<int32_t>>());
    auto want = read_npy(dir + "/" + c["logits"]["file"].get<std::string>());
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(got->size(), want->f32.size());
    EXPECT_LE(rel_err(*got, want->f32), 1e-4);
    GenerateRequest req;
    req.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    req.images = images;
    req.max_new_tokens = c["greedy"]["max_new_tokens"].get<int64_t>();
    req.sampling.do_sample = false;
    req.ignore_eos = true;
    auto res = e->generate(req);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_EQ(res->output_ids, c["greedy"]["output_ids"].get<std::vector<int32_t>>());
  }
}

TEST(GgufModel, TokenizerAndChatTemplateComeFromTheFile) {
  auto e = load(kGguf + "/vision-f32.gguf", kGguf + "/vision-f32-mmproj.gguf");
  ASSERT_NE(e, nullptr);
  auto demo = Tokenizer::load(std::string(VLM_REPO_DIR) + "/models/tiny-qwen3vl");
  ASSERT_TRUE(demo.ok());
  const Tokenizer* tok = e->tokenizer();
  ASSERT_NE(tok, nullptr);
  const std::string text = "a red circle, 3 blue squares!\n<|im_start|>user\nwhat is it?<|im_end|>";
  EXPECT_EQ(tok->encode(text), (*demo)->encode(text));
  EXPECT_EQ(tok->token_to_id("<|image_pad|>"), std::optional<int32_t>(1000));
  // The converter's tokenizer.chat_template is the demo model's template.
  auto tpl = e->chat_template();
  ASSERT_TRUE(tpl.ok()) << tpl.status().message();
  ChatMessage m;
  m.role = "user";
  m.text = "hi";
  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  auto prompt = (*tpl)->render({m}, opts);
  ASSERT_TRUE(prompt.ok()) << prompt.status().message();
  EXPECT_NE(prompt->find("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << *prompt;
  // A chat turn ends at <|im_end|> (the file's eos) and text at <|endoftext|>.
  const auto& eos = e->eos_token_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), 410), eos.end());
  EXPECT_NE(std::find(eos.begin(), eos.end(), 408), eos.end());
}

// The Qwen3 tokenizer (151,643 tokens, 151,387 merges) as the converter wrote it, against the
// tokenizer.json it came from, on the tokenizer corpus.
TEST(GgufTokenizer, EncodesTheCorpusAsTokenizerJsonDoes) {
  const std::string data = std::string(VLM_TESTDATA_DIR) + "/tokenizer";
  auto f = GgufFile::open(kGguf + "/qwen3-vocab.gguf");
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto text = gguf_tokenizer_json(*f);
  ASSERT_TRUE(text.ok()) << text.status().message();
  auto tok = Tokenizer::from_json(*text, "qwen3-vocab.gguf", std::nullopt, std::nullopt);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto ref = Tokenizer::load(data);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ((*tok)->vocab_size(), (*ref)->vocab_size());
  const auto corpus = read_json(data + "/corpus-a.json");
  size_t n = 0;
  for (const auto& c : corpus) {
    const std::string s = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->encode(s), want) << s;
    EXPECT_EQ((*tok)->decode(want), (*ref)->decode(want)) << s;
    ++n;
  }
  EXPECT_GT(n, 300u);
  for (int32_t id : {151643, 151644, 151645, 151655, 151667}) {
    EXPECT_EQ((*tok)->id_to_token(id), (*ref)->id_to_token(id));
  }
}

// What gguf_tokenizer_json says of a GGUF file's bytes edited in memory (they must parse).
Result<std::string> tokenizer_of(const std::string& bytes) {
  auto f = GgufFile::parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "edited.gguf");
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return f.status();
  return gguf_tokenizer_json(*f);
}

// A tokenizer whose pre-tokenizer vlm does not know is refused by name (the Qwen3 vocabulary
// file with tokenizer.ggml.pre "qwen2" made "llama"), as is one that is not byte-level BPE.
TEST(GgufTokenizer, UnknownPreTokenizersAreRefused) {
  const std::string bytes = test_util::read_file(kGguf + "/qwen3-vocab.gguf");
  for (const auto& [key, from, to, says] :
       {std::tuple{"tokenizer.ggml.pre", "qwen2", "llama", "pre-tokenizer"},
        std::tuple{"tokenizer.ggml.model", "gpt2", "bert", "byte-level BPE"}}) {
    std::string edited = bytes;
    // The key, its type (string) and the value's length, then the value.
    const size_t at = edited.find(key);
    ASSERT_NE(at, std::string::npos);
    const size_t value = at + std::strlen(key) + 4 + 8;
    ASSERT_EQ(edited.compare(value, std::strlen(from), from), 0);
    edited.replace(value, std::strlen(to), to);
    auto json = tokenizer_of(edited);
    ASSERT_FALSE(json.ok());
    EXPECT_NE(json.status().message().find(std::string("'") + to + "'"), std::string::npos)
        << json.status().message();
    EXPECT_NE(json.status().message().find(says), std::string::npos) << json.status().message();
  }
}

// A token that is not UTF-8 (which no tokenizer.json can hold) is refused, not thrown.
TEST(GgufTokenizer, TextThatIsNotUtf8IsRefused) {
  std::string bytes = test_util::read_file(kGguf + "/qwen3-vocab.gguf");
  const size_t at = bytes.find("<|im_start|>");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] = static_cast<char>(0xFF);
  auto json = tokenizer_of(bytes);
  ASSERT_FALSE(json.ok());
  EXPECT_NE(json.status().message().find("not valid UTF-8"), std::string::npos)
      << json.status().message();
}

// A Qwen3.5 file whose stored -exp(A_log) is not negative is refused naming the tensor.
TEST(GgufCheckpoint, APositiveSsmAIsRefused) {
  const std::string path = kGguf + "/qwen35-f32-b.gguf";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  const GgufTensor* a = f->tensor("blk.0.ssm_a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->type, GgmlType::kF32);
  std::string bytes = test_util::read_file(path);
  const float positive = 0.5f;
  std::memcpy(&bytes[f->data_offset() + a->offset], &positive, 4);
  test_util::TempDir tmp;
  const std::string edited = tmp.file("qwen35-f32-b.gguf");
  test_util::write_bytes(edited, bytes);
  auto ck = open_gguf_checkpoint(edited, "");
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.status().message().find("blk.0.ssm_a"), std::string::npos) << ck.status().message();
}

TEST(GgufCheckpoint, BadFilesAndPairsAreRefusedByName) {
  const std::string model = kGguf + "/vision-f32.gguf", mmproj = kGguf + "/vision-f32-mmproj.gguf";
  auto expect_error = [](const Result<GgufCheckpoint>& r, const std::string& part) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().message();
  };
  // The vision file given as the model, the model as the vision file.
  expect_error(open_gguf_checkpoint(mmproj, ""), "architecture 'clip'");
  expect_error(open_gguf_checkpoint(model, model), "clip.projector_type");
  // An architecture vlm does not run from GGUF.
  expect_error(open_gguf_checkpoint(kGguf + "/qwen3-vocab.gguf", ""), "architecture 'qwen3'");
  // A truncated file names itself.
  test_util::TempDir tmp;
  const std::string cut = tmp.file("cut.gguf");
  const std::string bytes = test_util::read_file(model);
  test_util::write_bytes(cut, bytes.substr(0, bytes.size() / 2));
  expect_error(open_gguf_checkpoint(cut, ""), cut);
  // A file that is not GGUF as -m; --mmproj with a safetensors directory.
  {
    EngineOptions o;
    o.model_dir = kFixtures + "/vision-f32/model.safetensors";
    auto e = Engine::load(o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("not a GGUF file"), std::string::npos)
        << e.status().message();
  }
  EngineOptions o;
  o.model_dir = kFixtures + "/vision-f32";
  o.mmproj = mmproj;
  o.require_tokenizer = false;
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--mmproj"), std::string::npos) << e.status().message();
}

// Every quantized type vlm reads, on checkpoints whose rows are 256 wide (the K-quants' super
// blocks apply), quantized by llama.cpp's llama-quantize (--pure): dequantized exactly as the
// format defines (the gguf package's dequantizer, bit for bit), the logits are transformers' on
// those very weights within 1e-4, and the greedy continuation is the same
// (tests/model/fixtures/gguf-quant, scripts/make_gguf_quant_reference.py).
class GgufQuantModel : public ::testing::TestWithParam<std::string> {};

// The BF16 conversion's bound on these checkpoints (weights ~N(0, 0.15), one layer): measured
// 5.5e-3 to 9.6e-3 of max |logit| over the types (each weight moves by up to 2^-8 of itself);
// twice the largest.
constexpr double kBf16Bound = 2e-2;
// x quantized to INT8 per 32 values for the block kernels (Q8_0, K-quants as stored): measured
// 2.0e-2 to 2.6e-2 of max |logit| on the dense checkpoint and 7.4e-2 on the MoE one (whose
// router then picks among near ties); about twice those. (The kernels themselves are exact
// against that quantized x: ggml_matmul_test.)
constexpr double kInt8XBound = 5e-2;
constexpr double kInt8XMoeBound = 0.15;

// (A missing file lists one case, which fails naming it, rather than stopping test discovery.)
const nlohmann::json& quant_reference() {
  static const nlohmann::json r = [] {
    const std::string text = test_util::read_file(kFixtures + "/gguf-quant/reference.json");
    return text.empty() ? nlohmann::json{{"files", {{{"file", "reference_json_missing"}}}}}
                        : nlohmann::json::parse(text);
  }();
  return r;
}

std::vector<std::string> quant_files() {
  std::vector<std::string> out;
  for (const auto& f : quant_reference()["files"]) out.push_back(f["file"]);
  return out;
}

TEST_P(GgufQuantModel, LogitsAndGreedyMatchTransformersOnTheDequantizedWeights) {
  const std::string dir = kFixtures + "/gguf-quant";
  const nlohmann::json* entry = nullptr;
  for (const auto& f : quant_reference()["files"]) {
    if (f["file"] == GetParam()) entry = &f;
  }
  ASSERT_NE(entry, nullptr);
  // --precision f32: the exact path (a BF16 file's products in f32 too, as transformers' f32 run
  // of the same weights).
  auto e = load(dir + "/" + GetParam(), "", Precision::kF32);
  ASSERT_NE(e, nullptr);
  const std::string type = (*entry)["type"];
  // Every tensor decoded as the gguf package decodes it: the SHA-256 of its f32 values.
  auto f = GgufFile::open(dir + "/" + GetParam());
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), (*entry)["tensors"].size());
  for (const GgufTensor& t : f->tensors()) {
    std::vector<float> values(static_cast<size_t>(t.numel()));
    ASSERT_TRUE(dequantize(t, values).ok()) << t.name;
    const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
    EXPECT_EQ(sha256_hex(Sha256::of(std::span<const uint8_t>(bytes, values.size() * 4))),
              (*entry)["tensors"][t.name].get<std::string>())
        << t.name << " (" << ggml_type_name(t.type) << ")";
  }
  // Which types were dequantized is said once; BF16 is read in place.
  bool said = false;
  for (const std::string& n : e->load_notes()) said |= n.find("type " + type) != std::string::npos;
  EXPECT_EQ(said, type != "BF16");
  const auto prompt = quant_reference()["prompt"].get<std::vector<int32_t>>();
  auto got = e->logits(prompt);
  ASSERT_TRUE(got.ok()) << got.status().message();
  auto want = read_npy(dir + "/" + (*entry)["logits"].get<std::string>());
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(got->size(), want->f32.size());
  EXPECT_LE(rel_err(*got, want->f32), 1e-4);
  // Without --precision f32, Q8_0, Q4_K, Q5_K and Q6_K stay as stored and the block kernels
  // multiply them by x quantized to INT8 per 32 values (where the level has them; the baseline
  // level dequantizes rows exactly), which the load says; the other types are decoded and
  // rounded to BF16 (half the memory), which the load says too. The logits move by at most
  // kInt8XBound (kInt8XMoeBound) of max |logit| for the first, kBf16Bound for the second.
  // (Q4_0: repacked bit for bit into --quant int4's layout, whose kernels take INT8 x too.)
  const bool native =
      type == "Q8_0" || type == "Q4_K" || type == "Q5_K" || type == "Q6_K" || type == "Q4_0";
  const bool type_is_moe = GetParam().rfind("moe", 0) == 0;
  if (type != "BF16") {
    auto b = load(dir + "/" + GetParam(), "");
    ASSERT_NE(b, nullptr);
    bool says = false;
    for (const std::string& n : b->load_notes()) {
      says |= n.find(type == "Q4_0" ? "repacked bit for bit"
                     : native       ? "multiplied as stored"
                                    : "BF16") != std::string::npos;
    }
    EXPECT_TRUE(says);
    auto rounded = b->logits(prompt);
    ASSERT_TRUE(rounded.ok()) << rounded.status().message();
    const double err = rel_err(*rounded, want->f32);
    std::printf("[%s] %s: logits within %.2e of max |logit|\n", GetParam().c_str(),
                native ? "blocks as stored, INT8 x" : "BF16-rounded weights", err);
    EXPECT_LE(err, native ? (type_is_moe ? kInt8XMoeBound : kInt8XBound) : kBf16Bound);
  }
  if (native) {
    // At the baseline level the same stored blocks are dequantized exactly, row block by row
    // block: transformers' logits as on the exact path. (Q4_0 as I4: the INT4 kernels widen
    // weights to BF16 for 8 to 31 x rows, within kBf16Bound.)
    auto g = load(dir + "/" + GetParam(), "", Precision::kAuto, CpuIsa::kGeneric);
    ASSERT_NE(g, nullptr);
    auto exact = g->logits(prompt);
    ASSERT_TRUE(exact.ok()) << exact.status().message();
    EXPECT_LE(rel_err(*exact, want->f32), type == "Q4_0" ? kBf16Bound : 1e-4);
  }
  GenerateRequest req;
  req.prompt_ids = quant_reference()["greedy_prompt"].get<std::vector<int32_t>>();
  req.max_new_tokens = 24;
  req.sampling.do_sample = false;
  req.ignore_eos = true;
  auto res = e->generate(req);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->output_ids, (*entry)["greedy"].get<std::vector<int32_t>>());
}

// --quant on a GGUF file leaves its quantized matrices as they are (Q4_K as stored, Q4_0
// repacked as I4) and the model runs; the logits stay within the INT8-x bound.
TEST(GgufQuantModel, QuantOptionKeepsTheFilesQuantization) {
  for (const std::string file : {"dense-Q4_0.gguf", "dense-Q4_K.gguf"}) {
    const nlohmann::json* entry = nullptr;
    for (const auto& f : quant_reference()["files"]) {
      if (f["file"] == file) entry = &f;
    }
    ASSERT_NE(entry, nullptr) << file;
    for (Quant q : {Quant::kInt8, Quant::kInt4}) {
      EngineOptions o;
      o.model_dir = kFixtures + "/gguf-quant/" + file;
      o.n_threads = 2;
      o.kv_cache_dtype = KvCacheDtype::kF32;
      o.quant = q;
      auto e = Engine::load(o);
      ASSERT_TRUE(e.ok()) << file << ": " << e.status().message();
      auto got = (*e)->logits(quant_reference()["prompt"].get<std::vector<int32_t>>());
      ASSERT_TRUE(got.ok()) << got.status().message();
      auto want = read_npy(kFixtures + "/gguf-quant/" + (*entry)["logits"].get<std::string>());
      ASSERT_TRUE(want.ok());
      EXPECT_LE(rel_err(*got, want->f32), kInt8XBound) << file;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryType, GgufQuantModel, ::testing::ValuesIn(quant_files()),
                         [](const auto& info) {
                           return test_util::param_name(info.param.substr(0, info.param.find('.')));
                         });

}  // namespace
}  // namespace vlm
