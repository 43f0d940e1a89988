// Images through the whole model against transformers (tests/model/fixtures/vision-f32, made by
// scripts/make_vision_reference.py): preprocessing, vision tower stages, DeepStack features,
// 3-D positions, multimodal logits and greedy continuations.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "core/half.h"
#include "core/thread_pool.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/mrope_positions.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "model/vision_encoder.h"
#include "ops/cpu_backend.h"
#include "ops/ops.h"
#include "test_util.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kDir = std::string(VLM_FIXTURES_DIR) + "/vision-f32";
const std::string kImages = std::string(VLM_TESTDATA_DIR) + "/images";

const nlohmann::json& ref() {
  static const nlohmann::json r =
      nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  return r;
}

NpyArray npy(const nlohmann::json& entry) {
  auto a = read_npy(kDir + "/" + entry["file"].get<std::string>());
  EXPECT_TRUE(a.ok()) << a.status().message();
  return a.ok() ? std::move(a).value() : NpyArray{};
}

// max |a − b| / max |b|.
double rel_err(const float* a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

std::string image_path(const std::string& name) {
  const std::string src = ref()["images"][name]["source"];
  return (src.rfind("synthetic", 0) == 0 ? kDir : kImages) + "/" + src;
}

ImageInput image_input(const std::string& name) {
  const auto& im = ref()["images"][name];
  ImageInput in;
  in.path = image_path(name);
  in.min_pixels = im["min_pixels"].get<int64_t>();
  in.max_pixels = im["max_pixels"].get<int64_t>();
  return in;
}

// f32 everywhere, the same math as transformers' eager f32 run: only summation order differs.
constexpr double kTol = 1e-4;
// --vision-fp16 (activations, weights and runs of 32 products rounded to FP16): measured
// 0.9e-3 – 2.1e-3 on these cases (f32: < 1e-6); about 2.4× the largest. (Transformers' own BF16
// run rounds every activation to 2^-9 ≈ 2e-3 relative.)
constexpr double kTolFp16 = 5e-3;

class VisionStages : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = load_qwen3vl_config(kDir);
    ASSERT_TRUE(c.ok()) << c.status().message();
    cfg_ = *c;
    auto s = WeightStore::open_dir(kDir);
    ASSERT_TRUE(s.ok());
    store_ = std::make_unique<WeightStore>(std::move(s).value());
    auto w = load_vision_weights(*store_, cfg_);
    ASSERT_TRUE(w.ok()) << w.status().message();
    weights_ = std::move(w).value();
  }

  PreprocessedImage preprocess(const std::string& name) {
    const auto& im = ref()["images"][name];
    auto img = load_image_file(image_path(name));
    EXPECT_TRUE(img.ok()) << img.status().message();
    PreprocessOptions o;
    o.min_pixels = im["min_pixels"].get<int64_t>();
    o.max_pixels = im["max_pixels"].get<int64_t>();
    auto p = preprocess_image(*img, o);
    EXPECT_TRUE(p.ok()) << p.status().message();
    return std::move(p).value();
  }

  Qwen3VLConfig cfg_;
  std::unique_ptr<WeightStore> store_;
  VisionWeights weights_;
  ThreadPool pool_{2};
};

TEST_F(VisionStages, PreprocessingMatchesTheProcessor) {
  int with_pixels = 0;
  for (const auto& [name, im] : ref()["images"].items()) {
    PreprocessedImage p = preprocess(name);
    EXPECT_EQ((std::vector<int64_t>{p.grid_t, p.grid_h, p.grid_w}),
              im["image_grid_thw"].get<std::vector<int64_t>>())
        << name;
    EXPECT_EQ((std::vector<int64_t>{p.resized_h, p.resized_w}),
              im["resized_hw"].get<std::vector<int64_t>>())
        << name;
    if (!im["pixel_values"].is_null()) {
      NpyArray want = npy(im["pixel_values"]);
      ASSERT_EQ(want.f32.size(), p.pixel_values.size()) << name;
      EXPECT_LE(rel_err(p.pixel_values.data(), want.f32), 1e-6) << name;
      ++with_pixels;
    }
  }
  EXPECT_EQ(with_pixels, 2);
}

