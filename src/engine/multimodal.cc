#include "engine/multimodal.h"

#include <chrono>

#include "vision/image_decode.h"

namespace vlm {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status encode_image_input(const ImageInput& in, const PreprocessOptions& preprocess,
                          VisionEncoder& encoder, ThreadPool& pool, GridThw* grid,
                          VisionOutput* out, Engine::ImageTimings* cost) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  Result<Image> img = in.path.empty() ? decode_image(in.bytes.data(), in.bytes.size())
                                      : load_image_file(in.path);
  if (!img.ok()) return img.status();
  cost->decode_ms = ms_since(t0);

  t0 = Clock::now();
  PreprocessOptions opt = preprocess;
  if (in.min_pixels) opt.min_pixels = *in.min_pixels;
  if (in.max_pixels) opt.max_pixels = *in.max_pixels;
  Result<PreprocessedImage> pre = preprocess_image(*img, opt, &pool);
  if (!pre.ok()) return pre.status();
  cost->preprocess_ms = ms_since(t0);
  cost->resized_h = pre->resized_h;
  cost->resized_w = pre->resized_w;

  t0 = Clock::now();
  *grid = GridThw{pre->grid_t, pre->grid_h, pre->grid_w};
  VLM_RETURN_IF_ERROR(encoder.encode(pre->pixel_values.data(), *grid, out));
  cost->encode_ms = ms_since(t0);
  cost->vision_tokens = out->tokens;
  return ok_status();
}

VisionRows PreparedPrompt::rows_for_chunk(int64_t first) const {
  VisionRows r;
  r.feature_row = feature_row.data() + first;
  r.embeds = embeds.data();
  for (const auto& d : deepstack) r.deepstack.push_back(d.data());
  return r;
}

Status prepare_multimodal(std::span<const int32_t> ids, const std::vector<ImageInput>& images,
                          const Qwen3VLConfig& cfg, const PreprocessOptions& preprocess,
                          VisionEncoder& encoder, ThreadPool& pool, PreparedPrompt* out) {
  const int32_t pad = static_cast<int32_t>(cfg.image_token_id);
  const int64_t merge = cfg.vision_config.spatial_merge_size;

  // Image pad runs in the prompt: one per image.
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end)
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] != pad) {
      ++i;
      continue;
    }
    // transformers only treats pads right after <|vision_start|> as an image.
    if (i == 0 || ids[i - 1] != static_cast<int32_t>(cfg.vision_start_token_id)) {
      return invalid_argument("an <|image_pad|> at position " + std::to_string(i) +
                              " does not follow <|vision_start|>");
    }
    size_t j = i;
    while (j < ids.size() && ids[j] == pad) ++j;
    runs.emplace_back(i, j);
    i = j;
  }
  if (runs.size() != images.size()) {
    return invalid_argument("the prompt has " + std::to_string(runs.size()) +
                            " image placeholders (<|image_pad|>) but " + std::to_string(images.size()) +
                            " images were given");
  }

  std::vector<GridThw> grids;
  out->embeds.clear();
  out->deepstack.assign(cfg.vision_config.deepstack_visual_indexes.size(), {});
  for (size_t k = 0; k < images.size(); ++k) {
    const ImageInput& in = images[k];
    const std::string what = "image " + std::to_string(k + 1) + (in.path.empty() ? "" : " (" + in.path + ")");
    GridThw g;
    VisionOutput vo;
    Engine::ImageTimings cost;
    VLM_RETURN_IF_ERROR(encode_image_input(in, preprocess, encoder, pool, &g, &vo, &cost).with_context(what));
    out->decode_ms += cost.decode_ms;
    out->preprocess_ms += cost.preprocess_ms;
    out->encode_ms += cost.encode_ms;
    grids.push_back(g);
    out->embeds.insert(out->embeds.end(), vo.embeds.begin(), vo.embeds.end());
    for (size_t d = 0; d < vo.deepstack.size(); ++d) {
      out->deepstack[d].insert(out->deepstack[d].end(), vo.deepstack[d].begin(), vo.deepstack[d].end());
    }
    const size_t have = runs[k].second - runs[k].first;
    if (have != 1 && have != static_cast<size_t>(vo.tokens)) {
      return invalid_argument(what + " needs " + std::to_string(vo.tokens) +
                              " image tokens; the prompt has a run of " + std::to_string(have) +
                              " pads (give one pad per image and vlm expands it)");
    }
  }

  // Expand each run to its image's token count.
  out->ids.clear();
  out->feature_row.clear();
  size_t prev = 0;
  int32_t feature = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    for (size_t i = prev; i < runs[k].first; ++i) {
      out->ids.push_back(ids[i]);
      out->feature_row.push_back(-1);
    }
    const int64_t n = grids[k].patches() / (merge * merge);
    for (int64_t i = 0; i < n; ++i) {
      out->ids.push_back(pad);
      out->feature_row.push_back(feature++);
    }
    prev = runs[k].second;
  }
  for (size_t i = prev; i < ids.size(); ++i) {
    out->ids.push_back(ids[i]);
    out->feature_row.push_back(-1);
  }
  out->vision_tokens = feature;
  VLM_ASSIGN_OR_RETURN(out->rope, compute_rope_index(out->ids, grids, pad,
                                                     cfg.vision_start_token_id, merge));
  return ok_status();
}

}  // namespace vlm
