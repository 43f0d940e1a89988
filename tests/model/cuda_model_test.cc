// The model on the GPU (EngineOptions::device = "cuda") against transformers: the vision tower's
// merger and DeepStack outputs, the text and image fixtures' logits and greedy continuations, and
// the shipped shapes model answering 100 unseen scenes through continuous batching exactly as
// transformers did. Image decoding and preprocessing run on the CPU; the vision tower, the text
// decoder, its paged KV cache and DeepStack on the GPU. Without a CUDA device every test here
// reports skipped, never passed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/npy.h"
#include "io/safetensors.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/qwen3vl_config.h"
#include "model/vision_encoder.h"
#include "ops/cuda/cuda_backend.h"
#include "test_util.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"
#include "vlm/chat.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

#define SKIP_WITHOUT_DEVICE() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

// The device check (scripts/cuda_device_check.sh) runs this binary from another checkout path:
// VLM_FIXTURES_DIR, VLM_REPO_DIR and VLM_TESTDATA_DIR in the environment override the paths the
// build compiled in.
std::string dir_from_env(const char* name, const char* compiled) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? v : compiled;
}
const std::string kFixtures = dir_from_env("VLM_FIXTURES_DIR", VLM_FIXTURES_DIR);
const std::string kRepo = dir_from_env("VLM_REPO_DIR", VLM_REPO_DIR);
const std::string kTestData = dir_from_env("VLM_TESTDATA_DIR", VLM_TESTDATA_DIR);

nlohmann::json reference(const std::string& dir) {
  return nlohmann::json::parse(test_util::read_file(dir + "/reference.json"));
}

// The options of a model on the GPU: 2 CPU threads (preprocessing), no tokenizer needed.
EngineOptions gpu_options(const std::string& dir, const std::string& dtype = "bf16") {
  EngineOptions o;
  o.model_dir = dir;
  o.require_tokenizer = false;
  o.n_threads = 2;
  o.device = Device::kCuda;
  o.gpu_dtype = parse_gpu_dtype(dtype).value();
  return o;
}

