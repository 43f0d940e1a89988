// Qwen3.5's mixtures of experts (model_type qwen3_5_moe) beyond the logits, greedy, image and
// video checks qwen35_model_test runs on them against transformers 5.x: the config's defaults and
// refusals, the fused expert tensors viewed in place (nn.Linear's layout per expert, unlike
// Qwen3-VL MoE's transposed one) and a transposed file refused, the shared expert and its gate,
// what quantization turns into INT8 / INT4 and what it leaves as stored, the weights a decode
// step reads, batching with preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/half.h"
#include "fixture_model.h"
#include "ops/ops.h"
#include "test_util.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;
const std::string kFused = "qwen35moe-f32-a";      // fused expert tensors
const std::string kPerExpert = "qwen35moe-f32-b";  // one tensor per expert, a planted router tie
const std::string kLayer0 = "model.language_model.layers.0.mlp.";

nlohmann::json config_json(const std::string& fixture) {
  return nlohmann::json::parse(test_util::read_file(kFixtures + "/" + fixture + "/config.json"));
}

TEST(Qwen35MoeConfig, EveryLayerSparseWithASharedExpertAndRenormalisedTopK) {
  auto a = parse_qwen3vl_config(config_json(kFused).dump(), "a");
  ASSERT_TRUE(a.ok()) << a.status().message();
  const Qwen3VLTextConfig& t = a->text_config;
  EXPECT_EQ(t.family, ModelFamily::kQwen35);
  EXPECT_EQ(t.num_experts, 8);
  EXPECT_EQ(t.num_experts_per_tok, 2);
  EXPECT_EQ(t.moe_intermediate_size, 96);
  EXPECT_EQ(t.shared_expert_intermediate_size, 32);
  EXPECT_EQ(t.intermediate_size, 0);  // no dense MLP anywhere
  EXPECT_TRUE(t.norm_topk_prob);
  for (int64_t l = 0; l < t.num_hidden_layers; ++l) EXPECT_TRUE(t.sparse_layer(l)) << l;
  EXPECT_EQ(t.num_linear_layers(), 3);

  // What the file leaves out takes Qwen3_5MoeTextConfig's defaults; the fields that model has
  // not (decoder_sparse_step, mlp_only_layers, norm_topk_prob) change nothing.
  nlohmann::json j = config_json(kFused);
  nlohmann::json& text = j["text_config"];
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size"}) {
    text.erase(k);
  }
  text["decoder_sparse_step"] = 2;
  text["mlp_only_layers"] = {0};
  text["norm_topk_prob"] = false;
  auto d = parse_qwen3vl_config(j.dump(), "d");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->text_config.num_experts, 256);
  EXPECT_EQ(d->text_config.num_experts_per_tok, 8);
  EXPECT_EQ(d->text_config.moe_intermediate_size, 512);
  EXPECT_EQ(d->text_config.shared_expert_intermediate_size, 512);
  EXPECT_TRUE(d->text_config.norm_topk_prob);
  for (int64_t l = 0; l < 4; ++l) EXPECT_TRUE(d->text_config.sparse_layer(l)) << l;

  // Refused, naming the field.
  struct Bad {
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"num_experts", 0, "num_experts"}, Bad{"num_experts_per_tok", 9, "num_experts_per_tok"},
        Bad{"moe_intermediate_size", 0, "moe_intermediate_size"},
        Bad{"shared_expert_intermediate_size", 0, "shared_expert_intermediate_size"}}) {
    nlohmann::json bad = config_json(kFused);
    bad["text_config"][b.key] = b.value;
    auto r = parse_qwen3vl_config(bad.dump(), "bad");
    ASSERT_FALSE(r.ok()) << b.key;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().message();
  }
}

