// Paged KV bookkeeping: allocation is all-or-nothing, frees return blocks, tables grow per seq;
// prefix caching: chained block hashes, cached blocks found by hash, evicted least recently used
// and only when no other free block is left; the cache's groups and how many blocks they get.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "kv/block_pool.h"
#include "kv/kv_cache_spec.h"

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
  pool.release(std::vector<int32_t>{a[1]});
  EXPECT_EQ(pool.num_free(), 2);
  ASSERT_TRUE(pool.allocate(2, &b).ok());
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, SharedBlocksFreeOnLastRelease) {
  BlockPool pool(2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(1, &a).ok());
  pool.touch(a[0]);
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
  ASSERT_TRUE(kv.reserve(9, 16 * 5).ok());  // 4 more: the last 4 free blocks
  kv.free(9);
  ASSERT_TRUE(kv.reserve(9, 16).ok());
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

BlockHash digest(uint8_t v) {
  BlockHash h{};
  h.fill(v);
  return h;
}

TEST(BlockHasher, ChainsParentTokensAndExtraKeys) {
  const BlockHasher a(digest(1)), b(digest(2));
  const std::vector<int32_t> t = {1, 2, 3, 4}, u = {1, 2, 3, 5};
  const BlockHash h0 = a.hash(nullptr, t, {});
  EXPECT_EQ(h0, a.hash(nullptr, t, {}));  // a function of its inputs
  EXPECT_NE(h0, b.hash(nullptr, t, {}));  // the seed is the first block's parent
  EXPECT_NE(h0, a.hash(nullptr, u, {}));
  EXPECT_NE(a.hash(&h0, t, {}), h0);  // the parent is part of the key
  EXPECT_NE(a.hash(&h0, t, {}), a.hash(nullptr, u, {}));
  BlockExtraKey img;
  img.content = digest(7);
  img.params = {1024, 4096};
  BlockExtraKey other_image = img, other_budget = img;
  other_image.content[31] ^= 1;
  other_budget.params[1] = 8192;
  const BlockHash with = a.hash(nullptr, t, std::vector<BlockExtraKey>{img});
  EXPECT_NE(with, h0);
  EXPECT_NE(with, a.hash(nullptr, t, std::vector<BlockExtraKey>{other_image}));
  EXPECT_NE(with, a.hash(nullptr, t, std::vector<BlockExtraKey>{other_budget}));
  EXPECT_NE(with, a.hash(nullptr, t, std::vector<BlockExtraKey>{img, img}));
  // Two default-constructed hashers draw different seeds.
  EXPECT_NE(BlockHasher().hash(nullptr, t, {}), BlockHasher().hash(nullptr, t, {}));
}

TEST(BlockPool, CachedBlocksAreFreeAndEvictedLeastRecentlyUsedLast) {
  BlockPool pool(6);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(3, &a).ok());  // 0, 1, 2
  for (int i = 0; i < 3; ++i) pool.cache(a[i], digest(static_cast<uint8_t>(10 + i)));
  EXPECT_EQ(pool.num_cached(), 3);
  EXPECT_EQ(pool.lookup(digest(11)), 1);
  EXPECT_EQ(pool.lookup(digest(99)), -1);
  pool.release(a);                // freed last block first: 2 is evicted before 1 before 0
  EXPECT_EQ(pool.num_free(), 6);  // cached blocks with no reference count as free
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.num_cached(), 3);

  // A hit takes a free cached block out of the free list; releasing it makes it the most recent.
  pool.touch(0);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.ref_count(0), 1);
  pool.release(std::vector<int32_t>{0});

  // New blocks come from the never-used ones first: nothing is evicted.
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.allocate(3, &b).ok());
  EXPECT_EQ(b, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(pool.evictions(), 0);
  // A hashless block freed is reused before any cached block.
  pool.release(std::vector<int32_t>{b[1]});
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.allocate(1, &c).ok());
  EXPECT_EQ(c[0], 4);
  EXPECT_EQ(pool.evictions(), 0);
  // Then the least recently used: 2 (the tail of the released sequence), then 1, then 0.
  c.clear();
  ASSERT_TRUE(pool.allocate(2, &c).ok());
  EXPECT_EQ(c, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(pool.evictions(), 2);
  EXPECT_EQ(pool.lookup(digest(12)), -1);
  EXPECT_EQ(pool.lookup(digest(11)), -1);
  EXPECT_EQ(pool.lookup(digest(10)), 0);
  EXPECT_EQ(pool.num_cached(), 1);
  // A second block with the same contents is not keyed: the first stays the one found.
  pool.cache(c[0], digest(10));
  EXPECT_EQ(pool.lookup(digest(10)), 0);
  EXPECT_FALSE(pool.has_hash(c[0]));
  pool.reset_cache();
  EXPECT_EQ(pool.lookup(digest(10)), -1);
  EXPECT_EQ(pool.num_cached(), 0);
}

