// get_rope_index: 3-D positions of prompts with images.
#include <gtest/gtest.h>

#include "model/mrope_positions.h"

namespace vlm {
namespace {

constexpr int32_t kPad = 1000;

TEST(RopeIndex, WorkedExampleFromTheDesignNotes) {
  // 3 text tokens, an image with grid (1, 8, 12) → merged 4 × 6 = 24 pads, then 2 text tokens.
  std::vector<int32_t> ids = {5, 6, 7};
  ids.insert(ids.end(), 24, kPad);
  ids.insert(ids.end(), {8, 9});
  GridThw g{1, 8, 12};
  auto r = compute_rope_index(ids, std::span<const GridThw>(&g, 1), kPad, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto at = [&](int i) { return std::vector<int64_t>{r->t[i], r->h[i], r->w[i]}; };
  EXPECT_EQ(at(0), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(at(2), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(at(3), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(at(8), (std::vector<int64_t>{3, 3, 8}));
  EXPECT_EQ(at(9), (std::vector<int64_t>{3, 4, 3}));
  EXPECT_EQ(at(26), (std::vector<int64_t>{3, 6, 8}));
  EXPECT_EQ(at(27), (std::vector<int64_t>{9, 9, 9}));
  EXPECT_EQ(at(28), (std::vector<int64_t>{10, 10, 10}));
  EXPECT_EQ(r->delta, -18);
}

TEST(RopeIndex, TextOnlyIsOneDimensional) {
  std::vector<int32_t> ids = {1, 2, 3, 4};
  auto r = compute_rope_index(ids, {}, kPad, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->t, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r->h, r->t);
  EXPECT_EQ(r->w, r->t);
  EXPECT_EQ(r->delta, 0);
}

TEST(RopeIndex, TwoImagesBackToBackAndTallImage) {
  // Image A: grid (1, 2, 4) → 1 × 2 merged, image B: grid (1, 6, 2) → 3 × 1 merged.
  std::vector<int32_t> ids = {5};
  ids.insert(ids.end(), 2, kPad);
  ids.insert(ids.end(), 3, kPad);  // a single run: the grids say where A ends
  ids.push_back(6);
  GridThw gs[] = {{1, 2, 4}, {1, 6, 2}};
  // Runs are found by scanning for the next pad, so back-to-back images share one run of pads.
  auto r = compute_rope_index(ids, gs, kPad, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->t, (std::vector<int64_t>{0, 1, 1, 3, 3, 3, 6}));
  EXPECT_EQ(r->h, (std::vector<int64_t>{0, 1, 1, 3, 4, 5, 6}));
  EXPECT_EQ(r->w, (std::vector<int64_t>{0, 1, 2, 3, 3, 3, 6}));
  EXPECT_EQ(r->delta, 7 - 7);
}

TEST(RopeIndex, MismatchedPadsAreErrors) {
  std::vector<int32_t> ids = {5, kPad, kPad, 6};
  GridThw g{1, 4, 4};  // needs 4 pads
  EXPECT_FALSE(compute_rope_index(ids, std::span<const GridThw>(&g, 1), kPad, 2).ok());
  GridThw small{1, 2, 2};  // needs 1 pad: the second pad is left over
  EXPECT_FALSE(compute_rope_index(ids, std::span<const GridThw>(&small, 1), kPad, 2).ok());
  EXPECT_FALSE(compute_rope_index(std::vector<int32_t>{1, 2}, std::span<const GridThw>(&small, 1), kPad, 2).ok());
}

}  // namespace
}  // namespace vlm