std::unique_ptr<Engine> gpu_engine(const std::string& dir, const std::string& dtype,
                                   int64_t chunk = 16) {
  EngineOptions o = gpu_options(dir, dtype);
  o.prefill_chunk = chunk;  // several chunks per prompt: chunked prefill over the paged cache
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// max |a − b| / max |b|.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

std::vector<float> npy(const std::string& path) {
  auto a = read_npy(path);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return a.ok() ? a->f32 : std::vector<float>{};
}

// Tolerances, relative to max |logit| of the reference. f32 on the GPU: the CPU tests' 1e-4
// (only the summation order differs from transformers' float32 run). bf16 on the GPU against
// transformers' own bf16 run: both round every activation to 8 bits of mantissa, at different
// points, and each lands ~2% of max|logit| from the f32 result on these random weights (see
// text_model_test); 5% as there.
constexpr double kTolF32 = 1e-4;
constexpr double kTolBf16 = 5e-2;

struct TextCase {
  std::string fixture, dtype;
  const char* logits_key;  // "file" (the checkpoint dtype's run) or "file_f32ref"
  double tol;
};

class CudaTextModel : public ::testing::TestWithParam<TextCase> {};

TEST_P(CudaTextModel, LogitsMatchTransformers) {
  SKIP_WITHOUT_DEVICE();
  const TextCase& c = GetParam();
  const std::string dir = kFixtures + "/" + c.fixture;
  auto e = gpu_engine(dir, c.dtype);
  ASSERT_NE(e, nullptr);
  const auto ref = reference(dir);
  ASSERT_GE(ref["logits"].size(), 3u);
  for (const auto& entry : ref["logits"]) {
    if (!entry.contains(c.logits_key)) continue;
    auto got = e->logits(entry["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_LE(rel_err(*got, npy(dir + "/" + entry[c.logits_key].get<std::string>())), c.tol)
        << c.fixture << " on " << e->device() << ", " << entry["ids"].size() << " ids";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaTextModel,
    ::testing::Values(TextCase{"text-f32-hd128-tied", "f32", "file", kTolF32},
                      TextCase{"text-f32-untied", "f32", "file", kTolF32},
                      TextCase{"text-bf16-hd128", "f32", "file_f32ref", kTolF32},
                      TextCase{"text-bf16-hd128", "bf16", "file", kTolBf16},
                      TextCase{"tiny-fullvocab-bf16", "bf16", "file", kTolBf16},
                      // Mixtures of experts (the grouped expert products), in f32: in BF16 a
                      // router logit rounded across the k-th place swaps a whole expert.
                      TextCase{"moe-f32-e8k2", "f32", "file", kTolF32},
                      TextCase{"moe-f32-e16k4", "f32", "file", kTolF32},
                      TextCase{"moe-f32-tie", "f32", "file", kTolF32},
                      TextCase{"moe-bf16-e4k1", "f32", "file_f32ref", kTolF32}),
    [](const auto& info) {
      return test_util::param_name(info.param.fixture + "_" + info.param.dtype);
    });

// Greedy continuations through generate() in f32: prefill in chunks, then decode steps over the
// paged cache, equal to transformers' f32 argmax at every step. (In bf16 the argmax flips
// wherever rounding beats the top-2 margin, so bf16 is held to the logits bound above.)
class CudaTextGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTextGreedy, TokensMatchTransformers) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = kFixtures + "/" + GetParam();
  auto e = gpu_engine(dir, "f32");
  ASSERT_NE(e, nullptr);
  const auto ref = reference(dir);
  ASSERT_GE(ref["greedy"].size(), 2u);
  for (const auto& g : ref["greedy"]) {
    GenerateRequest req;
    req.prompt_ids = g["prompt_ids"].get<std::vector<int32_t>>();
    req.max_new_tokens = g["max_new_tokens"].get<int64_t>();
    req.sampling.do_sample = false;
    req.ignore_eos = true;
    const char* key = g.contains("output_ids_f32ref") ? "output_ids_f32ref" : "output_ids";
    auto res = e->generate(req);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_EQ(res->output_ids, g[key].get<std::vector<int32_t>>()) << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTextGreedy,
                         ::testing::Values("text-f32-hd128-tied", "text-f32-untied",
                                           "text-bf16-hd128", "moe-f32-e8k2", "moe-f32-e16k4",
                                           "moe-f32-tie", "moe-bf16-e4k1"),
                         [](const auto& info) { return test_util::param_name(info.param); });

// The vision tower alone on the GPU (f32): merger and DeepStack outputs of every fixture image
// against transformers', at the CPU tower's 1e-4.
TEST(CudaVisionModel, EncoderOutputsMatchTransformers) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = kFixtures + "/vision-f32";
  const auto ref = reference(dir);
  auto cfg = load_qwen3vl_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  auto store = WeightStore::open_dir(dir);
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto w = load_vision_weights(*store, *cfg);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ops::CudaBackendOptions bo;
  bo.f32 = true;
  auto be = ops::make_cuda_backend(bo);
  ASSERT_TRUE(be.ok()) << be.status().message();
  auto made = VisionEncoder::create(*cfg, *w, **be);
  ASSERT_TRUE(made.ok()) << made.status().message();
  VisionEncoder& host = **made;
  // Every image of every case, kept resized for the batched pass at the end.
  std::vector<PreprocessedImage> kept;
  std::vector<VisionOutput> single;
  for (const auto& c : ref["cases"]) {
    std::vector<float> embeds;
    std::vector<std::vector<float>> ds(cfg->vision_config.deepstack_visual_indexes.size());
    for (const auto& name : c["images"]) {
      const auto& im = ref["images"][name.get<std::string>()];
      const std::string src = im["source"];
      auto img = load_image_file((src.rfind("synthetic", 0) == 0 ? dir : kTestData + "/images") +
                                 "/" + src);
      ASSERT_TRUE(img.ok()) << img.status().message();
      PreprocessOptions o;
      o.min_pixels = im["min_pixels"].get<int64_t>();
      o.max_pixels = im["max_pixels"].get<int64_t>();
      auto p = preprocess_image(*img, o);
      ASSERT_TRUE(p.ok()) << p.status().message();
      VisionOutput out, from_rgb;
      const GridThw grid{p->grid_t, p->grid_h, p->grid_w};
      ASSERT_TRUE(host.encode(p->pixel_values.data(), grid, &out).ok());
      // The resized image patchified on the GPU gives the same patches, so the same outputs.
      o.patchify = false;
      auto r = preprocess_image(*img, o);
      ASSERT_TRUE(r.ok()) << r.status().message();
      const RgbImage one{r->resized_rgb.data(), r->lut.data(), grid};
      ASSERT_TRUE(host.encode_rgb_batch(&one, 1, &from_rgb).ok());
      EXPECT_EQ(from_rgb.embeds, out.embeds);
      EXPECT_EQ(from_rgb.deepstack, out.deepstack);
      kept.push_back(std::move(r).value());
      single.push_back(out);
      embeds.insert(embeds.end(), out.embeds.begin(), out.embeds.end());
      for (size_t k = 0; k < ds.size(); ++k) {
        ds[k].insert(ds[k].end(), out.deepstack[k].begin(), out.deepstack[k].end());
      }
    }
    EXPECT_LE(rel_err(embeds, npy(dir + "/" + c["image_embeds"]["file"].get<std::string>())),
              kTolF32)
        << c["name"];
    ASSERT_EQ(c["deepstack"].size(), ds.size());
    for (size_t k = 0; k < ds.size(); ++k) {
      EXPECT_LE(rel_err(ds[k], npy(dir + "/" + c["deepstack"][k]["file"].get<std::string>())),
                kTolF32)
          << c["name"] << " tap " << k;
    }
  }
  // All of them in one pass of the tower (different sizes side by side): each image's outputs
  // as on its own, to the f32 tolerance (the products' blocking may differ with the row count).
  std::vector<RgbImage> batch;
  for (const PreprocessedImage& p : kept) {
    batch.push_back({p.resized_rgb.data(), p.lut.data(), GridThw{p.grid_t, p.grid_h, p.grid_w}});
  }
  std::vector<VisionOutput> outs(batch.size());
  ASSERT_TRUE(
      host.encode_rgb_batch(batch.data(), static_cast<int64_t>(batch.size()), outs.data()).ok());
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_EQ(outs[i].tokens, single[i].tokens);
    EXPECT_LE(rel_err(outs[i].embeds, single[i].embeds), kTolF32) << "image " << i;
    for (size_t k = 0; k < single[i].deepstack.size(); ++k) {
      EXPECT_LE(rel_err(outs[i].deepstack[k], single[i].deepstack[k]), kTolF32) << "image " << i;
    }
  }
}

// Images through the engine: the GPU vision tower's features replace the pads and DeepStack adds
// them after the first decoder layers; prompts span several 16-token chunks, images cut across
// them.
TEST(CudaVisionModel, MultimodalLogitsAndGreedyMatchTransformers) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = kFixtures + "/vision-f32";
  auto e = gpu_engine(dir, "f32");
  ASSERT_NE(e, nullptr);
  const auto ref = reference(dir);
  auto image = [&](const std::string& name) {
    const auto& im = ref["images"][name];
    const std::string src = im["source"];
    ImageInput in;
    in.path = (src.rfind("synthetic", 0) == 0 ? dir : kTestData + "/images") + "/" + src;
    in.min_pixels = im["min_pixels"].get<int64_t>();
    in.max_pixels = im["max_pixels"].get<int64_t>();
    return in;
  };
  for (const auto& c : ref["cases"]) {
    std::vector<ImageInput> images;
    for (const auto& name : c["images"]) images.push_back(image(name));
    auto got = e->logits(c["prompt_ids"].get<std::vector<int32_t>>(), images);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_LE(rel_err(*got, npy(dir + "/" + c["logits"]["file"].get<std::string>())), kTolF32)
        << c["name"];
    GenerateRequest req;
    req.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    req.images = images;
    req.max_new_tokens = c["greedy"]["max_new_tokens"].get<int64_t>();
    req.sampling.do_sample = false;
    req.ignore_eos = true;
    auto res = e->generate(req);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_EQ(res->output_ids, c["greedy"]["output_ids"].get<std::vector<int32_t>>()) << c["name"];
  }
}