TEST(KvCacheManager, PrefixHitsShareBlocksAndCountTheirReferences) {
  KvCacheManager kv(8, 4);
  std::vector<BlockHash> h = {digest(1), digest(2), digest(3)};
  ASSERT_TRUE(kv.reserve(1, 10).ok());  // 3 blocks, 2 full after 10 tokens
  kv.cache_full_blocks(1, h, 10);
  std::vector<int32_t> hit;
  EXPECT_EQ(kv.cached_prefix(h, 100, &hit), 2);
  EXPECT_EQ(hit, (std::vector<int32_t>{kv.block_table(1)[0], kv.block_table(1)[1]}));
  EXPECT_EQ(kv.cached_prefix(h, 7, &hit), 1);  // at most 7 tokens: one whole block
  EXPECT_EQ(kv.cached_prefix(std::vector<BlockHash>{digest(9), digest(2)}, 100, &hit), 0);
  ASSERT_EQ(kv.cached_prefix(h, 100, &hit), 2);
  ASSERT_TRUE(kv.reserve_prefix(2, hit, 12).ok());
  EXPECT_EQ(kv.block_table(2).size(), 3u);
  EXPECT_EQ(kv.pool().ref_count(hit[0]), 2);
  EXPECT_EQ(kv.pool().num_used(), 4);  // 3 + 1 new
  kv.free(1);
  EXPECT_EQ(kv.pool().ref_count(hit[0]), 1);
  kv.free(2);
  EXPECT_EQ(kv.pool().num_used(), 0);
  EXPECT_EQ(kv.pool().num_cached(), 2);
  // Hits on free cached blocks take them from the free count: 8 blocks, 2 of them the hit, so a
  // sequence of 8 blocks fits with them and one of 9 does not.
  ASSERT_EQ(kv.cached_prefix(h, 100, &hit), 2);
  EXPECT_TRUE(kv.can_reserve_prefix(hit, 32));
  EXPECT_FALSE(kv.can_reserve_prefix(hit, 33));
  EXPECT_EQ(kv.reserve_prefix(3, hit, 33).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(kv.block_table(3).empty());
  EXPECT_EQ(kv.pool().num_used(), 0);
}

// A long random workload over a small pool: sequences built from a few shared prefixes, their
// full blocks keyed as they fill, hits reused, everything freed. Every step: reference counts equal
// the tables holding each block, a cached block holds what its key says, the hash table never
// outgrows the pool; at the end every count is back to zero.
TEST(KvCacheManager, RandomPrefixTrafficKeepsCountsAndContentsRight) {
  constexpr int32_t kBlocks = 48, kBs = 4;
  KvCacheManager kv(kBlocks, kBs);
  const BlockHasher hasher;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> bases(4);
  for (auto& b : bases) {
    for (int i = 0; i < 40; ++i) b.push_back(static_cast<int32_t>(rng() % 50));
  }
  struct Live {
    std::vector<int32_t> tokens;
    std::vector<BlockHash> hashes;
  };
  std::map<int64_t, Live> live;
  std::vector<BlockHash> content(kBlocks);  // what each block was filled with (its key)
  std::vector<uint8_t> filled(kBlocks, 0);
  int64_t hits = 0, next = 0;
  for (int step = 0; step < 5000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      kv.free(it->first);
      live.erase(it);
    } else {
      Live l;
      l.tokens = bases[rng() % bases.size()];
      l.tokens.resize(rng() % 40 + 1);
      for (int i = rng() % 12; i > 0; --i) l.tokens.push_back(static_cast<int32_t>(rng() % 50));
      for (size_t k = 0; (k + 1) * kBs <= l.tokens.size(); ++k) {
        l.hashes.push_back(hasher.hash(k == 0 ? nullptr : &l.hashes[k - 1],
                                       std::span(l.tokens).subspan(k * kBs, kBs), {}));
      }
      std::vector<int32_t> hit;
      const int64_t n = static_cast<int64_t>(l.tokens.size());
      const int32_t got = kv.cached_prefix(l.hashes, n - 1, &hit);
      for (int32_t k = 0; k < got; ++k) {
        ASSERT_TRUE(filled[hit[k]]);
        ASSERT_EQ(content[hit[k]], l.hashes[k]) << "a hit on a block holding other contents";
      }
      if (!kv.reserve_prefix(next, hit, n).ok()) continue;
      hits += got;
      const auto& table = kv.block_table(next);
      for (size_t k = got; k < l.hashes.size(); ++k) {  // "computing" the rest
        content[table[k]] = l.hashes[k];
        filled[table[k]] = 1;
      }
      kv.cache_full_blocks(next, l.hashes, n);
      live.emplace(next++, std::move(l));
    }
    std::vector<int32_t> refs(kBlocks, 0);
    for (const auto& [id, l] : live) {
      for (int32_t b : kv.block_table(id)) ++refs[b];
    }
    int32_t used = 0;
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(kv.pool().ref_count(b), refs[b]) << "block " << b;
      used += refs[b] > 0;
    }
    ASSERT_EQ(kv.pool().num_used(), used);
    ASSERT_LE(kv.pool().num_cached(), kBlocks);
  }
  EXPECT_GT(hits, 1000);
  EXPECT_GT(kv.pool().evictions(), 100);
  for (const auto& [id, l] : live) kv.free(id);
  EXPECT_EQ(kv.pool().num_used(), 0);
  EXPECT_EQ(kv.pool().num_free(), kBlocks);
}