// Qwen3.5 MoE stores each expert in nn.Linear's layout inside the fused tensors, so the loader
// views the rows where they lie (no copy); the shared expert and its gate load beside them.
TEST(Qwen35MoeWeights, FusedExpertsAreViewedInPlace) {
  auto m = test_util::load_fixture_model(kFixtures + "/" + kFused);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(has_fused_experts(m->text));
  const int64_t E = 8, I = 96, H = 64, Is = 32;
  auto fused = m->store->get(kLayer0 + "experts.gate_up_proj");
  auto fused_down = m->store->get(kLayer0 + "experts.down_proj");
  ASSERT_TRUE(fused.ok() && fused_down.ok());
  ASSERT_EQ(fused->shape, (std::vector<int64_t>{E, 2 * I, H}));
  ASSERT_EQ(fused_down->shape, (std::vector<int64_t>{E, H, I}));
  const MoeWeights& x = m->text.layers[0].moe;
  ASSERT_EQ(x.gate.size(), static_cast<size_t>(E));
  const auto* g0 = static_cast<const float*>(fused->data);
  const auto* d0 = static_cast<const float*>(fused_down->data);
  for (int64_t e = 0; e < E; ++e) {
    ASSERT_EQ(x.gate[e].shape, (std::vector<int64_t>{I, H}));
    ASSERT_EQ(x.up[e].shape, (std::vector<int64_t>{I, H}));
    ASSERT_EQ(x.down[e].shape, (std::vector<int64_t>{H, I}));
    EXPECT_EQ(x.gate[e].data, g0 + e * 2 * I * H);  // gate rows, then up rows
    EXPECT_EQ(x.up[e].data, g0 + (e * 2 * I + I) * H);
    EXPECT_EQ(x.down[e].data, d0 + e * H * I);
  }
  ASSERT_TRUE(x.shared);
  EXPECT_EQ(x.shared_gate.shape, (std::vector<int64_t>{Is, H}));
  EXPECT_EQ(x.shared_up.shape, (std::vector<int64_t>{Is, H}));
  EXPECT_EQ(x.shared_down.shape, (std::vector<int64_t>{H, Is}));
  EXPECT_EQ(x.shared_expert_gate.shape, (std::vector<int64_t>{1, H}));
  EXPECT_EQ(m->text.expert_copies, nullptr);

  // The same file in BF16: the views step by 2-byte elements.
  {
    test_util::TempDir tmp;
    std::filesystem::copy_file(kFixtures + "/" + kFused + "/config.json",
                               tmp.path() / "config.json");
    std::vector<std::vector<uint16_t>> bits;
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const auto& n : m->store->names()) {
      TensorView v = *m->store->get(n);
      const auto* f = static_cast<const float*>(v.data);
      std::vector<uint16_t>& b = bits.emplace_back(static_cast<size_t>(v.numel()));
      for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(f[i]);
      v.dtype = DType::kBF16;
      v.data = b.data();
      tensors.emplace_back(n, v);
    }
    ASSERT_TRUE(write_safetensors((tmp.path() / "model.safetensors").string(), tensors).ok());
    auto h = test_util::load_fixture_model(tmp.path().string());
    ASSERT_TRUE(h.ok()) << h.status().message();
    auto g = h->store->get(kLayer0 + "experts.gate_up_proj");
    auto d = h->store->get(kLayer0 + "experts.down_proj");
    ASSERT_TRUE(g.ok() && d.ok());
    const MoeWeights& z = h->text.layers[0].moe;
    const auto* g16 = static_cast<const uint16_t*>(g->data);
    const auto* d16 = static_cast<const uint16_t*>(d->data);
    for (int64_t e : {1, 7}) {
      EXPECT_EQ(z.gate[e].dtype, DType::kBF16);
      EXPECT_EQ(z.gate[e].data, g16 + e * 2 * I * H);
      EXPECT_EQ(z.up[e].data, g16 + (e * 2 * I + I) * H);
      EXPECT_EQ(z.down[e].data, d16 + e * H * I);
    }
  }

  // One tensor per expert: views of each.
  auto b = test_util::load_fixture_model(kFixtures + "/" + kPerExpert);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const MoeWeights& y = b->text.layers[4].moe;
  ASSERT_EQ(y.gate.size(), 12u);
  auto stored = b->store->get("model.language_model.layers.4.mlp.experts.11.down_proj.weight");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(y.down[11].data, stored->data);
  EXPECT_EQ(y.shared_down.shape, (std::vector<int64_t>{96, 64}));
}

// --quant: every routed and shared expert becomes INT8 / INT4, one by one from the stored rows;
// the routers and the shared expert's gate stay as stored.
TEST(Qwen35MoeWeights, QuantizationTurnsTheExpertsAndKeepsTheGates) {
  auto m = test_util::load_fixture_model(kFixtures + "/" + kFused);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ThreadPool pool(2);
  for (WeightQuant quant : {WeightQuant::kInt8, WeightQuant::kInt4}) {
    const DType want = quant == WeightQuant::kInt8 ? DType::kI8 : DType::kI4;
    TextWeights q = m->text;
    ASSERT_TRUE(quantize_text_weights(&q, quant, pool, nullptr, 32).ok());
    for (size_t l = 0; l < q.layers.size(); ++l) {
      const MoeWeights& x = q.layers[l].moe;
      const MoeWeights& was = m->text.layers[l].moe;
      for (size_t e = 0; e < x.gate.size(); ++e) {
        EXPECT_EQ(x.gate[e].dtype, want);
        EXPECT_EQ(x.up[e].dtype, want);
        EXPECT_EQ(x.down[e].dtype, want);
      }
      for (const TensorView* v : {&x.shared_gate, &x.shared_up, &x.shared_down}) {
        EXPECT_EQ(v->dtype, want);
      }
      EXPECT_EQ(x.router.data, was.router.data);
      EXPECT_EQ(x.router.dtype, DType::kF32);
      EXPECT_EQ(x.shared_expert_gate.data, was.shared_expert_gate.data);
      EXPECT_EQ(x.shared_expert_gate.dtype, DType::kF32);
    }
  }
}