// The Qwen3-VL demo model (models/tiny-qwen3vl; the default Qwen3.5 has no CUDA kernels yet) on
// the GPU (f32) under continuous batching: 100 unseen scenes submitted at
// once, 32 sequences per step over the paged cache, each answer equal to transformers'.
TEST(CudaServing, ShapesModelAnswersAsTransformersUnderBatching) {
  SKIP_WITHOUT_DEVICE();
  const std::string scenes = kFixtures + "/shapes-qa";
  EngineOptions o = gpu_options(kRepo + "/models/tiny-qwen3vl", "f32");
  o.require_tokenizer = true;
  o.batching.max_num_seqs = 32;
  auto loaded = Engine::load(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Engine& engine = **loaded;
  EXPECT_GT(engine.core_stats().kv_blocks_total, 0);
  Engine::GpuStats g;  // what /metrics reports on "cuda"
  ASSERT_TRUE(engine.gpu_stats(&g)) << "NVML did not answer";
  EXPECT_GT(g.memory_used, 0);
  EXPECT_LE(g.memory_used, g.memory_total);

  const auto cases =
      nlohmann::json::parse(test_util::read_file(scenes + "/cases-tiny-qwen3vl.json"))["cases"];
  ASSERT_EQ(cases.size(), 100u);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& c : cases) {
    ChatMessage user;
    user.role = "user";
    user.content_is_text = false;
    user.parts.push_back(ChatPart::of_image({}));
    user.parts.push_back(ChatPart::of_text(c["question"].get<std::string>()));
    GenerateRequest req;
    req.prompt_ids = engine.tokenizer()->encode(render_chat({user}, {}));
    ImageInput in;
    in.path = scenes + "/" + c["image"].get<std::string>();
    req.images.push_back(in);
    req.sampling.do_sample = false;
    req.max_new_tokens = 40;
    auto stream = engine.submit(std::move(req));
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    streams.push_back(std::move(stream).value());
  }
  int right = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    std::string text;
    bool finished = false;
    RequestOutput piece;
    while (streams[i]->next(&piece)) {
      EXPECT_TRUE(piece.error.ok()) << piece.error.message();
      text += piece.text;
      finished = finished || piece.finished;
    }
    ASSERT_TRUE(finished) << "scene " << i << " never finished";
    EXPECT_EQ(text, cases[i]["transformers"].get<std::string>()) << "scene " << i;
    right += text == cases[i]["truth"].get<std::string>();
  }
  std::printf("shapes-qa on %s: %d/100 right, %lld passes from CUDA graphs\n",
              engine.device().c_str(), right, static_cast<long long>(engine.cuda_graph_replays()));
  EXPECT_GT(engine.cuda_graph_replays(), 0);  // the decode steps ran as graphs
}

