// Continuous batching through the engine core, on the public API (Engine::submit and its
// streams): requests submitted concurrently produce exactly the tokens each produces alone through
// Engine::generate on an engine that runs one request at a time (f32, greedy) — with and without
// preemption — and a cancelled request frees its KV blocks without disturbing the others.
#include "engine/engine_core.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include "model/fixture_model.h"
#include "test_util.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;

using test_util::load_fixture_engine;

std::vector<GenerateRequest> requests(int n, int max_new) {
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    for (int j = 0; j < 1 + (i * 7) % 40; ++j) r.prompt_ids.push_back(3 + (i * 131 + j * 17) % 990);
    r.max_new_tokens = max_new + (i % 3);
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

// Each request alone, on an engine with the default limits.
std::vector<std::vector<int32_t>> one_by_one(const std::string& fixture,
                                             const std::vector<GenerateRequest>& reqs) {
  auto engine = load_fixture_engine(fixture);
  std::vector<std::vector<int32_t>> out;
  if (engine == nullptr) return out;
  for (const auto& r : reqs) {
    auto res = engine->generate(r);
    EXPECT_TRUE(res.ok()) << res.status().message();
    out.push_back(res.ok() ? res->output_ids : std::vector<int32_t>{});
  }
  return out;
}

// A stream read to its end: the tokens, and the final piece.
struct Drained {
  std::vector<int32_t> tokens;
  std::vector<RequestOutput> pieces;  // those with a token
  RequestOutput last;
  bool finished = false;
};

Drained drain(RequestStream& stream) {
  Drained d;
  RequestOutput piece;
  while (stream.next(&piece)) {
    if (piece.token_id >= 0) {
      d.tokens.push_back(piece.token_id);
      d.pieces.push_back(piece);
    }
    if (piece.finished) {
      d.finished = true;
      d.last = piece;
    }
  }
  return d;
}

// Submits every request from 4 threads at once, each thread then reading its streams; returns
// tokens by request index. Every request must end by its length.
std::vector<std::vector<int32_t>> run_concurrently(Engine& engine,
                                                   const std::vector<GenerateRequest>& reqs) {
  std::vector<Drained> got(reqs.size());
  std::vector<Status> submitted(reqs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<size_t, std::unique_ptr<RequestStream>>> mine;
      for (size_t i = t; i < reqs.size(); i += 4) {
        auto s = engine.submit(reqs[i]);
        submitted[i] = s.status();
        if (s.ok()) mine.emplace_back(i, std::move(s).value());
      }
      for (auto& [i, s] : mine) got[i] = drain(*s);
    });
  }
  for (auto& th : threads) th.join();
  engine.wait_idle();
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(submitted[i].ok()) << "request " << i << ": " << submitted[i].message();
    EXPECT_TRUE(got[i].finished) << "request " << i << " never finished";
    EXPECT_TRUE(got[i].last.error.ok()) << got[i].last.error.message();
    EXPECT_EQ(got[i].last.finish_reason, FinishReason::kLength) << "request " << i;
    out.push_back(got[i].tokens);
  }
  return out;
}

TEST(EngineCore, SixteenConcurrentRequestsEqualSequentialOnes) {
  auto reqs = requests(16, 8);
  const auto want = one_by_one("text-f32-untied", reqs);
  BatchingOptions o;
  o.block_size = 4;
  o.max_num_seqs = 8;         // half wait at first: they join as others leave
  o.max_batched_tokens = 48;  // long prompts are prefilled in chunks beside running decodes
  auto engine = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(run_concurrently(*engine, reqs), want);
  auto st = engine->core_stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.steps, 0);
  // Engine::generate runs through the same core, from several threads at once.
  std::vector<std::vector<int32_t>> by_generate(reqs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < reqs.size(); i += 3) {
        auto res = engine->generate(reqs[i]);
        if (res.ok()) by_generate[i] = res->output_ids;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(by_generate, want);
}