TEST_F(VisionStages, EncoderStagesAndDeepStackMatch) {
  for (ops::Isa isa : ops::runnable_isas()) {
    ops::CpuBackend be(pool_, isa);
    auto made = VisionEncoder::create(cfg_, weights_, be);
    ASSERT_TRUE(made.ok()) << made.status().message();
    VisionEncoder& enc = **made;
    for (const auto& c : ref()["cases"]) {
      std::vector<float> embeds, block0;
      std::vector<std::vector<float>> ds(cfg_.vision_config.deepstack_visual_indexes.size());
      for (const auto& name : c["images"]) {
        PreprocessedImage p = preprocess(name);
        VisionOutput out;
        ASSERT_TRUE(enc.encode(p.pixel_values.data(), {p.grid_t, p.grid_h, p.grid_w}, &out).ok());
        embeds.insert(embeds.end(), out.embeds.begin(), out.embeds.end());
        for (size_t k = 0; k < ds.size(); ++k)
          ds[k].insert(ds[k].end(), out.deepstack[k].begin(), out.deepstack[k].end());
        std::vector<float> b0(
            static_cast<size_t>(p.grid_t * p.grid_h * p.grid_w * cfg_.vision_config.hidden_size));
        ASSERT_TRUE(
            enc.embed_patches(p.pixel_values.data(), {p.grid_t, p.grid_h, p.grid_w}, b0.data())
                .ok());
        block0.insert(block0.end(), b0.begin(), b0.end());
      }
      const std::string what = c["name"].get<std::string>() + " " + ops::isa_name(isa);
      NpyArray want = npy(c["image_embeds"]);
      ASSERT_EQ(embeds.size(), want.f32.size()) << what;
      EXPECT_LE(rel_err(embeds.data(), want.f32), kTol) << what;
      ASSERT_EQ(c["deepstack"].size(), ds.size());
      for (size_t k = 0; k < ds.size(); ++k) {
        NpyArray d = npy(c["deepstack"][k]);
        ASSERT_EQ(ds[k].size(), d.f32.size()) << what << " tap " << k;
        EXPECT_LE(rel_err(ds[k].data(), d.f32), kTol) << what << " tap " << k;
      }
      if (c.contains("vision_debug")) {
        NpyArray b0 = npy(c["vision_debug"]["block0_input"]);
        ASSERT_EQ(block0.size(), b0.f32.size());
        EXPECT_LE(rel_err(block0.data(), b0.f32), 1e-5) << what << " patch embed + positions";
      }
    }
  }
}

TEST_F(VisionStages, Fp16ArithmeticStaysCloseToTransformers) {
  // --vision-fp16: the same encoder with its matmuls in FP16 arithmetic (ops::matmul_f16).
  ops::CpuBackend be(pool_);
  auto made16 = VisionEncoder::create(cfg_, weights_, be, /*fp16=*/true);
  auto made32 = VisionEncoder::create(cfg_, weights_, be);
  ASSERT_TRUE(made16.ok() && made32.ok());
  VisionEncoder& enc = **made16;
  VisionEncoder& f32 = **made32;
  if (!enc.fp16()) GTEST_SKIP() << "this CPU has no AVX-512 FP16";
  for (const auto& c : ref()["cases"]) {
    std::vector<float> embeds, plain;
    for (const auto& name : c["images"]) {
      PreprocessedImage p = preprocess(name);
      VisionOutput out, out32;
      const GridThw g{p.grid_t, p.grid_h, p.grid_w};
      ASSERT_TRUE(enc.encode(p.pixel_values.data(), g, &out).ok());
      ASSERT_TRUE(f32.encode(p.pixel_values.data(), g, &out32).ok());
      embeds.insert(embeds.end(), out.embeds.begin(), out.embeds.end());
      plain.insert(plain.end(), out32.embeds.begin(), out32.embeds.end());
    }
    const std::string what = c["name"].get<std::string>();
    NpyArray want = npy(c["image_embeds"]);
    ASSERT_EQ(embeds.size(), want.f32.size()) << what;
    const double err = rel_err(embeds.data(), want.f32);
    std::printf("[vision fp16] %s: rel err %.3e (f32 arithmetic: %.3e)\n", what.c_str(), err,
                rel_err(plain.data(), want.f32));
    EXPECT_NE(embeds, plain) << what << ": the FP16 kernels did not run";
    EXPECT_LE(err, kTolFp16) << what;
  }
}

