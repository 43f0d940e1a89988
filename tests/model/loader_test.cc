// Engine::load on broken checkpoints: each error names the file and the tensor, and nothing
// crashes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/half.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
const std::string kFixture = std::string(VLM_FIXTURES_DIR) + "/text-f32-untied";

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { fs::copy_file(kFixture + "/config.json", dir_ / "config.json"); }

  // Writes model.safetensors holding the fixture's tensors after `edit` changed the list.
  void write_weights(
      const std::function<void(std::vector<std::pair<std::string, TensorView>>&)>& edit) {
    auto store = WeightStore::open_dir(kFixture);
    ASSERT_TRUE(store.ok()) << store.status().message();
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const auto& name : store->names()) tensors.emplace_back(name, *store->get(name));
    edit(tensors);
    ASSERT_TRUE(write_safetensors((dir_ / "model.safetensors").string(), tensors).ok());
  }

  Status load() {
    EngineOptions o;
    o.model_dir = dir_.string();
    o.require_tokenizer = false;
    o.n_threads = 1;
    auto e = Engine::load(o);
    return e.ok() ? ok_status() : e.status();
  }

  test_util::TempDir tmp_;
  const fs::path& dir_ = tmp_.path();
};

TEST_F(LoaderTest, IntactCopyLoads) {
  write_weights([](auto&) {});
  EXPECT_TRUE(load().ok());
}

TEST_F(LoaderTest, MissingTensorIsNamed) {
  const std::string victim = "model.language_model.layers.1.mlp.down_proj.weight";
  write_weights(
      [&](auto& t) { std::erase_if(t, [&](const auto& p) { return p.first == victim; }); });
  Status s = load();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(victim), std::string::npos) << s.message();
}

TEST_F(LoaderTest, WrongShapeNamesFileAndTensor) {
  const std::string victim = "model.language_model.layers.0.self_attn.q_proj.weight";
  std::vector<float> small(16 * 128, 0.f);
  write_weights([&](auto& t) {
    for (auto& [name, view] : t) {
      if (name == victim) view = TensorView{DType::kF32, {16, 128}, small.data()};
    }
  });
  Status s = load();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(victim), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[16, 128]"), std::string::npos) << s.message();
}

TEST_F(LoaderTest, UntiedCheckpointWithoutLmHeadFails) {
  write_weights(
      [](auto& t) { std::erase_if(t, [](const auto& p) { return p.first == "lm_head.weight"; }); });
  Status s = load();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s.message();
}

TEST_F(LoaderTest, UnsupportedDtypeIsNamed) {
  const std::string victim = "model.language_model.norm.weight";
  std::vector<int64_t> ints(128, 1);
  write_weights([&](auto& t) {
    for (auto& [name, view] : t) {
      if (name == victim) view = TensorView{DType::kI64, {128}, ints.data()};
    }
  });
  Status s = load();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(victim), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("I64"), std::string::npos) << s.message();
}

TEST_F(LoaderTest, TruncatedWeightsFileNamesTheFile) {
  write_weights([](auto&) {});
  const auto path = dir_ / "model.safetensors";
  fs::resize_file(path, fs::file_size(path) / 2);
  Status s = load();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
}

TEST_F(LoaderTest, MissingWeightsAndConfigAndDirectory) {
  Status no_weights = load();
  ASSERT_FALSE(no_weights.ok());
  EXPECT_EQ(no_weights.code(), StatusCode::kNotFound);

  fs::remove(dir_ / "config.json");
  Status no_config = load();
  ASSERT_FALSE(no_config.ok());
  EXPECT_NE(no_config.message().find("config.json"), std::string::npos);

  EngineOptions o;
  o.model_dir = "/nonexistent/vlm-model";
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("/nonexistent/vlm-model"), std::string::npos);
}

TEST_F(LoaderTest, MissingTokenizerIsAnErrorOnlyWhenRequired) {
  write_weights([](auto&) {});
  EngineOptions o;
  o.model_dir = dir_.string();
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tokenizer.json"), std::string::npos);
}