// --kv-cache-memory sizes the cache in bytes whatever it stores: BF16 holds twice the blocks of
// f32, INT8 (a byte per value plus a 4-byte scale per token and KV head) nearly four times; the
// type, size and bytes are reported; a budget below two blocks is refused by name.
TEST(EngineCore, KvCacheMemoryBudgetHoldsMoreBlocksInSmallerTypes) {
  const std::string dir = kFixtures + "/text-f32-untied";
  const auto cfg = nlohmann::json::parse(test_util::read_file(dir + "/config.json"));
  const auto& tc = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  const int64_t layers = tc["num_hidden_layers"], n_kv = tc["num_key_value_heads"];
  const int64_t hd = tc.value(
      "head_dim", tc["hidden_size"].get<int64_t>() / tc["num_attention_heads"].get<int64_t>());
  constexpr int64_t kBudget = 8 << 20, kBs = 16;
  std::map<std::string, int64_t> blocks;
  for (KvCacheDtype t : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kInt8}) {
    EngineOptions o;
    o.model_dir = dir;
    o.require_tokenizer = false;
    o.n_threads = 2;
    o.kv_cache_dtype = t;
    o.batching.kv_cache_memory = kBudget;
    auto e = Engine::load(o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    const Engine::CoreStats st = (*e)->core_stats();
    const int64_t value_bytes = t == KvCacheDtype::kF32 ? 4 : t == KvCacheDtype::kBF16 ? 2 : 1;
    const int64_t row = n_kv * hd * value_bytes + (t == KvCacheDtype::kInt8 ? n_kv * 4 : 0);
    const int64_t per_block = layers * 2 * kBs * row;
    EXPECT_EQ(st.kv_cache_dtype, t);
    EXPECT_EQ(st.kv_blocks_total, kBudget / per_block - 1);  // one more block is scratch
    EXPECT_EQ(st.kv_block_size, kBs);
    EXPECT_EQ(st.kv_cache_bytes, (st.kv_blocks_total + 1) * per_block);
    EXPECT_LE(st.kv_cache_bytes, kBudget);
    blocks[kv_cache_dtype_name(t)] = st.kv_blocks_total;
    // And it runs.
    auto r = (*e)->generate(requests(1, 4)[0]);
    EXPECT_TRUE(r.ok()) << r.status().message();
  }
  EXPECT_GE(blocks["bf16"], 2 * blocks["f32"]);
  EXPECT_GE(blocks["int8"], 3 * blocks["f32"]);
  EngineOptions o;
  o.model_dir = dir;
  o.require_tokenizer = false;
  o.batching.kv_cache_memory = 1000;
  auto small = Engine::load(o);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("kv_cache_memory"), std::string::npos)
      << small.status().message();
}