// CUDA graphs change nothing but the launches: the same 24 greedy continuations in BF16 (many
// batch sizes as requests finish) with graphs and without, token for token.
class CudaGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraphs, GiveTheSameTokensAsPlainLaunches) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = kFixtures + "/" + GetParam();
  const auto ref = reference(dir);
  std::vector<std::vector<int32_t>> runs[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    EngineOptions o = gpu_options(dir);
    o.cuda_graphs = graphs == 1;
    o.batching.max_num_seqs = 24;
    auto loaded = Engine::load(o);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    std::vector<std::unique_ptr<RequestStream>> streams;
    const auto prompt = ref["logits"][2]["ids"].get<std::vector<int32_t>>();  // 60 ids
    ASSERT_GE(prompt.size(), 32u);
    for (int i = 0; i < 24; ++i) {
      GenerateRequest req;
      req.prompt_ids.assign(prompt.begin(), prompt.begin() + 8 + i);  // 24 different prompts
      req.sampling.do_sample = false;
      req.ignore_eos = true;
      req.max_new_tokens = 8 + 2 * i;  // they finish one after another
      auto stream = (*loaded)->submit(std::move(req));
      ASSERT_TRUE(stream.ok()) << stream.status().message();
      streams.push_back(std::move(stream).value());
    }
    for (auto& stream : streams) {
      std::vector<int32_t> tokens;
      RequestOutput piece;
      while (stream->next(&piece)) {
        if (piece.token_id >= 0) tokens.push_back(piece.token_id);
      }
      runs[graphs].push_back(tokens);
    }
    if (graphs == 1) EXPECT_GT((*loaded)->cuda_graph_replays(), 0);
    if (graphs == 0) EXPECT_EQ((*loaded)->cuda_graph_replays(), 0);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// A dense model, and a mixture of experts (the router and the grouping on padded graph rows), in
// BF16.
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphs, ::testing::Values("text-bf16-hd128", "moe-f32-e8k2"),
                         [](const auto& info) { return test_util::param_name(info.param); });