// The vision tower's products rounded to BF16 (for the BF16 GEMM kernels, which the f32 fixture
// would not reach); the storage lives in `keep`.
VisionWeights bf16_copy(const VisionWeights& w, std::vector<std::vector<uint16_t>>* keep) {
  VisionWeights c = w;
  auto round = [&](TensorView* t) {
    const float* src = static_cast<const float*>(t->data);
    std::vector<uint16_t>& dst = keep->emplace_back(static_cast<size_t>(t->numel()));
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = f32_to_bf16(src[i]);
    t->dtype = DType::kBF16;
    t->data = dst.data();
  };
  round(&c.patch_embed);
  for (VisionBlockWeights& b : c.blocks) {
    for (TensorView* t : {&b.qkv, &b.proj, &b.fc1, &b.fc2}) round(t);
  }
  for (VisionMergerWeights* m : {&c.merger}) {
    round(&m->fc1);
    round(&m->fc2);
  }
  for (VisionMergerWeights& m : c.deepstack_mergers) {
    round(&m.fc1);
    round(&m.fc2);
  }
  return c;
}

// An encode run in units (VisionEncoder::begin / advance, as the engine slices it into its
// steps) equals the whole encode bit for bit, whatever the cut: every ISA, the f32, FP16 and
// BF16 (dot-product and AMX) kernels, one image and two frames, cuts of one grain, of odd sizes
// and of random sizes from unit to unit.
TEST_F(VisionStages, EncodeInUnitsEqualsTheWholeBitForBit) {
  std::vector<std::pair<std::string, PreprocessedImage>> images;
  for (const auto& [name, im] : ref()["images"].items())
    images.emplace_back(name, preprocess(name));
  {  // larger than the fixture's: several grains of rows per stage
    auto img = load_image_file(image_path("cat"));
    ASSERT_TRUE(img.ok());
    PreprocessOptions o;
    o.max_pixels = 1200 * 16 * 16;
    auto p = preprocess_image(*img, o);
    ASSERT_TRUE(p.ok());
    images.emplace_back("cat-large", std::move(p).value());
    // Two temporal groups (each its own attention frame): the large image's patches twice.
    PreprocessedImage two = images.back().second;
    two.grid_t = 2;
    two.pixel_values.insert(two.pixel_values.end(), two.pixel_values.begin(),
                            two.pixel_values.end());
    images.emplace_back("cat-large-2-frames", std::move(two));
  }
  std::vector<std::vector<uint16_t>> keep;
  const VisionWeights bf16 = bf16_copy(weights_, &keep);
  struct Variant {
    std::string name;
    const VisionWeights* w;
    bool fp16;
    std::optional<ops::Bf16Gemm> gemm;
  };
  std::vector<Variant> variants = {{"f32", &weights_, false, std::nullopt},
                                   {"fp16", &weights_, true, std::nullopt}};
  for (auto [g, name] : {std::pair{ops::Bf16Gemm::kDotBf16, "bf16-dot"},
                         std::pair{ops::Bf16Gemm::kAmx, "bf16-amx"}}) {
    if (ops::bf16_gemm_available(g)) variants.push_back({name, &bf16, false, g});
  }
  std::mt19937 rng(7);
  int sliced = 0;
  for (ops::Isa isa : ops::runnable_isas()) {
    ops::CpuBackend be(pool_, isa);
    const int64_t grain = be.row_slice_grain();
    ASSERT_GT(grain, 0);
    for (const Variant& v : variants) {
      auto made = VisionEncoder::create(cfg_, *v.w, be, v.fp16, v.gemm);
      ASSERT_TRUE(made.ok()) << made.status().message();
      VisionEncoder& enc = **made;
      for (const auto& [name, p] : images) {
        const GridThw g{p.grid_t, p.grid_h, p.grid_w};
        VisionOutput whole;
        ASSERT_TRUE(enc.encode(p.pixel_values.data(), g, &whole).ok());
        for (int64_t cut : {int64_t{1}, grain, grain + 5, 3 * grain, int64_t{-1}}) {
          const std::string what =
              name + " " + ops::isa_name(isa) + " " + v.name + " cut " + std::to_string(cut);
          auto job = enc.begin(p.pixel_values.data(), g);
          ASSERT_TRUE(job.ok()) << what;
          EXPECT_FALSE(enc.begin(p.pixel_values.data(), g).ok()) << "two jobs at once";
          int64_t units = 0;
          while (!(*job)->done()) {
            const int64_t rows =
                cut > 0 ? cut : std::uniform_int_distribution<int64_t>(1, 4 * grain)(rng);
            ASSERT_GT(enc.next_unit_flops(**job, rows), 0) << what;
            ASSERT_TRUE(enc.advance(job->get(), rows).ok()) << what;
            ++units;
          }
          EXPECT_EQ(units, (*job)->units_run());
          const VisionOutput& got = (*job)->outputs()[0];
          ASSERT_EQ(got.tokens, whole.tokens) << what;
          EXPECT_TRUE(got.embeds == whole.embeds) << what;
          ASSERT_EQ(got.deepstack.size(), whole.deepstack.size()) << what;
          for (size_t k = 0; k < got.deepstack.size(); ++k)
            EXPECT_TRUE(got.deepstack[k] == whole.deepstack[k]) << what << " tap " << k;
          if (g.patches() >= 2 * grain) {  // the stages were cut: more units than stages
            const int64_t stages = 2 + 4 * static_cast<int64_t>(cfg_.vision_config.depth) +
                                   static_cast<int64_t>(whole.deepstack.size());
            EXPECT_GT(units, stages + g.t * cfg_.vision_config.depth) << what;
            ++sliced;
          }
        }
      }
    }
  }
  EXPECT_GT(sliced, 0);
  // A job given up half way gives the encoder back: the next encode is whole and equal.
  ops::CpuBackend be(pool_);
  auto made = VisionEncoder::create(cfg_, weights_, be);
  ASSERT_TRUE(made.ok());
  const PreprocessedImage& p = images.back().second;
  const GridThw g{p.grid_t, p.grid_h, p.grid_w};
  VisionOutput before, after;
  ASSERT_TRUE((*made)->encode(p.pixel_values.data(), g, &before).ok());
  {
    auto job = (*made)->begin(p.pixel_values.data(), g);
    ASSERT_TRUE(job.ok());
    for (int i = 0; i < 7; ++i) ASSERT_TRUE((*made)->advance(job->get(), 1).ok());
  }
  ASSERT_TRUE((*made)->encode(p.pixel_values.data(), g, &after).ok());
  EXPECT_TRUE(before.embeds == after.embeds);
}

