// get_rope_index: 3-D positions of prompts with images.
#include <gtest/gtest.h>

#include "model/mrope_positions.h"

namespace vlm {
namespace {

constexpr int32_t kPad = 1000;
constexpr int32_t kStart = 1002;

TEST(RopeIndex, WorkedExampleFromTheDesignNotes) {
  // 3 text tokens, an image with grid (1, 8, 12) → merged 4 × 6 = 24 pads, then 2 text tokens.
  std::vector<int32_t> ids = {5, 6, kStart};
  ids.insert(ids.end(), 24, kPad);
  ids.insert(ids.end(), {8, 9});
  GridThw g{1, 8, 12};
  auto r = compute_rope_index(ids, std::span<const GridThw>(&g, 1), kPad, kStart, 2);
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
  auto r = compute_rope_index(ids, {}, kPad, kStart, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->t, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r->h, r->t);
  EXPECT_EQ(r->w, r->t);
  EXPECT_EQ(r->delta, 0);
}

TEST(RopeIndex, TwoImagesBackToBackAndTallImage) {
  // Image A: grid (1, 2, 4) → 1 × 2 merged, image B: grid (1, 6, 2) → 3 × 1 merged.
  std::vector<int32_t> ids = {kStart};
  ids.insert(ids.end(), 2, kPad);
  ids.push_back(kStart);
  ids.insert(ids.end(), 3, kPad);
  ids.push_back(6);
  GridThw gs[] = {{1, 2, 4}, {1, 6, 2}};
  auto r = compute_rope_index(ids, gs, kPad, kStart, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  // start(0) A(1,1,1)(1,1,2) start(3) B(4,4,4)(4,5,4)(4,6,4) text(7)
  EXPECT_EQ(r->t, (std::vector<int64_t>{0, 1, 1, 3, 4, 4, 4, 7}));
  EXPECT_EQ(r->h, (std::vector<int64_t>{0, 1, 1, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r->w, (std::vector<int64_t>{0, 1, 2, 3, 4, 4, 4, 7}));
  EXPECT_EQ(r->delta, 8 - 8);
}

TEST(RopeIndex, MismatchedPadsAreErrors) {
  std::vector<int32_t> ids = {5, kStart, kPad, kPad, 6};
  GridThw g{1, 4, 4};  // needs 4 pads
  EXPECT_FALSE(compute_rope_index(ids, std::span<const GridThw>(&g, 1), kPad, kStart, 2).ok());
  // Fewer grids than images is an error.
  EXPECT_FALSE(compute_rope_index(ids, {}, kPad, kStart, 2).ok());
  // Grids beyond the images in the prompt are ignored, as transformers does; so are pads that
  // do not follow a vision start (they are text).
  GridThw small{1, 2, 2};
  auto extra = compute_rope_index(std::vector<int32_t>{1, kPad, 2},
                                  std::span<const GridThw>(&small, 1), kPad, kStart, 2);
  ASSERT_TRUE(extra.ok());
  EXPECT_EQ(extra->t, (std::vector<int64_t>{0, 1, 2}));
}

}  // namespace
}  // namespace vlm
