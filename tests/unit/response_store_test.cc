// The Responses API's store (server/response_store): its bounds and its eviction order.
#include "server/response_store.h"

#include <gtest/gtest.h>

#include <string>

namespace vlm {
namespace {

ResponseStore::Entry entry(size_t bytes) { return {std::string(bytes, 'r'), ""}; }

TEST(ResponseStore, KeepsTheMostRecentlyUsedWithinItsCount) {
  ResponseStore s(2, 1 << 20);
  ASSERT_TRUE(s.put("a", entry(1)));
  ASSERT_TRUE(s.put("b", entry(1)));
  ASSERT_TRUE(s.get("a").has_value());  // a is now the most recently used
  ASSERT_TRUE(s.put("c", entry(1)));    // b goes
  EXPECT_TRUE(s.get("a").has_value());
  EXPECT_FALSE(s.get("b").has_value());
  EXPECT_TRUE(s.get("c").has_value());
  EXPECT_EQ(s.size(), 2u);
  EXPECT_TRUE(s.erase("a"));
  EXPECT_FALSE(s.erase("a"));
  EXPECT_EQ(s.size(), 1u);
}

TEST(ResponseStore, KeepsWithinItsBytes) {
  ResponseStore s(100, 10);
  ASSERT_TRUE(s.put("a", entry(4)));
  ASSERT_TRUE(s.put("b", entry(4)));
  ASSERT_TRUE(s.put("c", entry(4)));  // 12 bytes: a goes
  EXPECT_FALSE(s.get("a").has_value());
  EXPECT_EQ(s.bytes(), 8u);
  EXPECT_FALSE(s.put("big", entry(11)));  // alone over the bound: not kept, nothing evicted
  EXPECT_EQ(s.size(), 2u);
  ASSERT_TRUE(s.put("b", entry(1)));  // replaced: its bytes counted once
  EXPECT_EQ(s.bytes(), 5u);
  ResponseStore off(0, 10);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.put("a", entry(1)));
}

}  // namespace
}  // namespace vlm
