// The CLI's probes (tools/cli/probes.h). The memory-bandwidth probe: finite, positive figures for
// a small buffer, and a read kernel that really reads every byte (its checksum). The
// batched-decode benchmark: it counts the tokens of its decode window. No timing assertions: the
// machine is shared.
#include "probes.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/fixture_model.h"

namespace vlm_cli {
namespace {

MemoryBandwidthOptions options(int64_t bytes, int reps, int threads) {
  MemoryBandwidthOptions o;
  o.bytes = bytes;
  o.reps = reps;
  o.n_threads = threads;
  return o;
}

TEST(Membw, SmallBufferGivesPositiveFiniteFigures) {
  const int reps = 3;
  auto r = measure_memory_bandwidth(options(int64_t{3} << 20, reps, 2));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->bytes, int64_t{3} << 20);
  ASSERT_EQ(r->read_gb_s.size(), static_cast<size_t>(reps));
  ASSERT_EQ(r->copy_gb_s.size(), static_cast<size_t>(reps));
  for (double v : r->read_gb_s) EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  for (double v : r->copy_gb_s) EXPECT_TRUE(std::isfinite(v) && v > 0) << v;

  // Line i holds the byte i & 0xff, so each of its 8 words is that byte times 0x0101...01. The
  // probe sums the buffer once untimed and `reps` times timed, then adds the copy's middle byte.
  const int64_t lines = r->bytes / 64;
  uint64_t one_pass = 0;
  for (int64_t i = 0; i < lines; ++i) one_pass += 8 * static_cast<uint64_t>(i & 0xff);
  one_pass *= 0x0101010101010101ull;
  const uint64_t middle = static_cast<uint64_t>((r->bytes / 2 / 64) & 0xff);
  EXPECT_EQ(r->checksum, (reps + 1) * one_pass + middle);
}

TEST(Membw, RoundsUpToPagesAndRefusesNonsense) {
  auto r = measure_memory_bandwidth(options(5000, 1, 1));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->bytes, 8192);
  EXPECT_FALSE(measure_memory_bandwidth(options(4096, 0, 1)).ok());
}

TEST(Membw, L3SizeIsZeroOrPlausible) {
  const int64_t l3 = last_level_cache_bytes();
  EXPECT_GE(l3, 0);
  if (l3 > 0) EXPECT_GE(l3, int64_t{64} << 10);
}

// The batched-decode benchmark counts the tokens sampled after every request has its first one.
TEST(BatchedDecode, CountsTheDecodeWindow) {
  vlm::BatchingOptions batching;
  batching.max_batched_tokens = 64;
  // A vocabulary with image pads: the prompts must avoid them.
  auto engine = vlm::test_util::load_fixture_engine("vision-f32", batching);
  ASSERT_NE(engine, nullptr);
  for (int64_t id : synthetic_prompt_ids(500, engine->vocab_size(), 7)) {
    ASSERT_TRUE(id >= 3 && id < engine->vocab_size() - 32) << id;
  }
  BatchedDecodeOptions o;
  o.prompt_tokens = 20;
  o.gen_tokens = 5;
  o.reps = 2;
  o.batch = 1;  // one sequence: its gen_tokens decode steps exactly
  auto one = bench_batched_decode(*engine, o);
  ASSERT_TRUE(one.ok()) << one.status().message();
  ASSERT_EQ(one->size(), 2u);
  for (const auto& r : *one) {
    EXPECT_EQ(r.tokens, 5);
    EXPECT_GE(r.decode_ms, 0);
    EXPECT_GT(r.first_tokens_ms, 0);
  }
  // Three sequences queued together prefill in one step (60 <= 64 tokens), then decode together:
  // 3 x 5 tokens, unless the engine started before the last was queued (then fewer count).
  o.batch = 3;
  o.reps = 1;
  auto three = bench_batched_decode(*engine, o);
  ASSERT_TRUE(three.ok()) << three.status().message();
  ASSERT_EQ(three->size(), 1u);
  EXPECT_LE((*three)[0].tokens, 15);
  EXPECT_GE((*three)[0].tokens, 5);
  // The engine is usable again afterwards; an empty batch is refused.
  vlm::GenerateRequest r;
  r.prompt_ids = synthetic_prompt_ids(4, engine->vocab_size());
  r.max_new_tokens = 2;
  EXPECT_TRUE(engine->generate(r).ok());
  o.batch = 0;
  EXPECT_FALSE(bench_batched_decode(*engine, o).ok());
}

}  // namespace
}  // namespace vlm_cli