// A file whose fused experts are transposed (Qwen3-VL MoE's layout: [E, H, 2·I], [E, I, H]) or
// that lacks a shared-expert tensor fails to load, naming the tensor.
TEST(Qwen35MoeWeights, TransposedOrMissingTensorsAreNamed) {
  const auto load_edited = test_util::load_with_edited_tensor;
  std::vector<float> zeros(8 * 192 * 64, 0.f);
  const TensorView transposed{DType::kF32, {8, 64, 192}, zeros.data()};
  const TensorView transposed_down{DType::kF32, {8, 96, 64}, zeros.data()};
  for (auto [victim, replacement, shape] :
       {std::tuple{kLayer0 + "experts.gate_up_proj", &transposed, "[8, 64, 192]"},
        std::tuple{kLayer0 + "experts.down_proj", &transposed_down, "[8, 96, 64]"}}) {
    Status s = load_edited(kFused, victim, replacement);
    ASSERT_FALSE(s.ok()) << victim;
    EXPECT_NE(s.message().find(victim), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(shape), std::string::npos) << s.message();
  }
  for (const std::string& victim :
       {kLayer0 + "shared_expert_gate.weight", kLayer0 + "shared_expert.down_proj.weight"}) {
    Status s = load_edited(kFused, victim, nullptr);
    ASSERT_FALSE(s.ok()) << victim;
    EXPECT_NE(s.message().find(victim), std::string::npos) << s.message();
  }
  const std::string expert = "model.language_model.layers.3.mlp.experts.11.up_proj.weight";
  Status s = load_edited(kPerExpert, expert, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(expert), std::string::npos) << s.message();
}

std::unique_ptr<Engine> engine(const std::string& fixture, Quant quant = Quant::kNone,
                               int64_t chunk = 64) {
  EngineOptions o = test_util::fixture_engine_options(fixture);
  o.quant = quant;
  o.prefill_chunk = chunk;
  o.batching.max_num_seqs = std::min<int64_t>(o.batching.max_num_seqs, chunk);
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// A decode step reads every layer's mixer, its router, k routed experts of the average size, the
// shared expert and its gate, and the head: not all E experts.
TEST(Qwen35MoeWeights, DecodeWeightBytesCountTheChosenAndSharedExperts) {
  auto e = engine(kPerExpert);
  ASSERT_NE(e, nullptr);
  auto c = load_qwen3vl_config(kFixtures + "/" + kPerExpert);
  ASSERT_TRUE(c.ok());
  const Qwen3VLTextConfig& t = c->text_config;
  const int64_t H = t.hidden_size, hd = t.head_dim;
  const int64_t attn =
      (t.q_proj_rows() + 2 * t.num_key_value_heads * hd) * H + H * t.num_attention_heads * hd;
  const int64_t vd = t.linear_num_value_heads * t.linear_value_head_dim;
  const int64_t delta = (t.linear_conv_dim() + vd + 2 * t.linear_num_value_heads) * H + H * vd;
  const int64_t moe = t.num_experts * H + t.num_experts_per_tok * 3 * t.moe_intermediate_size * H +
                      3 * t.shared_expert_intermediate_size * H + H;
  const int64_t head = t.vocab_size * H;  // untied
  EXPECT_EQ(e->decode_weight_bytes(), 4 * (2 * attn + 3 * delta + 5 * moe + head));
}

// Batched with other sequences (rows of several sequences grouped by expert), preempted and
// resumed: each request's greedy reply is its reply alone. (Unquantized only: INT4's products
// differ in their last bits with the number of rows an expert gets, which the batching sets, so
// a quantized model's replies may part at a near tie; quant_test bounds its logits instead.)
TEST(Qwen35MoeBatch, BatchedAndPreemptedEqualAlone) {
  const auto ref =
      nlohmann::json::parse(test_util::read_file(kFixtures + "/" + kPerExpert + "/reference.json"));
  std::vector<GenerateRequest> reqs;
  for (const char* key : {"greedy", "logits"}) {
    for (const auto& c : ref[key]) {
      GenerateRequest r;
      r.prompt_ids = c[c.contains("ids") ? "ids" : "prompt_ids"].get<std::vector<int32_t>>();
      r.max_new_tokens = 40;
      r.sampling.do_sample = false;
      r.ignore_eos = true;
      reqs.push_back(r);
    }
  }
  std::vector<std::vector<int32_t>> want;
  {
    auto alone = engine(kPerExpert);
    ASSERT_NE(alone, nullptr);
    for (const GenerateRequest& r : reqs) {
      auto out = alone->generate(r);
      ASSERT_TRUE(out.ok()) << out.status().message();
      want.push_back(out->output_ids);
    }
  }
  for (size_t i = 0; i < ref["greedy"].size(); ++i) {  // transformers' paths for these
    EXPECT_EQ(want[i], ref["greedy"][i]["output_ids"].get<std::vector<int32_t>>());
  }
  BatchingOptions b;
  b.num_blocks = 14;  // 14 blocks of 16: too few for all five, so some are preempted
  b.block_size = 16;
  b.max_num_seqs = 4;
  EngineOptions o = test_util::fixture_engine_options(kPerExpert);
  o.prefill_chunk = 32;
  o.batching = b;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const GenerateRequest& r : reqs) {
    auto s = (*e)->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(std::move(s).value());
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_EQ(test_util::stream_tokens(*streams[i]), want[i]) << "request " << i;
  }
  EXPECT_GT((*e)->core_stats().preemptions, 0);
}

}  // namespace
}  // namespace vlm