// KV events: a consumer that applies the event stream to a set of hashes holds, after every
// operation, exactly the hashes the pool's blocks hold. A stored run names blocks new to the set,
// in the sequence's order, with the hash before it as parent; a removal names hashes in the set;
// a reset empties it. The workload keys sequences in two parts (as chunked prefill does), evicts,
// and resets now and then.
TEST(KvCacheManager, EventsMirrorTheCachedSet) {
  constexpr int32_t kBlocks = 32, kBs = 4;
  KvCacheManager kv(kBlocks, kBs);
  kv.enable_events();
  const BlockHasher hasher;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> bases(3);
  for (auto& b : bases) {
    for (int i = 0; i < 36; ++i) b.push_back(static_cast<int32_t>(rng() % 40));
  }
  std::map<int64_t, std::vector<BlockHash>> live;  // id -> its blocks' hashes
  std::set<BlockHash> mirror;
  std::vector<KvCacheEvent> events;
  int64_t next = 0, stored = 0, removed = 0, cleared = 0;
  auto apply = [&]() {
    kv.take_events(&events);
    for (const KvCacheEvent& e : events) {
      switch (e.kind) {
        case KvCacheEvent::Kind::kStored: {
          const std::vector<BlockHash>& h = live.at(e.seq);
          ASSERT_EQ(e.parent.has_value(), e.first_block > 0);
          if (e.parent) ASSERT_EQ(*e.parent, h[e.first_block - 1]);
          for (size_t i = 0; i < e.hashes.size(); ++i) {
            ASSERT_EQ(e.hashes[i], h[e.first_block + i]);
            ASSERT_TRUE(mirror.insert(e.hashes[i]).second) << "stored twice";
            ++stored;
          }
          break;
        }
        case KvCacheEvent::Kind::kRemoved:
          for (const BlockHash& x : e.hashes) {
            ASSERT_EQ(mirror.erase(x), 1u) << "removed a hash never stored";
            ++removed;
          }
          break;
        case KvCacheEvent::Kind::kCleared:
          mirror.clear();
          ++cleared;
          break;
      }
    }
    std::set<BlockHash> truth;
    for (int32_t b = 0; b < kBlocks; ++b) {
      if (kv.pool().has_hash(b)) truth.insert(kv.pool().hash_of(b));
    }
    ASSERT_EQ(mirror, truth);
  };
  for (int step = 0; step < 3000; ++step) {
    const uint32_t op = rng() % 10;
    if (op == 0 && step % 7 == 0) {
      kv.reset_cache();
    } else if (!live.empty() && op < 4) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      kv.free(it->first);
      live.erase(it);
    } else {
      std::vector<int32_t> tokens = bases[rng() % bases.size()];
      tokens.resize(rng() % 36 + 1);
      for (int i = rng() % 10; i > 0; --i) tokens.push_back(static_cast<int32_t>(rng() % 40));
      std::vector<BlockHash> hashes;
      for (size_t k = 0; (k + 1) * kBs <= tokens.size(); ++k) {
        hashes.push_back(hasher.hash(k == 0 ? nullptr : &hashes[k - 1],
                                     std::span(tokens).subspan(k * kBs, kBs), {}));
      }
      std::vector<int32_t> hit;
      const int64_t n = static_cast<int64_t>(tokens.size());
      kv.cached_prefix(hashes, n - 1, &hit);
      if (!kv.reserve_prefix(next, hit, n).ok()) continue;
      live.emplace(next, hashes);
      kv.cache_full_blocks(next, hashes, n / 2);  // a first chunk, then the rest
      kv.cache_full_blocks(next, hashes, n);
      ++next;
    }
    apply();
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(stored, 500);
  EXPECT_GT(removed, 100);
  EXPECT_GT(cleared, 5);
}

