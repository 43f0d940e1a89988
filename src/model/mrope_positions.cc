#include "model/mrope_positions.h"

#include <algorithm>

namespace vlm {

Result<RopeIndex> compute_rope_index(std::span<const int32_t> ids, std::span<const GridThw> grids,
                                     int64_t image_token_id, int64_t vision_start_token_id,
                                     int64_t merge_size, int64_t video_token_id) {
  RopeIndex r;
  const int64_t n = static_cast<int64_t>(ids.size());
  // As transformers: the items of each kind are counted, and the next item is the nearer pad of
  // a kind with items left.
  size_t left_images = 0, left_videos = 0;
  for (int64_t i = 0; i + 1 < n; ++i) {
    if (ids[i] != vision_start_token_id) continue;
    if (ids[i + 1] == image_token_id) ++left_images;
    if (video_token_id >= 0 && ids[i + 1] == video_token_id) ++left_videos;
  }
  const size_t n_images = left_images + left_videos;
  if (n_images > grids.size()) {
    return invalid_argument("the prompt has " + std::to_string(n_images) + " images but " +
                            std::to_string(grids.size()) + " image grids were given");
  }
  grids = grids.first(n_images);
  r.t.reserve(n);
  r.h.reserve(n);
  r.w.reserve(n);
  int64_t next = 0;  // next free position (= max position so far + 1)
  auto push_text = [&](int64_t count) {
    for (int64_t i = 0; i < count; ++i, ++next) {
      r.t.push_back(next);
      r.h.push_back(next);
      r.w.push_back(next);
    }
  };
  int64_t st = 0;
  for (size_t img = 0; img < grids.size(); ++img) {
    int64_t ed = st;
    // A video pad counts only right after <|vision_start|> (elsewhere it is text, as the engine
    // reads the prompt); image pads as transformers finds them.
    while (ed < n && !(left_images > 0 && ids[ed] == image_token_id) &&
           !(left_videos > 0 && ids[ed] == video_token_id && ed > 0 &&
             ids[ed - 1] == vision_start_token_id)) {
      ++ed;
    }
    if (ed == n) {
      return invalid_argument("the prompt has " + std::to_string(img) +
                              " image placeholder runs for " + std::to_string(grids.size()) +
                              " images");
    }
    const int32_t pad = ids[ed];
    --(pad == image_token_id ? left_images : left_videos);
    const GridThw& g = grids[img];
    const int64_t gh = g.h / merge_size, gw = g.w / merge_size;
    const int64_t count = g.t * gh * gw;
    if (ed + count > n)
      return invalid_argument("image " + std::to_string(img) + ": too few image pads");
    for (int64_t i = 0; i < count; ++i) {
      if (ids[ed + i] != pad) {
        return invalid_argument("image " + std::to_string(img) + " needs " + std::to_string(count) +
                                " consecutive image pads");
      }
    }
    push_text(ed - st);
    const int64_t s = next;
    for (int64_t tt = 0; tt < g.t; ++tt) {
      for (int64_t y = 0; y < gh; ++y) {
        for (int64_t x = 0; x < gw; ++x) {
          r.t.push_back(s + tt);
          r.h.push_back(s + y);
          r.w.push_back(s + x);
        }
      }
    }
    next = s + std::max({g.t, gh, gw});
    st = ed + count;
  }
  push_text(n - st);
  r.delta = next - n;
  return r;
}

}  // namespace vlm