TEST_F(LoaderTest, ShardedCheckpointLoadsAndMatchesSingleFile) {
  // Split the fixture's tensors over two shards with an index, as large checkpoints are published.
  auto store = WeightStore::open_dir(kFixture);
  ASSERT_TRUE(store.ok());
  std::vector<std::pair<std::string, TensorView>> a, b;
  std::string index = R"({"metadata": {}, "weight_map": {)";
  bool first = true;
  for (const auto& name : store->names()) {
    const bool to_a =
        name.find("layers.0.") != std::string::npos || name.find("embed") != std::string::npos;
    (to_a ? a : b).emplace_back(name, *store->get(name));
    index += std::string(first ? "" : ", ") + "\"" + name + "\": \"" +
             (to_a ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") +
             "\"";
    first = false;
  }
  index += "}}";
  ASSERT_TRUE(write_safetensors((dir_ / "model-00001-of-00002.safetensors").string(), a).ok());
  ASSERT_TRUE(write_safetensors((dir_ / "model-00002-of-00002.safetensors").string(), b).ok());
  std::ofstream(dir_ / "model.safetensors.index.json") << index;

  EngineOptions o;
  o.model_dir = dir_.string();
  o.require_tokenizer = false;
  auto sharded = Engine::load(o);
  ASSERT_TRUE(sharded.ok()) << sharded.status().message();
  o.model_dir = kFixture;
  auto single = Engine::load(o);
  ASSERT_TRUE(single.ok());
  std::vector<int32_t> ids = {5, 17, 300, 2};
  EXPECT_EQ(*(*sharded)->logits(ids), *(*single)->logits(ids));
}

// F16 weights: the f32 fixture rounded to F16 and run by vlm stays close to transformers' f32
// logits. F16 keeps 11 significant bits (relative rounding ≤ 2^-11), and over these few layers
// the logits move by ≤ 0.2% of their range (measured); a wrong F16 decode would be far off.
TEST_F(LoaderTest, F16CheckpointStaysCloseToF32Reference) {
  auto store = WeightStore::open_dir(kFixture);
  ASSERT_TRUE(store.ok());
  std::vector<std::vector<uint16_t>> halves;
  halves.reserve(store->names().size());
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& name : store->names()) {
    TensorView v = *store->get(name);
    ASSERT_EQ(v.dtype, DType::kF32);
    auto& h = halves.emplace_back(v.numel());
    for (int64_t i = 0; i < v.numel(); ++i) h[i] = f32_to_f16(static_cast<const float*>(v.data)[i]);
    tensors.emplace_back(name, TensorView{DType::kF16, v.shape, h.data()});
  }
  ASSERT_TRUE(write_safetensors((dir_ / "model.safetensors").string(), tensors).ok());
  EngineOptions o;
  o.model_dir = dir_.string();
  o.require_tokenizer = false;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto ref = nlohmann::json::parse(test_util::read_file(kFixture + "/reference.json"));
  for (const auto& entry : ref["logits"]) {
    auto got = (*e)->logits(entry["ids"].get<std::vector<int32_t>>());
    auto want = read_npy(kFixture + "/" + entry["file"].get<std::string>());
    ASSERT_TRUE(got.ok() && want.ok());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < got->size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>((*got)[i]) - want->f32[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want->f32[i])));
    }
    std::printf("F16 weights: max |logit error| / max |logit| = %.3g\n", diff / scale);
    EXPECT_LE(diff / scale, 5e-3);  // measured ≤ 1.8e-3
    EXPECT_GT(diff, 0.0);           // the weights really were rounded
  }
}

TEST(EngineRequests, BadRequestsGetClearErrors) {
  EngineOptions o;
  o.model_dir = kFixture;
  o.require_tokenizer = false;
  o.max_context = 64;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok());
  Engine& engine = **e;
  GenerateRequest r;
  EXPECT_EQ(engine.generate(r).status().code(), StatusCode::kInvalidArgument);  // empty prompt
  r.prompt_ids = {1, 2, 100000};
  EXPECT_EQ(engine.generate(r).status().code(), StatusCode::kInvalidArgument);  // id out of vocab
  r.prompt_ids = std::vector<int32_t>(60, 3);
  r.max_new_tokens = 10;
  EXPECT_EQ(engine.generate(r).status().code(), StatusCode::kOutOfRange);  // over the context
  r.prompt_ids = {1, 2};
  r.sampling.top_p = 0.0;
  EXPECT_EQ(engine.generate(r).status().code(), StatusCode::kInvalidArgument);
  r.sampling.top_p.reset();
  r.stop = {"x"};
  EXPECT_EQ(engine.generate(r).status().code(), StatusCode::kInvalidArgument);  // no tokenizer
  EXPECT_EQ(engine.logits(std::vector<int32_t>(65, 1)).status().code(), StatusCode::kOutOfRange);
  // The engine still works after all of that.
  r.stop.clear();
  r.max_new_tokens = 3;
  auto ok = engine.generate(r);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->output_ids.size(), 3u);
}

TEST(EngineRequests, SameSeedSameSampledOutput) {
  EngineOptions o;
  o.model_dir = kFixture;
  o.require_tokenizer = false;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok());
  GenerateRequest r;
  r.prompt_ids = {10, 20, 30};
  r.max_new_tokens = 24;
  r.ignore_eos = true;
  r.sampling.temperature = 1.0;
  r.sampling.top_k = 0;
  r.sampling.seed = 1234;
  auto a = (*e)->generate(r);
  auto b = (*e)->generate(r);
  r.sampling.seed = 99;
  auto c = (*e)->generate(r);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->output_ids, b->output_ids);
  EXPECT_NE(a->output_ids, c->output_ids);
}

}  // namespace
}  // namespace vlm