TEST(VisionPositions, RopeIndexMatchesTransformers) {
  const auto& r = ref();
  const int64_t pad = 1000, start = 1002;
  auto check = [&](const std::vector<int32_t>& ids, const std::vector<GridThw>& grids,
                   const NpyArray& want_pos, int64_t want_delta, const std::string& what) {
    auto got = compute_rope_index(ids, grids, pad, start, 2);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().message();
    const size_t n = ids.size();
    ASSERT_EQ(want_pos.i64.size(), 3 * n) << what;
    std::vector<int64_t> flat(got->t);
    flat.insert(flat.end(), got->h.begin(), got->h.end());
    flat.insert(flat.end(), got->w.begin(), got->w.end());
    EXPECT_EQ(flat, want_pos.i64) << what;
    EXPECT_EQ(got->delta, want_delta) << what;
  };
  for (const auto& c : r["cases"]) {
    std::vector<GridThw> grids;
    for (const auto& name : c["images"]) {
      auto g = r["images"][name]["image_grid_thw"].get<std::vector<int64_t>>();
      grids.push_back({g[0], g[1], g[2]});
    }
    check(c["input_ids"].get<std::vector<int32_t>>(), grids, npy(c["position_ids"]),
          c["rope_deltas"].get<int64_t>(), c["name"]);
  }
  for (const auto& c : r["rope_index_cases"]) {
    std::vector<GridThw> grids;
    if (!c["image_grid_thw"].is_null()) {
      for (const auto& g : c["image_grid_thw"]) grids.push_back({g[0], g[1], g[2]});
    }
    NpyArray pos;
    for (const auto& axis : c["position_ids"]) {
      auto v = axis.get<std::vector<int64_t>>();
      pos.i64.insert(pos.i64.end(), v.begin(), v.end());
    }
    check(c["input_ids"].get<std::vector<int32_t>>(), grids, pos, c["rope_deltas"].get<int64_t>(),
          c["name"]);
  }
}

