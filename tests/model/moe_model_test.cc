// The mixture-of-experts decoder (qwen3_vl_moe) beyond the text fixtures that text_model_test and
// quant_test run: an image prompt against transformers, the expert layouts and their split at
// load, the weights a decode step reads, and what the backends refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixture_model.h"
#include "io/npy.h"
#include "ops/ops.h"
#include "test_util.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;

nlohmann::json reference(const std::string& name) {
  std::ifstream f(kFixtures + "/" + name + "/reference.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::unique_ptr<Engine> engine(const std::string& name, ops::Isa isa, Quant quant = Quant::kNone) {
  EngineOptions o = test_util::fixture_engine_options(name);
  o.prefill_chunk = 16;  // the image prompt (21 ids) spans two chunks
  o.cpu_isa = parse_cpu_isa(ops::isa_name(isa)).value();
  o.quant = quant;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

class MoeImage : public ::testing::TestWithParam<ops::Isa> {};

// An image through the vision tower and DeepStack into a decoder with sparse layers.
TEST_P(MoeImage, LogitsAndGreedyContinuationMatchTransformers) {
  const std::string name = "moe-f32-e8k2";
  auto e = engine(name, GetParam());
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->has_vision());
  const auto ref = reference(name);
  ASSERT_EQ(ref["image_cases"].size(), 1u);
  const auto& c = ref["image_cases"][0];
  ImageInput image;
  image.path = kFixtures + "/" + name + "/" + c["image"].get<std::string>();
  image.min_pixels = c["min_pixels"].get<int64_t>();
  image.max_pixels = c["max_pixels"].get<int64_t>();
  const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();

  std::vector<int32_t> expanded;
  auto got = e->logits(prompt, {image}, &expanded);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(expanded, c["input_ids"].get<std::vector<int32_t>>());
  auto want = read_npy(kFixtures + "/" + name + "/" + c["logits"].get<std::string>());
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_EQ(got->size(), want->f32.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got->size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>((*got)[i]) - want->f32[i]));
    den = std::max(den, std::fabs(static_cast<double>(want->f32[i])));
  }
  EXPECT_LE(num / den, 1e-4);

  GenerateRequest req;
  req.prompt_ids = prompt;
  req.images.push_back(image);
  req.max_new_tokens = c["greedy"]["max_new_tokens"].get<int64_t>();
  req.sampling.do_sample = false;
  req.ignore_eos = true;
  auto res = e->generate(req);
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->output_ids, c["greedy"]["output_ids"].get<std::vector<int32_t>>());
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, MoeImage, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

// transformers 5.x writes a Qwen3-VL MoE config's expert count as num_local_experts (GPTQModel's
// checkpoints have it so): read as num_experts; the two disagreeing is an error.
TEST(MoeConfig, NumLocalExpertsIsTheExpertCount) {
  auto j = nlohmann::json::parse(test_util::read_file(kFixtures + "/moe-f32-e8k2/config.json"));
  j["text_config"].erase("num_experts");
  j["text_config"]["num_local_experts"] = 8;
  auto c = parse_qwen3vl_config(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->text_config.num_experts, 8);
  j["text_config"]["num_experts"] = 6;
  auto bad = parse_qwen3vl_config(j.dump(), "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_experts 6 and num_local_experts 8 disagree"),
            std::string::npos)
      << bad.status().message();
}

// The fused layout is viewed at load and split into per-expert [out, in] matrices, transposed
// exactly (kept as stored) or quantized; the per-expert layout loads as views.
TEST(MoeWeights, FusedExpertsSplitIntoTheirTransposes) {
  auto m = test_util::load_fixture_model(kFixtures + "/moe-f32-e8k2");
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Qwen3VLTextConfig& t = m->cfg.text_config;
  ASSERT_EQ(t.num_experts, 8);
  ASSERT_EQ(t.num_experts_per_tok, 2);
  ASSERT_EQ(t.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_TRUE(m->text.layers[0].sparse);
  EXPECT_FALSE(m->text.layers[1].sparse);
  EXPECT_TRUE(m->text.layers[2].sparse);
  ASSERT_TRUE(has_fused_experts(m->text));
  const TensorView fused = m->text.layers[2].moe.fused_gate_up;    // [E, H, 2I]
  const TensorView fused_down = m->text.layers[2].moe.fused_down;  // [E, I, H]
  const int64_t H = t.hidden_size, I = t.moe_intermediate_size;
  ASSERT_EQ(fused.shape, (std::vector<int64_t>{8, H, 2 * I}));

  // A decoder refuses weights whose experts were not split.
  ThreadPool pool(2);
  {
    ops::CpuBackend be(pool);
    auto d = TextDecoder::create(m->cfg, m->text, be, 8);
    EXPECT_FALSE(d.ok());
  }

  TextWeights kept = m->text;
  ASSERT_TRUE(quantize_text_weights(&kept, WeightQuant::kNone, pool).ok());
  EXPECT_FALSE(has_fused_experts(kept));
  ASSERT_NE(kept.expert_copies, nullptr);
  const MoeWeights& x = kept.layers[2].moe;
  ASSERT_EQ(x.gate.size(), 8u);
  const auto* src = static_cast<const float*>(fused.data);
  const auto* src_down = static_cast<const float*>(fused_down.data);
  for (int64_t e : {0, 5, 7}) {
    ASSERT_EQ(x.gate[e].shape, (std::vector<int64_t>{I, H}));
    ASSERT_EQ(x.down[e].shape, (std::vector<int64_t>{H, I}));
    const auto* g = static_cast<const float*>(x.gate[e].data);
    const auto* u = static_cast<const float*>(x.up[e].data);
    const auto* d = static_cast<const float*>(x.down[e].data);
    for (int64_t i = 0; i < I; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(g[i * H + h], src[(e * H + h) * 2 * I + i]);
        ASSERT_EQ(u[i * H + h], src[(e * H + h) * 2 * I + I + i]);
        ASSERT_EQ(d[h * I + i], src_down[(e * I + i) * H + h]);
      }
    }
  }
  // The routers stay as stored; the experts become INT8 like the dense products.
  TextWeights q = m->text;
  ASSERT_TRUE(quantize_text_weights(&q, WeightQuant::kInt8, pool).ok());
  EXPECT_EQ(q.layers[2].moe.router.dtype, DType::kF32);
  EXPECT_EQ(q.layers[2].moe.router.data, m->text.layers[2].moe.router.data);
  EXPECT_EQ(q.layers[2].moe.gate[3].dtype, DType::kI8);
  EXPECT_EQ(q.layers[2].moe.down[3].dtype, DType::kI8);
  EXPECT_EQ(q.layers[1].gate_proj.dtype, DType::kI8);

  auto per = test_util::load_fixture_model(kFixtures + "/moe-f32-e16k4");
  ASSERT_TRUE(per.ok()) << per.status().message();
  EXPECT_FALSE(has_fused_experts(per->text));
  EXPECT_FALSE(per->text.layers[0].sparse);  // decoder_sparse_step 2: layers 1 and 3
  ASSERT_TRUE(per->text.layers[1].sparse);
  EXPECT_EQ(per->text.layers[1].moe.gate.size(), 16u);
  EXPECT_TRUE(per->store->holds(per->text.layers[1].moe.down[15].data,
                                per->text.layers[1].moe.down[15].nbytes()));
}