TEST(EngineCore, PreemptionUnderKvPressureKeepsResultsExact) {
  auto reqs = requests(12, 10);
  const auto want = one_by_one("text-f32-untied", reqs);
  BatchingOptions o;
  o.block_size = 4;
  o.num_blocks = 16;  // 64 positions for up to 8 sequences of up to ~52 tokens: must preempt
  o.max_num_seqs = 8;
  o.max_batched_tokens = 32;
  auto engine = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(run_concurrently(*engine, reqs), want);
  auto st = engine->core_stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

// The vision-f32 fixture's cases (reference.json `ref`) as greedy requests of `max_new` tokens.
std::vector<GenerateRequest> vision_fixture_requests(const nlohmann::json& ref, int64_t max_new) {
  std::vector<GenerateRequest> reqs;
  for (const auto& c : ref["cases"]) {
    GenerateRequest r;
    r.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& name : c["images"])
      r.images.push_back(test_util::vision_fixture_image(ref, name));
    r.max_new_tokens = max_new;
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

TEST(EngineCore, ImagesThroughTheBatchMatchGenerate) {
  auto ref = nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  const std::vector<GenerateRequest> reqs = vision_fixture_requests(ref, 12);
  const auto want = one_by_one("vision-f32", reqs);
  BatchingOptions o;
  o.block_size = 8;
  o.max_batched_tokens = 24;  // images split across chunks next to other requests' decodes
  auto engine = load_fixture_engine("vision-f32", o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(run_concurrently(*engine, reqs), want);

  // The vision cache: each distinct (file, pixel budget) is encoded once; every other use of it,
  // including all of the second round, is a hit, and the replies do not change.
  std::set<std::tuple<std::string, int64_t, int64_t>> distinct;
  int64_t total = 0;
  for (const auto& r : reqs) {
    for (const auto& in : r.images) distinct.emplace(in.path, *in.min_pixels, *in.max_pixels);
    total += static_cast<int64_t>(r.images.size());
  }
  Engine::CoreStats st = engine->core_stats();
  EXPECT_EQ(st.vision_cache_misses, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(st.vision_cache_hits, total - static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(st.vision_cache_entries, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(run_concurrently(*engine, reqs), want);
  st = engine->core_stats();
  EXPECT_EQ(st.vision_cache_misses, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(st.vision_cache_hits, 2 * total - static_cast<int64_t>(distinct.size()));

  // A broken image is refused at submit, naming the image.
  GenerateRequest bad = reqs[0];
  bad.images[0].path.clear();
  bad.images[0].bytes = {0x89, 'P', 'N', 'G', 1, 2, 3};
  auto refused = engine->submit(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("image 1"), std::string::npos)
      << refused.status().message();
}

// While a stream decodes, an image's vision-tower pass is sliced over the engine's steps (here
// one unit per step: a budget of a nanosecond) and the stream gets a token at the steps that run
// them; the image requests' replies equal theirs run alone (whole encodes), and a request
// cancelled mid-encode frees the encoder for the next one.
// A text-only greedy stream that runs for 3000 tokens: the running request the tests below put
// other work beside.
GenerateRequest long_greedy_text(std::vector<int32_t> prompt_ids) {
  GenerateRequest r;
  r.prompt_ids = std::move(prompt_ids);
  r.max_new_tokens = 3000;
  r.ignore_eos = true;
  r.sampling.do_sample = false;
  return r;
}

TEST(EngineCore, ImageEncodesAreSlicedBesideRunningStreams) {
  auto ref = nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  const std::vector<GenerateRequest> reqs = vision_fixture_requests(ref, 6);
  const auto want = one_by_one("vision-f32", reqs);
  std::mutex mu;
  std::vector<std::pair<int64_t, double>> encodes;  // (slices, seconds) per step
  EngineOptions o = test_util::fixture_engine_options("vision-f32");
  o.batching.max_encoder_ms = 1e-6;
  o.batching.vision_cache_mib = 0;  // every image is encoded
  o.on_encode = [&](int64_t slices, double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    encodes.emplace_back(slices, seconds);
  };
  auto loaded = Engine::load(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Engine& engine = **loaded;
  auto runner = engine.submit(long_greedy_text({10, 11, 12, 13, 14, 15, 16, 17}));
  ASSERT_TRUE(runner.ok()) << runner.status().message();
  RequestOutput piece;
  ASSERT_TRUE((*runner)->next(&piece));  // it runs
  std::vector<int64_t> stream_steps;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto s = engine.submit(reqs[i]);
    ASSERT_TRUE(s.ok()) << s.status().message();
    Drained d = drain(**s);
    EXPECT_TRUE(d.last.error.ok()) << d.last.error.message();
    EXPECT_EQ(d.tokens, want[i]) << "request " << i;
    while ((*runner)->try_next(&piece)) {
      if (piece.token_id >= 0) stream_steps.push_back(piece.step);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    // Every step ran one unit, and an image takes many (the tower's stages: 4 per block and a
    // few more), so each encode spanned many steps.
    int64_t images = 0;
    for (const auto& r : reqs) images += static_cast<int64_t>(r.images.size());
    EXPECT_GE(static_cast<int64_t>(encodes.size()), images * 16);
    for (const auto& [slices, seconds] : encodes) EXPECT_EQ(slices, 1);
  }
  // The stream kept decoding meanwhile: a token at (nearly) every step.
  ASSERT_FALSE(stream_steps.empty());
  const int64_t span = stream_steps.back() - stream_steps.front() + 1;
  EXPECT_GE(static_cast<double>(stream_steps.size()), 0.9 * static_cast<double>(span));

  // Cancelled mid-encode: the job goes, and the next image request gets its exact reply.
  {
    std::unique_lock<std::mutex> lock(mu);
    encodes.clear();
  }
  auto doomed = engine.submit(reqs[0]);
  ASSERT_TRUE(doomed.ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {  // until its encode has begun
    {
      std::lock_guard<std::mutex> lock(mu);
      if (encodes.size() >= 3) break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the encode never began";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  (*doomed)->cancel();
  auto next = engine.submit(reqs[1]);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(drain(**next).tokens, want[1]);
  (*runner)->cancel();
  engine.wait_idle();
}

// Beside running streams, prefill chunks share the step's time budget with the encode: with a
// budget of (almost) nothing, once the engine has measured a prompt token's cost, a prompt
// advances by the smallest chunk the engine runs beside decodes (16 tokens) a step while the
// stream gets its token every step, and the reply is the one a whole prefill gives.
TEST(EngineCore, PromptChunksBesideRunningStreamsFollowTheBudget) {
  std::vector<GenerateRequest> reqs;
  for (int64_t n : {48, 200}) {
    GenerateRequest r;
    for (int64_t j = 0; j < n; ++j)
      r.prompt_ids.push_back(static_cast<int32_t>(7 + (j * 13 + n * 31) % 900));
    r.max_new_tokens = 4;
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  const auto want = one_by_one("text-f32-untied", reqs);
  EngineOptions o = test_util::fixture_engine_options("text-f32-untied");
  o.batching.max_encoder_ms = 1e-6;
  auto loaded = Engine::load(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Engine& engine = **loaded;
  auto runner = engine.submit(long_greedy_text({10, 11, 12}));
  ASSERT_TRUE(runner.ok()) << runner.status().message();
  RequestOutput piece;
  ASSERT_TRUE((*runner)->next(&piece));  // it decodes
  ASSERT_TRUE((*runner)->next(&piece));
  int64_t stream_tokens = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    while ((*runner)->try_next(&piece)) {
    }
    auto s = engine.submit(reqs[i]);
    ASSERT_TRUE(s.ok()) << s.status().message();
    RequestOutput first;
    ASSERT_TRUE((*s)->next(&first));  // the prompt is done
    stream_tokens = 0;
    while ((*runner)->try_next(&piece)) stream_tokens += piece.token_id >= 0 ? 1 : 0;
    Drained d = drain(**s);
    d.tokens.insert(d.tokens.begin(), first.token_id);
    EXPECT_EQ(d.tokens, want[i]) << "request " << i;
  }
  // The first prompt measured a token's cost; the second went in 12 chunks, a step each, with a
  // stream token in each (a whole prefill would take one step).
  EXPECT_GE(stream_tokens, 5);
  (*runner)->cancel();
  engine.wait_idle();
}

// An image is priced in tokens from its header before it is decoded or resized: one the context
// cannot hold is refused at submit (400 upstream) without a pixel of work. The 32x32 PNG at a
// budget of 1e8 pixels would be upscaled to ~97,000 tokens; the other is a 4000x4000 PNG header
// with no pixel data at all (decoding it would fail differently).
TEST(EngineCore, ImagesArePricedBeforeTheyAreDecoded) {
  auto engine = load_fixture_engine("vision-f32");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r;
  r.prompt_ids = {5,    6,    1002,
                  1000, 1003, 7};  // text, vision_start, one image pad, vision_end, text
  ImageInput small;
  const std::string png =
      test_util::read_file(kFixtures + "/../../unit/fixtures/images/png_rgb.png");
  small.bytes.assign(png.begin(), png.end());
  small.min_pixels = 100000000;
  small.max_pixels = 100000000;
  GenerateRequest upscaled = r;
  upscaled.images = {small};
  auto refused = engine->submit(upscaled);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("image 1"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("tokens at the pixel budget"), std::string::npos)
      << refused.status().message();
  // A header that promises 4000x4000 and nothing else: priced (and refused) from the header.
  std::string header = png.substr(0, 33);  // signature + IHDR chunk
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) header[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  put32(16, 4000);
  put32(20, 4000);
  ImageInput big;
  big.bytes.assign(header.begin(), header.end());
  GenerateRequest huge = r;
  huge.images = {big};
  auto priced = engine->submit(huge);
  ASSERT_FALSE(priced.ok());
  EXPECT_NE(priced.status().message().find("4000x4000"), std::string::npos)
      << priced.status().message();
  EXPECT_NE(priced.status().message().find("tokens at the pixel budget"), std::string::npos)
      << priced.status().message();
  EXPECT_EQ(std::string(priced.status().message()).find("/"), std::string::npos)
      << "no path in the message: " << priced.status().message();
}

// max_tokens near INT64_MAX is checked without overflow: refused, the number shown as sent.
// A solid-colour RGB PNG of w x h, compressed with zlib (a few KB however large).
std::vector<uint8_t> big_png(int w, int h) {
  auto be32 = [](std::vector<uint8_t>* o, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) o->push_back(static_cast<uint8_t>(v >> s));
  };
  auto chunk = [&](std::vector<uint8_t>* o, const char* type, const std::vector<uint8_t>& d) {
    be32(o, static_cast<uint32_t>(d.size()));
    const size_t start = o->size();
    o->insert(o->end(), type, type + 4);
    o->insert(o->end(), d.begin(), d.end());
    be32(o,
         static_cast<uint32_t>(crc32(0, o->data() + start, static_cast<uInt>(o->size() - start))));
  };
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(h) * (1 + 3 * w));
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    for (int x = 0; x < w; ++x) raw.insert(raw.end(), {200, 120, 40});
  }
  uLongf n = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> z(n);
  EXPECT_EQ(compress2(z.data(), &n, raw.data(), static_cast<uLong>(raw.size()), 9), Z_OK);
  z.resize(n);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  be32(&ihdr, static_cast<uint32_t>(w));
  be32(&ihdr, static_cast<uint32_t>(h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  chunk(&png, "IHDR", ihdr);
  chunk(&png, "IDAT", z);
  chunk(&png, "IEND", {});
  return png;
}

int64_t peak_rss_kib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// Sixteen 9-megapixel images submitted at once from 16 threads (27 MB of RGB each, decoded on
// the submitting threads): with a budget of 10 megapixels they decode one after another, so the
// process never holds more than about two of them; every request still succeeds.
TEST(EngineCore, DecodedPixelsInFlightStayWithinTheBudget) {
  const auto ref =
      nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  BatchingOptions o;
  o.max_inflight_image_pixels = 10'000'000;
  auto engine = load_fixture_engine("vision-f32", o);
  ASSERT_NE(engine, nullptr);
  const std::vector<uint8_t> png = big_png(3000, 3000);
  GenerateRequest r;
  r.prompt_ids = ref["cases"][0]["prompt_ids"].get<std::vector<int32_t>>();
  ImageInput in;
  in.bytes = png;
  in.min_pixels = 4096;
  in.max_pixels = 16384;
  r.images = {in};
  r.max_new_tokens = 2;
  r.sampling.do_sample = false;
  const int64_t before = peak_rss_kib();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      auto res = engine->generate(r);
      if (res.ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 16);
  const Engine::CoreStats st = engine->core_stats();
  EXPECT_LE(st.image_pixels_peak, 10'000'000);
  EXPECT_EQ(st.image_pixels_peak, 9'000'000);  // one at a time
  EXPECT_GT(st.image_pixel_waits, 0);
  // Without the budget 16 decodes at once would hold ~430 MB of RGB alone.
  EXPECT_LT(peak_rss_kib() - before, 200 * 1024)
      << "peak RSS grew by " << (peak_rss_kib() - before) / 1024 << " MiB";
}

TEST(EngineCore, HugeMaxTokensIsRefusedWithoutOverflow) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = requests(1, 1)[0];
  r.max_new_tokens = std::numeric_limits<int64_t>::max();
  auto refused = engine->submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("9223372036854775807"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(refused.status().message().find("-"), std::string::npos) << refused.status().message();
}

TEST(EngineCore, VisionCacheIsBoundedInBytes) {
  BatchingOptions o;
  o.block_size = 8;
  o.vision_cache_mib = 0;  // nothing fits: every image is encoded again
  auto engine = load_fixture_engine("vision-f32", o);
  ASSERT_NE(engine, nullptr);
  auto ref = nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  GenerateRequest r;
  r.prompt_ids = ref["cases"][0]["prompt_ids"].get<std::vector<int32_t>>();
  ImageInput in;
  in.path = kFixtures + "/vision-f32/synthetic_tiny.png";
  r.images = {in};
  r.max_new_tokens = 2;
  const auto first = run_concurrently(*engine, {r, r});
  EXPECT_EQ(first[0], first[1]);
  EXPECT_EQ(engine->core_stats().vision_cache_hits, 0);
  EXPECT_EQ(engine->core_stats().vision_cache_misses, 2);
  EXPECT_EQ(engine->core_stats().vision_cache_entries, 0);
}

// Logprobs: log-softmax of the raw logits, checked against Engine::logits on the same sequence.
// Each piece carries its token's entry (no tokenizer here: no text holds entries back).
TEST(EngineCore, LogprobsAreTheModelsLogSoftmax) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = requests(3, 6)[2];
  r.logprobs = 4;
  r.sampling.repetition_penalty = 1.3;  // penalties change sampling, never the reported logprobs
  auto stream = engine->submit(r);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  const Drained got = drain(**stream);
  ASSERT_EQ(got.tokens.size(), static_cast<size_t>(*r.max_new_tokens));
  std::vector<int32_t> seq = r.prompt_ids;
  for (int32_t t : got.tokens) seq.push_back(t);
  auto logits = engine->logits(seq);
  ASSERT_TRUE(logits.ok());
  const int64_t V = engine->vocab_size();
  int64_t worst_rank = 0;
  for (size_t t = 0; t < got.tokens.size(); ++t) {
    const float* row = logits->data() + (r.prompt_ids.size() - 1 + t) * V;
    double mx = row[0], sum = 0;
    for (int64_t i = 0; i < V; ++i) mx = std::max<double>(mx, row[i]);
    for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - mx);
    const double lse = mx + std::log(sum);
    ASSERT_EQ(got.pieces[t].logprobs.size(), 1u) << "token " << t;
    const TokenLogprob& e = got.pieces[t].logprobs[0];
    EXPECT_EQ(e.token_id, got.tokens[t]);
    EXPECT_NEAR(e.logprob, row[e.token_id] - lse, 1e-4) << "token " << t;
    int64_t above = 0;
    for (int64_t i = 0; i < V; ++i) above += row[i] > row[e.token_id];
    EXPECT_EQ(e.rank, above + 1) << "token " << t;
    worst_rank = std::max(worst_rank, e.rank);
    ASSERT_EQ(e.top_logprobs.size(), 4u);
    std::vector<int32_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 4, order.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(e.top_logprobs[k].token_id, order[k]) << "token " << t << " rank " << k;
      EXPECT_NEAR(e.top_logprobs[k].logprob, row[order[k]] - lse, 1e-4);
    }
  }
  EXPECT_GT(worst_rank, 1);  // the penalty made some greedy pick other than the raw argmax
  r.logprobs = 21;
  EXPECT_FALSE(engine->submit(r).ok());
}

// The queue is bounded: past max_waiting queued requests, submit says ResourceExhausted (the
// server's 429) and the queued ones still finish.
TEST(EngineCore, FullQueueRefusesAtSubmit) {
  BatchingOptions o;
  o.block_size = 8;
  o.max_num_seqs = 1;
  o.max_waiting = 2;
  auto engine = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(engine, nullptr);
  auto reqs = requests(4, 8);
  reqs[0].max_new_tokens = 400;  // runs until cancelled below
  auto running = engine->submit(reqs[0]);
  ASSERT_TRUE(running.ok());
  RequestOutput piece;
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE((*running)->next(&piece));  // the step of token 1 has published its stats
  ASSERT_EQ(engine->core_stats().running, 1);
  auto queued1 = engine->submit(reqs[1]);
  auto queued2 = engine->submit(reqs[2]);
  ASSERT_TRUE(queued1.ok());
  ASSERT_TRUE(queued2.ok());
  auto refused = engine->submit(reqs[3]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  (*running)->cancel();
  EXPECT_FALSE((*running)->next(&piece));  // a cancelled stream ends at once
  EXPECT_TRUE(drain(**queued1).finished);
  EXPECT_TRUE(drain(**queued2).finished);
  engine->wait_idle();
}

// A request that could never fit the whole KV cache is refused at submit (the scheduler's own
// check), and one that fits exactly is served.
TEST(EngineCore, RequestLargerThanTheKvCacheIsRefusedAtSubmit) {
  BatchingOptions o;
  o.block_size = 4;
  o.num_blocks = 4;  // 16 tokens in all
  auto engine = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = requests(1, 0)[0];  // a 1-token prompt
  r.max_new_tokens = 16;
  auto refused = engine->submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("KV blocks"), std::string::npos)
      << refused.status().message();
  r.max_new_tokens = 15;
  EXPECT_EQ(run_concurrently(*engine, {r}).at(0).size(), 15u);
  r.max_new_tokens = 0;
  EXPECT_FALSE(engine->submit(r).ok());  // nothing to sample
}

TEST(EngineCore, CancelFreesBlocksAndBadRequestsFailAlone) {
  BatchingOptions o;
  o.block_size = 4;
  o.max_batched_tokens = 1000;  // more than the engine's scratch (prefill_chunk 64): refused
  {
    EngineOptions eo;
    eo.model_dir = kFixtures + "/text-f32-untied";
    eo.require_tokenizer = false;
    eo.prefill_chunk = 64;
    eo.batching = o;
    auto refused = Engine::load(eo);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("max_batched_tokens"), std::string::npos)
        << refused.status().message();
  }
  o.max_batched_tokens = 64;
  auto engine = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(engine, nullptr);
  GenerateRequest long_req = requests(1, 0)[0];
  long_req.max_new_tokens = 2000;
  auto long_stream = engine->submit(long_req);
  ASSERT_TRUE(long_stream.ok());
  RequestOutput piece;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*long_stream)->next(&piece));
  EXPECT_GT(engine->core_stats().kv_blocks_used, 0);
  // A bad request (token id outside the vocabulary) is refused at submit; the running one goes on.
  GenerateRequest bad;
  bad.prompt_ids = {1, 5000};
  auto bad_id = engine->submit(bad);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_NE(bad_id.status().message().find("outside the vocabulary"), std::string::npos);
  // So is one that cannot fit the context, counted with its generation budget.
  GenerateRequest too_long = requests(1, 1)[0];
  too_long.max_new_tokens = engine->max_context();
  auto too_long_id = engine->submit(too_long);
  ASSERT_FALSE(too_long_id.ok());
  EXPECT_EQ(too_long_id.status().code(), StatusCode::kOutOfRange);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*long_stream)->next(&piece));
    EXPECT_FALSE(piece.finished);
  }
  (*long_stream)->cancel();
  EXPECT_FALSE((*long_stream)->next(&piece));  // a cancelled stream gives nothing more
  engine->wait_idle();
  EXPECT_EQ(engine->core_stats().kv_blocks_used, 0);
  EXPECT_EQ(engine->core_stats().running, 0);
  // Dropping a stream cancels its request too.
  {
    auto dropped = engine->submit(long_req);
    ASSERT_TRUE(dropped.ok());
    ASSERT_TRUE((*dropped)->next(&piece));
  }
  engine->wait_idle();
  EXPECT_EQ(engine->core_stats().kv_blocks_used, 0);
  // Invalid sampling is refused at submit.
  GenerateRequest bad_top_p = requests(1, 2)[0];
  bad_top_p.sampling.top_p = 0.0;
  EXPECT_FALSE(engine->submit(bad_top_p).ok());
  // And the core still serves.
  auto reqs = requests(3, 4);
  EXPECT_EQ(run_concurrently(*engine, reqs), one_by_one("text-f32-untied", reqs));
}

// A stream may outlive its Engine: a reader blocked in next() when the Engine is destroyed gets
// the request's end as an error, and a stream nobody read yet still gives its tokens and text
// (the tokenizer is shared with it) and then the same error.
TEST(EngineCore, StreamsOutliveTheEngine) {
  EngineOptions eo;
  eo.model_dir = std::string(VLM_REPO_DIR) + "/models/tiny-qwen3vl";
  eo.n_threads = 2;
  auto loaded = Engine::load(eo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  std::unique_ptr<Engine> engine = std::move(loaded).value();
  GenerateRequest r;
  r.prompt_ids = engine->tokenizer()->encode("Tell me a long story about shapes.");
  r.max_new_tokens = engine->max_context() - static_cast<int64_t>(r.prompt_ids.size()) - 1;
  r.ignore_eos = true;
  auto read = engine->submit(r);
  auto unread = engine->submit(r);
  ASSERT_TRUE(read.ok() && unread.ok());
  std::atomic<int> tokens{0};
  Drained got;
  std::thread reader([&] {
    RequestOutput piece;
    while ((*read)->next(&piece)) {
      if (piece.token_id >= 0) tokens.fetch_add(1);
      if (piece.finished) got.last = piece, got.finished = true;
    }
  });
  while (tokens.load() < 3) std::this_thread::yield();
  engine.reset();  // stops the engine thread mid-request
  reader.join();
  ASSERT_TRUE(got.finished);
  EXPECT_EQ(got.last.error.code(), StatusCode::kUnavailable) << got.last.error.message();
  EXPECT_LT(tokens.load(), *r.max_new_tokens);
  const Drained other = drain(**unread);
  ASSERT_TRUE(other.finished);
  EXPECT_EQ(other.last.error.code(), StatusCode::kUnavailable);
  std::string text;
  for (const auto& p : other.pieces) text += p.text;
  EXPECT_EQ(other.tokens.empty(), text.empty());
}

// Engine::generate stopped by its callback still reports the prompt side of its stats.
TEST(EngineCore, GenerateStoppedByTheCallbackKeepsItsStats) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = requests(3, 20)[2];
  int seen = 0;
  auto res = engine->generate(r, [&](const TokenEvent&) { return ++seen < 2; });
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(res->finish_reason, FinishReason::kNone);
  EXPECT_EQ(res->output_ids.size(), 2u);
  EXPECT_EQ(res->prompt_tokens, static_cast<int64_t>(r.prompt_ids.size()));
  EXPECT_GT(res->prefill_ms, 0);
}

long resident_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The KV cache is reserved at load, not touched: 2 GiB of blocks for this fixture (3 layers, 2
// KV heads of 32: 12 KiB of K and V per 16-token block) cost resident memory only as requests
// write them.
TEST(EngineCore, KvCacheIsReservedNotResident) {
  BatchingOptions o;
  o.block_size = 16;
  o.num_blocks = 174762;  // 2 GiB / 12 KiB
  const long before = resident_kib();
  ASSERT_GT(before, 0);
  auto engine = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->core_stats().kv_blocks_total, 174762);
  auto reqs = requests(4, 8);
  EXPECT_EQ(run_concurrently(*engine, reqs), one_by_one("text-f32-untied", reqs));
  const long grown_mib = (resident_kib() - before) / 1024;
  EXPECT_LT(grown_mib, 256) << "resident memory grew by " << grown_mib << " MiB";
}

// The stream's pieces: a token per piece with the step that sampled it, stats that add up, the
// finish reason on the last; `notify` is called as pieces become ready, and try_next() never
// blocks.
TEST(EngineCore, StreamsReportStepsStatsAndNotify) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = requests(2, 6)[1];  // an 8-token prompt, 7 new tokens
  std::atomic<int> notified{0};
  auto stream = engine->submit(r, [&notified] { notified.fetch_add(1); });
  ASSERT_TRUE(stream.ok());
  std::vector<RequestOutput> pieces;
  RequestOutput piece;
  while (pieces.empty() || !pieces.back().finished) {
    if ((*stream)->try_next(&piece)) {
      pieces.push_back(piece);
    } else {
      std::this_thread::yield();
    }
  }
  EXPECT_FALSE((*stream)->try_next(&piece));
  EXPECT_FALSE((*stream)->next(&piece));
  ASSERT_EQ(pieces.size(), 7u);  // the last token comes with the end
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].finished, i + 1 == pieces.size());
    EXPECT_GE(pieces[i].token_id, 0);
    if (i > 0) {
      EXPECT_EQ(pieces[i].step, pieces[i - 1].step + 1);  // one decode step per token
      EXPECT_GE(pieces[i].sampled_ns, pieces[i - 1].sampled_ns);
    }
  }
  const RequestOutput& last = pieces.back();
  EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(last.stats.prompt_tokens, 8);
  EXPECT_EQ(last.stats.completion_tokens, 7);
  EXPECT_GT(last.stats.prefill_ms, 0);
  EXPECT_GT(last.stats.decode_ms, 0);
  EXPECT_GE(last.stats.queue_ms, 0);
  EXPECT_GE(notified.load(), 1);
  EXPECT_LE(notified.load(), 7);
  // An id from the engine, distinct per request.
  auto other = engine->submit(r);
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)->id(), (*stream)->id());
}

}  // namespace
}  // namespace vlm
