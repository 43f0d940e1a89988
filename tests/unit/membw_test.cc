// The memory-bandwidth probe: finite, positive figures for a small buffer, and a read kernel that
// really reads every byte (its checksum). No timing assertions: the machine is shared.
#include <gtest/gtest.h>

#include <cmath>

#include "core/membw.h"
#include "core/thread_pool.h"

namespace vlm {
namespace {

TEST(Membw, SmallBufferGivesPositiveFiniteFigures) {
  ThreadPool pool(2);
  const int reps = 3;
  auto r = measure_membw(int64_t{3} << 20, reps, pool);
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
  ThreadPool pool(1);
  auto r = measure_membw(5000, 1, pool);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->bytes, 8192);
  EXPECT_FALSE(measure_membw(0, 1, pool).ok());
  EXPECT_FALSE(measure_membw(4096, 0, pool).ok());
}

TEST(Membw, L3SizeIsZeroOrPlausible) {
  const int64_t l3 = l3_cache_bytes();
  EXPECT_GE(l3, 0);
  if (l3 > 0) EXPECT_GE(l3, int64_t{64} << 10);
}

}  // namespace
}  // namespace vlm