// A decode step reads the attention, the router and k experts of a sparse layer, not all E.
TEST(MoeWeights, DecodeWeightBytesCountTheChosenExpertsOnly) {
  auto e = engine("moe-f32-e16k4", ops::detected_isa());
  ASSERT_NE(e, nullptr);
  const Qwen3VLTextConfig t = [] {
    auto c = load_qwen3vl_config(kFixtures + "/moe-f32-e16k4");
    EXPECT_TRUE(c.ok());
    return c->text_config;
  }();
  const int64_t H = t.hidden_size, hd = t.head_dim;
  const int64_t attn = (t.num_attention_heads * hd + 2 * t.num_key_value_heads * hd) * H +
                       H * t.num_attention_heads * hd;
  const int64_t dense = 3 * t.intermediate_size * H;
  const int64_t sparse =
      t.num_experts * H + t.num_experts_per_tok * 3 * t.moe_intermediate_size * H;
  const int64_t head = t.vocab_size * H;  // untied
  EXPECT_EQ(e->decode_weight_bytes(), 4 * (4 * attn + 2 * dense + 2 * sparse + head));
}

// A broken MoE checkpoint fails to load with the dense model's errors: the file, the tensor and
// the shape named.
TEST(MoeWeights, BrokenExpertTensorsAreNamed) {
  const auto load_edited = test_util::load_with_edited_tensor;
  const std::string down = "model.language_model.layers.2.mlp.experts.down_proj";
  Status s = load_edited("moe-f32-e8k2", down, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(down), std::string::npos) << s.message();

  const std::string gate_up = "model.language_model.layers.0.mlp.experts.gate_up_proj";
  std::vector<float> small(8 * 64 * 64, 0.f);
  const TensorView wrong{DType::kF32, {8, 64, 64}, small.data()};
  s = load_edited("moe-f32-e8k2", gate_up, &wrong);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(gate_up), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[8, 64, 64]"), std::string::npos) << s.message();

  const std::string expert = "model.language_model.layers.3.mlp.experts.15.up_proj.weight";
  s = load_edited("moe-f32-e16k4", expert, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(expert), std::string::npos) << s.message();
}

// The routing rule on its own: the k largest logits, a tie at the k-th place to the lower
// index, softmax over all experts, renormalised.
TEST(MoeRoute, TopKWithTiesToTheLowerIndexAndRenormalisedWeights) {
  ThreadPool pool(1);
  ops::CpuBackend be(pool);
  // Row 0: a clear order. Row 1: experts 1, 2 and 4 tie behind 3. Row 2: all equal.
  std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.0f, 0.0f,  //
                               0.0f, 1.0f,  1.0f, 3.0f, 1.0f,  //
                               0.0f, 0.0f,  0.0f, 0.0f, 0.0f};
  std::vector<int32_t> ids(6);
  std::vector<float> w(6);
  auto buf = [](auto& v, DType t) { return ops::Buf{v.data(), ops::Device::kCpu, t}; };
  ASSERT_TRUE(be.moe_route(buf(logits, DType::kF32), 3, 5, 2, true, buf(ids, DType::kI32),
                           buf(w, DType::kF32))
                  .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3, 3, 1, 0, 1}));
  const float e1 = std::exp(-1.0f);  // row 0: exp(1 - 2)
  EXPECT_NEAR(w[0], 1 / (1 + e1), 1e-6);
  EXPECT_NEAR(w[1], e1 / (1 + e1), 1e-6);
  EXPECT_NEAR(w[4], 0.5f, 1e-7);
  EXPECT_NEAR(w[5], 0.5f, 1e-7);
  // Without renormalisation: the softmax over all five.
  ASSERT_TRUE(be.moe_route(buf(logits, DType::kF32), 3, 5, 2, false, buf(ids, DType::kI32),
                           buf(w, DType::kF32))
                  .ok());
  EXPECT_NEAR(w[4], 0.2f, 1e-7);
  EXPECT_NEAR(w[5], 0.2f, 1e-7);
}

}  // namespace
}  // namespace vlm