std::unique_ptr<Engine> engine(ops::Isa isa) {
  EngineOptions o;
  o.model_dir = kDir;
  o.require_tokenizer = false;
  o.n_threads = 2;
  o.prefill_chunk = 16;  // prompts span several chunks: images split across chunk borders
  o.cpu_isa = parse_cpu_isa(ops::isa_name(isa)).value();
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

class VisionModel : public ::testing::TestWithParam<ops::Isa> {};

TEST_P(VisionModel, MultimodalLogitsMatchTransformers) {
  auto e = engine(GetParam());
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->has_vision());
  for (const auto& c : ref()["cases"]) {
    std::vector<ImageInput> images;
    for (const auto& name : c["images"]) images.push_back(image_input(name));
    std::vector<int32_t> expanded;
    auto got = e->logits(c["prompt_ids"].get<std::vector<int32_t>>(), images, &expanded);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(expanded, c["input_ids"].get<std::vector<int32_t>>()) << c["name"];
    NpyArray want = npy(c["logits"]);
    ASSERT_EQ(got->size(), want.f32.size()) << c["name"];
    EXPECT_LE(rel_err(got->data(), want.f32), kTol) << c["name"];
  }
}

TEST_P(VisionModel, GreedyContinuationsMatchTransformers) {
  auto e = engine(GetParam());
  ASSERT_NE(e, nullptr);
  for (const auto& c : ref()["cases"]) {
    GenerateRequest req;
    req.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& name : c["images"]) req.images.push_back(image_input(name));
    req.max_new_tokens = c["greedy"]["max_new_tokens"].get<int64_t>();
    req.sampling.do_sample = false;
    req.ignore_eos = true;
    auto res = e->generate(req);
    ASSERT_TRUE(res.ok()) << res.status().message();
    auto want = c["greedy"]["output_ids"].get<std::vector<int32_t>>();
    ASSERT_GE(want.size(), 32u);
    EXPECT_EQ(res->output_ids, want) << c["name"];
    EXPECT_EQ(res->vision_tokens,
              static_cast<int64_t>(std::count(c["input_ids"].begin(), c["input_ids"].end(), 1000)));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, VisionModel, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

TEST(VisionRequests, BadImagesAndPromptsGetClearErrors) {
  auto e = engine(ops::detected_isa());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> one_image = {10, 1002, 1000, 1003, 11};
  GenerateRequest req;
  req.prompt_ids = one_image;
  req.max_new_tokens = 2;
  // No image for the placeholder.
  auto r = e->generate(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 image placeholders"), std::string::npos)
      << r.status().message();
  // A broken image names itself.
  ImageInput broken;
  broken.bytes = {0x89, 'P', 'N', 'G', 1, 2, 3};
  req.images = {broken};
  r = e->generate(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("image 1"), std::string::npos) << r.status().message();
  // A missing file names its path.
  ImageInput missing;
  missing.path = "/nonexistent/cat.png";
  req.images = {missing};
  r = e->generate(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/cat.png"), std::string::npos);
  // Two images for one placeholder.
  req.images = {image_input("tiny"), image_input("tall")};
  EXPECT_FALSE(e->generate(req).ok());
  // A pad without <|vision_start|> before it.
  req.prompt_ids = {10, 1000, 11};
  req.images = {image_input("tiny")};
  EXPECT_FALSE(e->generate(req).ok());
  // The engine still works.
  req.prompt_ids = one_image;
  auto ok = e->generate(req);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->vision_tokens, 6);
}

}  // namespace
}  // namespace vlm
