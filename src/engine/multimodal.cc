#include "engine/multimodal.h"

#include "core/clock.h"
#include "vision/image_decode.h"

namespace vlm {
VisionRows PreparedPrompt::rows_for_chunk(int64_t first) const {
  VisionRows r;
  r.feature_row = feature_row.data() + first;
  r.embeds = embeds.data();
  for (const auto& d : deepstack) r.deepstack.push_back(d.data());
  return r;
}

Result<std::vector<std::pair<size_t, size_t>>> find_image_runs(std::span<const int32_t> ids,
                                                               const Qwen3VLConfig& cfg,
                                                               size_t num_images) {
  const int32_t pad = static_cast<int32_t>(cfg.image_token_id);
  std::vector<std::pair<size_t, size_t>> runs;
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
  if (runs.size() != num_images) {
    return invalid_argument("the prompt has " + std::to_string(runs.size()) +
                            " image placeholders (<|image_pad|>) but " +
                            std::to_string(num_images) + " images were given");
  }
  return runs;
}

Status stage_image(const ImageInput& in, const PreprocessOptions& preprocess, VisionCache* cache,
                   ThreadPool* pool, StagedImage* out, int64_t max_tokens, PixelBudget* budget) {
  PreprocessOptions opt = preprocess;
  if (in.min_pixels) opt.min_pixels = *in.min_pixels;
  if (in.max_pixels) opt.max_pixels = *in.max_pixels;
  auto over_budget = [&](int64_t tokens, const std::string& what) -> Status {
    if (max_tokens < 0 || tokens <= max_tokens) return ok_status();
    return out_of_range(what + " takes " + std::to_string(tokens) +
                        " tokens at the pixel budget [" + std::to_string(opt.min_pixels) + ", " +
                        std::to_string(opt.max_pixels) + "], more than the " +
                        std::to_string(max_tokens) + " the context leaves for it");
  };

  auto t0 = Clock::now();
  std::vector<uint8_t> file;
  if (!in.path.empty()) {
    VLM_ASSIGN_OR_RETURN(file, read_image_file(in.path));
  }
  std::span<const uint8_t> bytes = in.path.empty() ? std::span<const uint8_t>(in.bytes) : file;
  out->key = VisionCacheKey::of(bytes, opt.min_pixels, opt.max_pixels);
  if (cache != nullptr && (out->encoded = cache->get(out->key)) != nullptr) {
    out->tokens = out->encoded->out.tokens;
    out->resized_h = out->encoded->grid.h * opt.patch_size;
    out->resized_w = out->encoded->grid.w * opt.patch_size;
    return over_budget(out->tokens, "the image");
  }
  // Priced from the header, before a pixel is decoded: what smart_resize will make of it.
  // Held (declared before the image) until the decoded pixels are gone.
  PixelBudget::Lease lease;
  ImageDecodeLimits limits;
  limits.on_size = [&](int64_t width, int64_t height) -> Status {
    if (max_tokens >= 0) {
      const int64_t factor = opt.patch_size * opt.merge_size;
      VLM_ASSIGN_OR_RETURN(auto hw,
                           smart_resize(height, width, factor, opt.min_pixels, opt.max_pixels));
      VLM_RETURN_IF_ERROR(
          over_budget(hw.first / factor * (hw.second / factor),
                      "the " + std::to_string(width) + "x" + std::to_string(height) + " image"));
    }
    if (budget != nullptr) lease = budget->acquire(width * height);
    return ok_status();
  };
  VLM_ASSIGN_OR_RETURN(Image img, decode_image(bytes.data(), bytes.size(), limits));
  out->decode_ms = ms_since(t0);

  t0 = Clock::now();
  VLM_ASSIGN_OR_RETURN(out->pixels, preprocess_image(img, opt, pool));
  out->preprocess_ms = ms_since(t0);
  out->tokens = out->pixels.num_tokens();
  out->resized_h = out->pixels.resized_h;
  out->resized_w = out->pixels.resized_w;
  return ok_status();
}

Result<std::unique_ptr<VisionEncoder::Job>> begin_encode(VisionEncoder& encoder,
                                                         std::span<StagedImage* const> images) {
  if (images.empty()) return invalid_argument("begin_encode: no images");
  std::vector<RgbImage> rgb;
  for (StagedImage* img : images) {
    const PreprocessedImage& p = img->pixels;
    const GridThw grid{p.grid_t, p.grid_h, p.grid_w};
    if (p.pixel_values.empty() && !p.resized_rgb.empty()) {  // patchified by the backend
      rgb.push_back({p.resized_rgb.data(), p.lut.data(), grid});
    } else if (images.size() == 1) {
      return encoder.begin(p.pixel_values.data(), grid);
    } else {
      return invalid_argument("begin_encode: only resized images go through the tower together");
    }
  }
  return encoder.begin_rgb(rgb.data(), static_cast<int64_t>(rgb.size()));
}

void take_encoded(VisionEncoder::Job& job, std::span<StagedImage* const> images) {
  std::vector<VisionOutput>& outs = job.outputs();
  for (size_t i = 0; i < images.size() && i < outs.size(); ++i) {
    StagedImage& img = *images[i];
    auto enc = std::make_shared<EncodedImage>();
    enc->grid = GridThw{img.pixels.grid_t, img.pixels.grid_h, img.pixels.grid_w};
    enc->out = std::move(outs[i]);
    img.encoded = std::move(enc);
    img.encoded_here = true;
    img.pixels = PreprocessedImage{};  // the pixels are no longer needed
  }
}

Status encode_staged_image(VisionEncoder& encoder, StagedImage* img, double* encode_ms) {
  if (img->encoded) return ok_status();
  const auto t0 = Clock::now();
  StagedImage* one[] = {img};
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<VisionEncoder::Job> job, begin_encode(encoder, one));
  while (!job->done()) VLM_RETURN_IF_ERROR(encoder.advance(job.get(), 0));
  take_encoded(*job, one);
  *encode_ms += ms_since(t0);
  return ok_status();
}