// A decoder of `layers` full-attention layers (2 KV heads of 64) in `t`, blocks of 16 tokens.
KvCacheSpec attention_spec(int64_t layers, DType t) {
  KvCacheSpec spec;
  spec.block_size = 16;
  KvCacheGroup& g = spec.groups.emplace_back();
  for (int64_t l = 0; l < layers; ++l) g.layers.push_back(l);
  g.attention = {2, 64, t};
  return spec;
}

TEST(KvCacheSpec, BlockBytesCountEveryLayerKAndVAndInt8Scales) {
  EXPECT_EQ(attention_spec(4, DType::kF32).block_bytes(), 4 * 2 * 16 * (2 * 64 * 4));
  EXPECT_EQ(attention_spec(4, DType::kBF16).block_bytes(), 4 * 2 * 16 * (2 * 64 * 2));
  EXPECT_EQ(attention_spec(4, DType::kI8).block_bytes(), 4 * 2 * 16 * (2 * 64 + 2 * 4));
}

TEST(KvCacheSpec, ValidateRefusesWhatThisEngineCannotPage) {
  EXPECT_TRUE(attention_spec(2, DType::kF32).validate().ok());
  EXPECT_FALSE(KvCacheSpec{}.validate().ok());  // no group
  KvCacheSpec two = attention_spec(2, DType::kF32);
  two.groups.push_back(two.groups[0]);
  EXPECT_NE(two.validate().message().find("two KV cache groups"), std::string::npos);
  two.groups[1].layers = {2, 3};
  EXPECT_NE(two.validate().message().find("exactly one full-attention group"), std::string::npos);
  KvCacheSpec empty = attention_spec(0, DType::kF32);
  EXPECT_FALSE(empty.validate().ok());
  KvCacheSpec headless = attention_spec(2, DType::kF32);
  headless.groups[0].attention.n_kv_heads = 0;
  EXPECT_FALSE(headless.validate().ok());
}

TEST(KvCacheSpec, PlanGivesBlocksByOptionThenDeviceThenMemoryThenDefault) {
  const KvCacheSpec spec = attention_spec(2, DType::kF32);
  const int64_t per_block = spec.block_bytes();  // 32 KiB
  KvBlockPlan p;
  p.max_num_seqs = 4;
  p.blocks_per_seq = 10;
  p.num_blocks = 7;  // given: taken as it is
  EXPECT_EQ(*plan_kv_blocks(spec, p), 7);
  p.num_blocks = 0;
  EXPECT_EQ(*plan_kv_blocks(spec, p), 40);  // every sequence at full context
  p.memory_bytes = 11 * per_block;          // a budget: what fits, one block being scratch
  EXPECT_EQ(*plan_kv_blocks(spec, p), 10);
  p.memory_bytes = per_block;  // only the scratch block fits
  const Result<int32_t> none = plan_kv_blocks(spec, p);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("holds no KV block"), std::string::npos);
  p.memory_bytes = 0;
  p.device_budget_bytes = 1000 * per_block;  // a device: at most every sequence at full context
  EXPECT_EQ(*plan_kv_blocks(spec, p), 40);
  p.device_budget_bytes = 21 * per_block;
  EXPECT_EQ(*plan_kv_blocks(spec, p), 20);
  p.memory_bytes = 3 * per_block;  // a device budget goes before a memory budget ...
  EXPECT_EQ(*plan_kv_blocks(spec, p), 20);
  p.num_blocks = 5;  // ... and a given count before both
  EXPECT_EQ(*plan_kv_blocks(spec, p), 5);
  p.num_blocks = 0;
  p.memory_bytes = 0;
  p.device_budget_bytes = -5;  // the weights took more than the share allows
  p.device_memory_utilization = 0.5;
  const Result<int32_t> full = plan_kv_blocks(spec, p);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kUnavailable);
  // The default caps at 4 GiB, but never below one sequence at full context.
  KvBlockPlan big;
  big.max_num_seqs = 10000;
  big.blocks_per_seq = 200000;  // one sequence is more than 4 GiB
  EXPECT_EQ(*plan_kv_blocks(spec, big), 200000);
  big.blocks_per_seq = 100;  // every sequence would be 1e6 blocks
  EXPECT_EQ(*plan_kv_blocks(spec, big), (int64_t{4} << 30) / per_block);
}

}  // namespace
}  // namespace vlm