// FP8 has no expert products: a mixture of experts under --quant fp8 is refused after the config
// is read, before any weight is built (so this runs without a GPU too).
TEST(CudaQuant, Fp8RefusesAMixtureOfExperts) {
  EngineOptions o = gpu_options(kFixtures + "/moe-f32-e8k2");
  o.quant = Quant::kFp8;
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--quant fp8 has no expert kernels"), std::string::npos)
      << e.status().message();
}

// Speculative decoding's verify passes are not yet proven on a GPU: --spec is refused there by
// name (the CPU runs it: spec_decode_test).
TEST(CudaOptions, SpeculativeDecodingIsRefused) {
  SKIP_WITHOUT_DEVICE();
  EngineOptions o = gpu_options(kFixtures + "/text-f32-untied");
  o.batching.spec.method = SpecMethod::kNgram;
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("runs on the CPU only"), std::string::npos)
      << e.status().message();
}

// --quant int8 on the GPU in f32 is the CPU's INT8 model with f32 activations (generic kernels):
// the same quantized weights and f32 sums, so the logits agree to the f32 tolerance. Prompts of
// 1, 7 and 60 tokens in 16-token chunks take both INT8 paths (direct and dequantized); on the
// mixture of experts, the grouped product's INT8 rows.
TEST(CudaQuant, Int8LogitsMatchTheCpuInt8Model) {
  SKIP_WITHOUT_DEVICE();
  for (const char* fixture : {"text-f32-untied", "text-bf16-hd128", "moe-f32-e16k4"}) {
    const std::string dir = kFixtures + "/" + fixture;
    EngineOptions o = gpu_options(dir, "f32");
    o.prefill_chunk = 16;
    o.quant = Quant::kInt8;
    o.device = Device::kCpu;
    o.cpu_isa = CpuIsa::kGeneric;
    auto cpu = Engine::load(o);
    ASSERT_TRUE(cpu.ok()) << cpu.status().message();
    o.device = Device::kCuda;
    auto gpu = Engine::load(o);
    ASSERT_TRUE(gpu.ok()) << gpu.status().message();
    EXPECT_EQ((*gpu)->decode_weight_bytes(), (*cpu)->decode_weight_bytes());  // INT8 + scales
    for (const auto& entry : reference(dir)["logits"]) {
      const auto ids = entry["ids"].get<std::vector<int32_t>>();
      auto want = (*cpu)->logits(ids);
      auto got = (*gpu)->logits(ids);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_LE(rel_err(*got, *want), kTolF32) << fixture << ", " << ids.size() << " ids";
    }
  }
}

// Sampling on the device through the serving engine: top-k 1 at any temperature is greedy, so
// those requests must give the greedy tokens exactly; full sampling with a seed (temperature,
// top-p, min-p, penalties) gives the same tokens twice and stays in the vocabulary.
TEST(CudaServing, DeviceSamplingIsGreedyAtTopK1AndReproducible) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = kFixtures + "/text-bf16-hd128";
  auto loaded = Engine::load(gpu_options(dir));
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const auto prompt = reference(dir)["logits"][2]["ids"].get<std::vector<int32_t>>();
  auto run = [&](const SamplingParams& sp) {
    GenerateRequest req;
    req.prompt_ids = prompt;
    req.sampling = sp;
    req.ignore_eos = true;
    req.max_new_tokens = 24;
    auto res = (*loaded)->generate(req);
    EXPECT_TRUE(res.ok()) << res.status().message();
    return res.ok() ? res->output_ids : std::vector<int32_t>{};
  };
  SamplingParams greedy;
  greedy.do_sample = false;
  SamplingParams top1;
  top1.do_sample = true;
  top1.temperature = 0.7;
  top1.top_k = 1;
  top1.seed = 3;
  const auto g = run(greedy);
  ASSERT_EQ(g.size(), 24u);
  EXPECT_EQ(run(top1), g);
  SamplingParams full;
  full.do_sample = true;
  full.temperature = 1.2;
  full.top_p = 0.9;
  full.min_p = 0.02;
  full.repetition_penalty = 1.1;
  full.frequency_penalty = 0.3;
  full.seed = 11;
  const auto a = run(full), b = run(full);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 24u);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < (*loaded)->vocab_size());
}