int64_t expanded_length(size_t num_ids, std::span<const std::pair<size_t, size_t>> runs,
                        std::span<const StagedImage> images) {
  int64_t n = static_cast<int64_t>(num_ids);
  for (size_t k = 0; k < runs.size(); ++k) {
    n += images[k].tokens - static_cast<int64_t>(runs[k].second - runs[k].first);
  }
  return n;
}

Status assemble_multimodal(std::span<const int32_t> ids,
                           std::span<const std::pair<size_t, size_t>> runs,
                           std::span<const StagedImage> images, const Qwen3VLConfig& cfg,
                           PreparedPrompt* out) {
  const int32_t pad = static_cast<int32_t>(cfg.image_token_id);
  std::vector<GridThw> grids;
  out->embeds.clear();
  out->deepstack.assign(cfg.vision_config.deepstack_visual_indexes.size(), {});
  for (size_t k = 0; k < images.size(); ++k) {
    const EncodedImage& e = *images[k].encoded;
    const size_t have = runs[k].second - runs[k].first;
    if (have != 1 && have != static_cast<size_t>(e.out.tokens)) {
      return invalid_argument("image " + std::to_string(k + 1) + " needs " +
                              std::to_string(e.out.tokens) +
                              " image tokens; the prompt has a run of " + std::to_string(have) +
                              " pads (give one pad per image and vlm expands it)");
    }
    grids.push_back(e.grid);
    out->embeds.insert(out->embeds.end(), e.out.embeds.begin(), e.out.embeds.end());
    for (size_t d = 0; d < e.out.deepstack.size() && d < out->deepstack.size(); ++d) {
      out->deepstack[d].insert(out->deepstack[d].end(), e.out.deepstack[d].begin(),
                               e.out.deepstack[d].end());
    }
  }

  out->ids.clear();
  out->feature_row.clear();
  out->image_spans.clear();
  size_t prev = 0;
  int32_t feature = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    for (size_t i = prev; i < runs[k].first; ++i) {
      out->ids.push_back(ids[i]);
      out->feature_row.push_back(-1);
    }
    ImageSpan span;
    span.begin = static_cast<int64_t>(out->ids.size());
    for (int64_t i = 0; i < images[k].encoded->out.tokens; ++i) {
      out->ids.push_back(pad);
      out->feature_row.push_back(feature++);
    }
    span.end = static_cast<int64_t>(out->ids.size());
    span.key = images[k].key;
    out->image_spans.push_back(span);
    prev = runs[k].second;
  }
  for (size_t i = prev; i < ids.size(); ++i) {
    out->ids.push_back(ids[i]);
    out->feature_row.push_back(-1);
  }
  out->vision_tokens = feature;
  VLM_ASSIGN_OR_RETURN(out->rope,
                       compute_rope_index(out->ids, grids, pad, cfg.vision_start_token_id,
                                          cfg.vision_config.spatial_merge_size));
  return ok_status();
}

}  // namespace vlm
