// Steady-state decoding allocates nothing: every heap allocation in this binary is counted while a
// flag is up, around decode steps of the text decoder (after one warm-up step).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "model/text_decoder.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace vlm {
namespace {

TEST(Allocation, CounterSeesAllocations) {
  g_allocations = 0;
  g_counting = true;
  auto* v = new std::vector<int>(100);
  g_counting = false;
  delete v;
  EXPECT_EQ(g_allocations.load(), 2);  // the vector object and its buffer
}

TEST(Allocation, DecodeStepsAndRepeatedPrefillAllocateNothing) {
  // text-f32-untied also with INT8 weights (--quant int8: owned I8 copies, per-row scales) and
  // INT4 weights (--quant int4: decode runs the INT4 kernel, the 12-token prefill widens blocks
  // of rows to BF16 in per-thread buffers that grow once).
  for (auto [name, quant] : {std::pair{"text-bf16-hd128", WeightQuant::kNone},
                             std::pair{"text-f32-untied", WeightQuant::kNone},
                             std::pair{"text-f32-untied", WeightQuant::kInt8},
                             std::pair{"text-f32-untied", WeightQuant::kInt4}}) {
    const std::string dir = std::string(VLM_FIXTURES_DIR) + "/" + name;
    auto cfg = load_qwen3vl_config(dir);
    ASSERT_TRUE(cfg.ok());
    auto store = WeightStore::open_dir(dir);
    ASSERT_TRUE(store.ok());
    auto w = load_text_weights(*store, *cfg);
    ASSERT_TRUE(w.ok());
    ThreadPool pool(2);
    ASSERT_TRUE(quantize_text_weights(&*w, quant, pool).ok());
    TextDecoder dec(*cfg, *w, pool, 16);
    KvCache cache;
    cache.allocate(cfg->text_config, 1, 64);
    std::vector<float> logits(cfg->text_config.vocab_size);
    std::vector<int32_t> ids = {5, 9, 70, 300, 4, 8, 12, 16, 20, 24, 28, 32};
    std::vector<int64_t> pos(16);
    auto run = [&](const int32_t* p, int64_t n, int64_t first) {
      for (int64_t i = 0; i < n; ++i) pos[i] = first + i;
      Positions3 p3{pos.data(), pos.data(), pos.data()};
      return dec.forward(p, n, p3, first, cache, LogitRows::kLast, logits.data());
    };
    // Warm-up: one prefill (per-thread scratch for many-row matmuls grows once) and one step.
    ASSERT_TRUE(run(ids.data(), 12, 0).ok());
    ASSERT_TRUE(run(ids.data(), 1, 12).ok());

    g_allocations = 0;
    g_counting = true;
    Status s;
    for (int64_t step = 0; step < 10 && s.ok(); ++step) s = run(ids.data() + step, 1, 13 + step);
    if (s.ok()) s = run(ids.data(), 12, 0);  // a second prefill reuses everything too
    g_counting = false;
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(g_allocations.load(), 0)
        << name << (quant == WeightQuant::kInt8 ? " int8" : "")
        << (quant == WeightQuant::kInt4 ? " int4" : "");
  }
}

}  // namespace
}  // namespace vlm