// --quant fp8 (E4M3 weights and activations, per-tensor scales) against the same model in BF16
// on the GPU, over every position of the reference prompts: the share of unchanged argmaxes and
// the mean |Δlogit| / max|logit|. E4M3 keeps 3 mantissa bits (up to 6% per value), coarser than
// INT8's per-row 0.6%, so the bounds are INT4's in quant_test (there: ≥ 42% top-1, ≤ 8e-2),
// widened once more for the activations' rounding: ≥ 40% and ≤ 1e-1. Not yet measured on a GPU.
TEST(CudaQuant, Fp8LogitsStayCloseToBf16) {
  SKIP_WITHOUT_DEVICE();
  for (const char* fixture : {"text-f32-untied", "text-bf16-hd128"}) {
    const std::string dir = kFixtures + "/" + fixture;
    auto bf16 = gpu_engine(dir, "bf16");
    EngineOptions o = gpu_options(dir);
    o.prefill_chunk = 16;
    o.quant = Quant::kFp8;
    auto fp8 = Engine::load(o);
    ASSERT_NE(bf16, nullptr);
    ASSERT_TRUE(fp8.ok()) << fp8.status().message();
    const int64_t V = bf16->vocab_size();
    int64_t positions = 0, agree = 0;
    double sum_abs = 0, max_logit = 0, count = 0;
    for (const auto& entry : reference(dir)["logits"]) {
      const auto ids = entry["ids"].get<std::vector<int32_t>>();
      auto a = bf16->logits(ids);
      auto b = (*fp8)->logits(ids);
      ASSERT_TRUE(a.ok() && b.ok());
      for (size_t p = 0; p < ids.size(); ++p) {
        const float* ra = a->data() + p * V;
        const float* rb = b->data() + p * V;
        agree += std::max_element(ra, ra + V) - ra == std::max_element(rb, rb + V) - rb;
        for (int64_t v = 0; v < V; ++v) {
          sum_abs += std::fabs(static_cast<double>(ra[v]) - rb[v]);
          max_logit = std::max(max_logit, std::fabs(static_cast<double>(ra[v])));
        }
        count += static_cast<double>(V);
        ++positions;
      }
    }
    const double top1 = static_cast<double>(agree) / positions;
    const double mean_rel = sum_abs / count / max_logit;
    std::printf("[fp8] %s: top-1 agreement %.4f, mean|d|/max|logit| %.3e over %lld positions\n",
                fixture, top1, mean_rel, static_cast<long long>(positions));
    EXPECT_GE(top1, 0.40) << fixture;
    EXPECT_LE(mean_rel, 0.10) << fixture;
    EXPECT_GT(mean_rel, 0.0) << fixture;  // the products really ran in FP8
  }
}

// Options the GPU path refuses, with or without a GPU.
TEST(CudaOptions, UnsupportedCombinationsAreRefused) {
  EngineOptions o = gpu_options(kFixtures + "/text-f32-untied");
  o.quant = Quant::kInt4;
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("CPU-only"), std::string::npos) << e.status().message();
  o.quant = Quant::kNone;
  o.gpu_dtype = GpuDtype::kF32;
  o.quant = Quant::kFp8;  // FP8 products take BF16 activations
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("fp8"), std::string::npos) << e.status().message();
  EXPECT_FALSE(parse_gpu_dtype("fp8").ok());  // the spellings are checked where they come in
  o.gpu_dtype = GpuDtype::kBF16;
  o.device = Device::kCpu;
  o.quant = Quant::kFp8;  // the GPU's own
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--device cuda"), std::string::npos) << e.status().message();
  o.quant = Quant::kNone;
  auto tpu = parse_device("tpu");
  ASSERT_FALSE(tpu.ok());
  EXPECT_NE(tpu.status().message().find("unknown device"), std::string::npos);
  o.device = Device::kCpu;  // the CPU engine reports no GPU figures
  auto cpu = Engine::load(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  Engine::GpuStats g;
  EXPECT_FALSE((*cpu)->gpu_stats(&g));
  if (cuda::device_count() == 0) {  // no GPU: a clear error, not a crash
    o.device = Device::kCuda;
    e = Engine::load(o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("no CUDA device"), std::string::npos)
        << e.status().message();
  }
}

}  // namespace
}  // namespace vlm
