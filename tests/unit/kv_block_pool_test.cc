// Paged KV bookkeeping: allocation is all-or-nothing, frees return blocks, tables grow per seq.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "kv/block_pool.h"

namespace vlm {
namespace {

TEST(BlockPool, AllocatesAllOrNothingAndRecycles) {
  BlockPool pool(4);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(3, &a).ok());
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free(), 1);
  std::vector<int32_t> b;
  Status s = pool.allocate(2, &b);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("2 blocks needed, 1 free of 4"), std::string::npos) << s.message();
  EXPECT_TRUE(b.empty());  // nothing taken on failure
  pool.release({a[1]});
  EXPECT_EQ(pool.num_free(), 2);
  ASSERT_TRUE(pool.allocate(2, &b).ok());
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, SharedBlocksFreeOnLastRelease) {
  BlockPool pool(2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(1, &a).ok());
  pool.retain(a[0]);
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(KvCacheManager, TablesGrowByBlockAndFreeAll) {
  KvCacheManager kv(/*num_blocks=*/8, /*block_size=*/16);
  EXPECT_EQ(kv.blocks_for(0), 0);
  EXPECT_EQ(kv.blocks_for(1), 1);
  EXPECT_EQ(kv.blocks_for(16), 1);
  EXPECT_EQ(kv.blocks_for(17), 2);
  ASSERT_TRUE(kv.reserve(7, 20).ok());  // 2 blocks
  ASSERT_TRUE(kv.reserve(9, 16).ok());  // 1 block
  ASSERT_TRUE(kv.reserve(7, 32).ok());  // still 2 blocks: nothing new
  EXPECT_EQ(kv.block_table(7).size(), 2u);
  ASSERT_TRUE(kv.reserve(7, 33).ok());  // a third block
  EXPECT_EQ(kv.block_table(7).size(), 3u);
  EXPECT_EQ(kv.pool().num_used(), 4);
  EXPECT_TRUE(kv.can_reserve(9, 16 * 5));
  EXPECT_FALSE(kv.can_reserve(9, 16 * 6));
  Status s = kv.reserve(9, 16 * 6);  // needs 5 more, 4 free: refused, table unchanged
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(kv.block_table(9).size(), 1u);
  kv.free(7);
  EXPECT_TRUE(kv.block_table(7).empty());
  EXPECT_EQ(kv.pool().num_used(), 1);
  kv.free(12345);  // unknown: no-op
  kv.free(9);
  EXPECT_EQ(kv.pool().num_free(), 8);
}

TEST(KvCacheManager, TableSizedForMaxTokensNeverMoves) {
  // With max_tokens given at the first reserve, growing the table to it keeps its memory (decode
  // steps that cross a block boundary allocate nothing); a refused reserve of a new id leaves no
  // table behind.
  KvCacheManager kv(/*num_blocks=*/16, /*block_size=*/4);
  ASSERT_TRUE(kv.reserve(3, 5, /*max_tokens=*/40).ok());
  const int32_t* data = kv.block_table(3).data();
  EXPECT_GE(kv.block_table(3).capacity(), 10u);
  for (int64_t t = 6; t <= 40; ++t) {
    ASSERT_TRUE(kv.reserve(3, t, 40).ok());
    EXPECT_EQ(kv.block_table(3).data(), data) << t;
  }
  EXPECT_EQ(kv.block_table(3).size(), 10u);
  EXPECT_EQ(kv.reserve(4, 4 * 7, 4 * 7).code(), StatusCode::kUnavailable);  // 6 free
  EXPECT_TRUE(kv.block_table(4).empty());
  EXPECT_EQ(kv.pool().num_used(), 10);
}

TEST(KvCacheManager, RandomTrafficNeverLeaksOrSharesBlocks) {
  KvCacheManager kv(64, 16);
  std::mt19937 rng(3);
  std::vector<int64_t> live;
  std::vector<int64_t> want_tokens(100, 0);
  for (int step = 0; step < 2000; ++step) {
    const int64_t seq = static_cast<int64_t>(rng() % 100);
    if (rng() % 3 == 0) {
      kv.free(seq);
      want_tokens[seq] = 0;
    } else {
      const int64_t t = want_tokens[seq] + static_cast<int64_t>(rng() % 40);
      if (kv.reserve(seq, t).ok()) want_tokens[seq] = std::max(want_tokens[seq], t);
    }
    // Every block is in at most one table, and used blocks = the sum of table sizes.
    std::set<int32_t> seen;
    int64_t total = 0;
    for (int64_t s = 0; s < 100; ++s) {
      const auto& table = kv.block_table(s);
      ASSERT_GE(static_cast<int64_t>(table.size()) * 16, want_tokens[s]);
      for (int32_t b : table) ASSERT_TRUE(seen.insert(b).second) << "block " << b << " shared";
      total += static_cast<int64_t>(table.size());
    }
    ASSERT_EQ(total, kv.pool().num_used());
  }
}

}  // namespace
}  // namespace vlm
