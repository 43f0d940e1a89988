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
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

std::unique_ptr<Engine> load(const std::string& model, const std::string& mmproj) {
  EngineOptions o;
  o.model_dir = model;
  o.mmproj = mmproj;
  o.n_threads = 2;
  o.prefill_chunk = 16;
  o.kv_cache_dtype = KvCacheDtype::kF32;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// transformers' fused experts (gate_up_proj [E, H, 2I]: x · W, gate then up; down_proj
// [E, I, H]) against the per-expert [out, in] tensors the GGUF file's stacks give.
size_t expect_same_experts(const TensorView& fused, const std::string& name, const WeightStore& g) {
  const bool gate_up = name.ends_with("gate_up_proj");
  const std::string p = name.substr(0, name.size() - (gate_up ? 12 : 9));  // "...mlp.experts."
  const int64_t E = fused.dim(0), rows = fused.dim(1), cols = fused.dim(2);
  const auto* w = static_cast<const float*>(fused.data);
  size_t compared = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (const char* proj : gate_up ? std::vector<const char*>{"gate_proj", "up_proj"}
                                    : std::vector<const char*>{"down_proj"}) {
      auto got = g.get(p + std::to_string(e) + "." + proj + ".weight");
      EXPECT_TRUE(got.ok()) << got.status().message();
      if (!got.ok()) return compared;
      const auto* x = static_cast<const float*>(got->data);
      const int64_t out = got->dim(0), in = got->dim(1);
      const int64_t off = std::strcmp(proj, "up_proj") == 0 ? out : 0;
      EXPECT_EQ(in, rows);
      EXPECT_EQ(gate_up ? 2 * out : out, cols);
      int64_t differ = 0;
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          differ += x[o * in + i] != w[(e * rows + i) * cols + off + o];
        }
      }
      EXPECT_EQ(differ, 0) << proj << " of expert " << e;
      ++compared;
    }
  }
  return compared;
}

// Every tensor of the safetensors checkpoint, under its name, from the GGUF files: same shape,
// same f32 bytes.
void expect_same_tensors(const std::string& fixture, const std::string& model,
                         const std::string& mmproj) {
  auto st = WeightStore::open_dir(kFixtures + "/" + fixture);
  ASSERT_TRUE(st.ok()) << st.status().message();
  auto ck = open_gguf_checkpoint(model, mmproj);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  size_t compared = 0;
  for (const std::string& name : st->names()) {
    SCOPED_TRACE(name);
    auto want = st->get(name);
    ASSERT_TRUE(want.ok());
    // A tied checkpoint's lm_head is its embedding; the converter writes it once.
    if (name == "lm_head.weight" && !ck->store->has(name)) continue;
    if (mmproj.empty() && name.starts_with("model.visual.")) continue;  // its vision file's
    if (name.ends_with("mlp.experts.gate_up_proj") || name.ends_with("mlp.experts.down_proj")) {
      compared += expect_same_experts(*want, name, *ck->store);
      continue;
    }
    auto got = ck->store->get(name);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->shape, want->shape);
    ASSERT_EQ(got->dtype, DType::kF32);
    ASSERT_EQ(want->dtype, DType::kF32);
    EXPECT_EQ(std::memcmp(got->data, want->data, want->nbytes()), 0);
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

TEST(GgufCheckpoint, ConfigurationIsTheCheckpoints) {
  for (const auto& [fixture, mmproj] :
       {std::pair{"vision-f32", "vision-f32-mmproj.gguf"}, std::pair{"moe-f32-tie", ""}}) {
    SCOPED_TRACE(fixture);
    auto want = load_qwen3vl_config(kFixtures + "/" + fixture);
    ASSERT_TRUE(want.ok());
    const std::string vis = *mmproj ? kGguf + "/" + mmproj : std::string();
    auto ck = open_gguf_checkpoint(kGguf + "/" + fixture + ".gguf", vis);
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

TEST(GgufModel, TextLogitsAndGreedyMatchTransformers) {
  const std::string dir = kFixtures + "/moe-f32-tie";
  auto e = load(kGguf + "/moe-f32-tie.gguf", "");
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->has_vision());
  bool said_text_only = false;
  for (const std::string& n : e->load_notes())
    said_text_only |= n.find("text only") != std::string::npos;
  EXPECT_TRUE(said_text_only);
  const auto ref = read_json(dir + "/reference.json");
  for (const auto& entry : ref["logits"]) {
    auto ids = entry["ids"].get<std::vector<int32_t>>();
    auto got = e->logits(ids);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto want = read_npy(dir + "/" + entry["file"].get<std::string>());
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(got->size(), want->f32.size());
    EXPECT_LE(rel_err(*got, want->f32), 1e-4);
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
  const std::string cut =
      (std::filesystem::temp_directory_path() / ("vlm_gguf_cut_" + std::to_string(getpid())))
          .string();
  {
    const std::string bytes = test_util::read_file(model);
    std::ofstream(cut, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  expect_error(open_gguf_checkpoint(cut, ""), cut);
  std::filesystem::remove(cut);
  // --mmproj with a safetensors directory.
  EngineOptions o;
  o.model_dir = kFixtures + "/vision-f32";
  o.mmproj = mmproj;
  o.require_tokenizer = false;
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--mmproj"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace vlm
