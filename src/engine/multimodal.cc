#include "engine/multimodal.h"

#include "core/clock.h"
#include "vision/image_decode.h"
#include "vision/resize.h"
#include "vision/video_decode.h"

namespace vlm {
VisionRows PreparedPrompt::rows_for_chunk(int64_t first) const {
  VisionRows r;
  r.feature_row = feature_row.data() + first;
  r.embeds = embeds.data();
  for (const auto& d : deepstack) r.deepstack.push_back(d.data());
  return r;
}

Result<std::vector<PadRun>> find_pad_runs(std::span<const int32_t> ids, const Qwen3VLConfig& cfg,
                                          size_t num_images, size_t num_videos) {
  const auto image = static_cast<int32_t>(cfg.image_token_id);
  const auto video = static_cast<int32_t>(cfg.video_token_id);
  std::vector<PadRun> runs;
  size_t images = 0, videos = 0;
  for (size_t i = 0; i < ids.size();) {
    if (ids[i] != image && ids[i] != video) {
      ++i;
      continue;
    }
    const int32_t pad = ids[i];
    // transformers only treats pads right after <|vision_start|> as an image or a video. A stray
    // image pad is refused (it would take an image's features in transformers' forward); a stray
    // video pad is text.
    if (i == 0 || ids[i - 1] != static_cast<int32_t>(cfg.vision_start_token_id)) {
      if (pad == video) {
        ++i;
        continue;
      }
      return invalid_argument("an <|image_pad|> at position " + std::to_string(i) +
                              " does not follow <|vision_start|>");
    }
    size_t j = i;
    while (j < ids.size() && ids[j] == pad) ++j;
    runs.push_back({i, j, runs.size(), pad == video});
    ++(pad == video ? videos : images);
    i = j;
  }
  if (images != num_images) {
    return invalid_argument("the prompt has " + std::to_string(images) +
                            " image placeholders (<|image_pad|>) but " +
                            std::to_string(num_images) + " images were given");
  }
  if (videos != num_videos) {
    return invalid_argument("the prompt has " + std::to_string(videos) +
                            " video placeholders (<|video_pad|>) but " +
                            std::to_string(num_videos) + " videos were given");
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

namespace {

// A video given as its frames (VideoInput::frames): each read and decoded in turn (at most
// `max_frames` of them, one size for all) and handed to `sink`, as decode_video does with a file's
// sampled frames; their indices are 0, 1, 2, ... at `fps`. The bytes were read for the cache key.
Result<VideoFrames> decode_frame_list(const std::vector<std::vector<uint8_t>>& files, double fps,
                                      const VideoLimits& limits, const FrameSink& sink) {
  VideoFrames v;
  v.format = "frames";
  v.source_fps = fps;
  const auto n = static_cast<int64_t>(files.size());
  v.total_frames = n;
  ImageDecodeLimits il;
  il.max_pixels = limits.max_frame_pixels;
  int64_t total_pixels = 0, width = 0, height = 0;
  for (int64_t k = 0; k < n; ++k) {
    const std::vector<uint8_t>& f = files[static_cast<size_t>(k)];
    Result<Image> img = decode_image(f.data(), f.size(), il);
    if (!img.ok()) return img.status().with_context("frame " + std::to_string(k + 1));
    if (k == 0) {
      width = img->width;
      height = img->height;
    } else if (img->width != width || img->height != height) {
      return invalid_argument("frame " + std::to_string(k + 1) + " is " +
                              std::to_string(img->width) + "x" + std::to_string(img->height) +
                              ", frame 1 " + std::to_string(width) + "x" + std::to_string(height) +
                              " (a video's frames have one size)");
    }
    Result<Image> kept = sink ? sink(std::move(img).value(), n) : std::move(img);
    if (!kept.ok()) return kept.status().with_context("frame " + std::to_string(k + 1));
    total_pixels += kept->width * kept->height;
    if (total_pixels > limits.max_total_pixels) {
      return invalid_argument("the frames exceed the limit of " +
                              std::to_string(limits.max_total_pixels) + " pixels together");
    }
    v.frames.push_back(std::move(kept).value());
    v.indices.push_back(k);
  }
  return v;
}

}  // namespace

Status stage_video(const VideoInput& in, const VideoStaging& staging, VisionCache* cache,
                   ThreadPool* pool, StagedImage* out, int64_t max_tokens, PixelBudget* budget) {
  out->video = true;
  if (!staging.unsupported.empty()) return invalid_argument(staging.unsupported);
  PreprocessOptions opt = staging.config.pixels;
  if (in.min_pixels) opt.min_pixels = *in.min_pixels;
  if (in.max_pixels) opt.max_pixels = *in.max_pixels;
  VideoSampling sampling{staging.config.fps, staging.config.min_frames, staging.config.max_frames};
  if (in.fps) sampling.fps = *in.fps;
  if (in.min_frames) sampling.min_frames = *in.min_frames;
  if (in.max_frames) {
    sampling.max_frames = *in.max_frames;
    // Fewer frames asked for than the model's least: the least follows (unless also given).
    if (!in.min_frames) sampling.min_frames = std::min(sampling.min_frames, *in.max_frames);
  }
  if (!(sampling.fps > 0 && sampling.fps <= 1000)) {
    return invalid_argument("fps must be in (0, 1000], got " + std::to_string(sampling.fps));
  }
  if (sampling.min_frames < 1 || sampling.max_frames < sampling.min_frames) {
    return invalid_argument("frames must satisfy 1 <= min_frames <= max_frames, got " +
                            std::to_string(sampling.min_frames) + ".." +
                            std::to_string(sampling.max_frames));
  }

  auto t0 = Clock::now();
  std::vector<uint8_t> file;
  ImageDecodeLimits read_limits;
  read_limits.max_bytes = staging.limits.max_bytes;
  if (!in.path.empty()) {
    VLM_ASSIGN_OR_RETURN(file, read_image_file(in.path, read_limits));
  }
  // A list of frames: their bytes, and the digest of their digests as the video's bytes.
  std::vector<std::vector<uint8_t>> frame_files;
  if (!in.frames.empty()) {
    if (!in.path.empty() || !in.bytes.empty()) {
      return invalid_argument("a video is a file or a list of frames, not both");
    }
    if (static_cast<int64_t>(in.frames.size()) > sampling.max_frames) {
      return invalid_argument(std::to_string(in.frames.size()) + " frames, more than max_frames " +
                              std::to_string(sampling.max_frames));
    }
    Sha256 all;
    int64_t total_bytes = 0;
    for (size_t k = 0; k < in.frames.size(); ++k) {
      const ImageInput& f = in.frames[k];
      std::vector<uint8_t> b = f.bytes;
      if (!f.path.empty()) {
        Result<std::vector<uint8_t>> read = read_image_file(f.path, read_limits);
        if (!read.ok()) return read.status().with_context("frame " + std::to_string(k + 1));
        b = std::move(read).value();
      }
      total_bytes += static_cast<int64_t>(b.size());
      if (total_bytes > staging.limits.max_bytes) {
        return invalid_argument("the frames exceed " + std::to_string(staging.limits.max_bytes) +
                                " bytes together");
      }
      const Sha256Digest d = Sha256::of(b);
      all.update(d.data(), d.size());
      frame_files.push_back(std::move(b));
    }
    const Sha256Digest d = all.finish();
    file.assign(d.begin(), d.end());
  }
  std::span<const uint8_t> bytes =
      in.path.empty() && in.frames.empty() ? std::span<const uint8_t>(in.bytes) : file;
  out->key = VisionCacheKey::of_video(bytes, sampling.fps, sampling.min_frames,
                                      in.frames.empty() ? sampling.max_frames : -1, opt.min_pixels,
                                      opt.max_pixels);
  auto over_budget = [&](int64_t tokens) -> Status {
    if (max_tokens < 0 || tokens <= max_tokens) return ok_status();
    return out_of_range("the video takes " + std::to_string(tokens) + " tokens (" +
                        std::to_string(out->frames) + " frames at the pixel budget [" +
                        std::to_string(opt.min_pixels) + ", " + std::to_string(opt.max_pixels) +
                        "]), more than the " + std::to_string(max_tokens) +
                        " the context leaves for it; lower fps or max_frames");
  };
  if (cache != nullptr && (out->encoded = cache->get(out->key)) != nullptr) {
    const EncodedImage& e = *out->encoded;
    out->tokens = e.out.tokens;
    out->groups = e.grid.t;
    out->timestamps = e.timestamps;
    out->frames = e.frames;
    out->resized_h = e.grid.h * opt.patch_size;
    out->resized_w = e.grid.w * opt.patch_size;
    return over_budget(out->tokens);
  }
  // Each sampled frame is resized as soon as it is decoded, so that only one frame is ever held
  // at the source's size; the first one prices the video (the sampled count and the size are
  // known then) before the others are decoded.
  PixelBudget::Lease lease;
  std::pair<int64_t, int64_t> target{0, 0};
  int64_t sampled_count = 0;
  double resize_ms = 0;
  FrameSink sink = [&](Image frame, int64_t sampled) -> Result<Image> {
    if (target.first == 0) {
      const int64_t factor = opt.patch_size * opt.merge_size;
      VLM_ASSIGN_OR_RETURN(
          target, smart_resize_video(sampled, frame.height, frame.width, opt.temporal_patch_size,
                                     factor, opt.min_pixels, opt.max_pixels));
      out->frames = sampled_count = sampled;
      const int64_t groups = (sampled + opt.temporal_patch_size - 1) / opt.temporal_patch_size;
      VLM_RETURN_IF_ERROR(over_budget(groups * (target.first / factor) * (target.second / factor)));
      if (budget != nullptr) {
        lease =
            budget->acquire(frame.width * frame.height + sampled * target.first * target.second);
      }
    }
    if (frame.height == target.first && frame.width == target.second) return frame;
    const auto r0 = Clock::now();
    try {
      Image resized = resize_bicubic_antialias(frame, target.first, target.second, pool);
      resize_ms += ms_since(r0);
      return resized;
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kUnavailable, "preprocess: out of memory resizing a video frame");
    }
  };
  VLM_ASSIGN_OR_RETURN(
      VideoFrames v, in.frames.empty()
                         ? decode_video(bytes.data(), bytes.size(), sampling, staging.limits, sink)
                         : decode_frame_list(frame_files, sampling.fps, staging.limits, sink));
  out->decode_ms = ms_since(t0) - resize_ms;
  out->frames = static_cast<int64_t>(v.frames.size());
  out->decoded_frames = v.decoded_frames;

  t0 = Clock::now();
  // A stream that ended early has fewer frames than were sampled: they are priced again by their
  // count (from the target size they already have).
  std::optional<std::pair<int64_t, int64_t>> size;
  if (sampled_count == out->frames) size = target;
  Result<PreprocessedImage> p = preprocess_video(v.frames, opt, pool, size);
  if (!p.ok()) return p.status().with_context(v.format);
  out->pixels = std::move(p).value();
  out->preprocess_ms = ms_since(t0) + resize_ms;
  out->tokens = out->pixels.num_tokens();
  out->groups = out->pixels.grid_t;
  // A source without a rate is taken at 24 frames a second, as transformers does.
  out->timestamps =
      video_timestamps(v.indices, v.source_fps > 0 ? v.source_fps : 24, opt.merge_size);
  if (static_cast<int64_t>(out->timestamps.size()) != out->groups) {
    return invalid_argument(v.format + ": " + std::to_string(out->timestamps.size()) +
                            " timestamps for " + std::to_string(out->groups) + " frame groups");
  }
  out->resized_h = out->pixels.resized_h;
  out->resized_w = out->pixels.resized_w;
  return ok_status();
}

Status expand_video_runs(const Tokenizer& tok, std::span<const StagedImage> items,
                         const Qwen3VLConfig& cfg, std::vector<int32_t>* ids,
                         std::vector<PadRun>* runs) {
  const auto start = static_cast<int32_t>(cfg.vision_start_token_id);
  const auto end = static_cast<int32_t>(cfg.vision_end_token_id);
  const auto pad = static_cast<int32_t>(cfg.video_token_id);
  std::vector<int32_t> out;
  std::vector<PadRun> out_runs;
  size_t prev = 0;
  int64_t videos = 0;
  for (const PadRun& r : *runs) {
    if (!r.video) {
      out.insert(out.end(), ids->begin() + static_cast<std::ptrdiff_t>(prev),
                 ids->begin() + static_cast<std::ptrdiff_t>(r.end));
      const size_t shift = out.size() - r.end;
      out_runs.push_back({r.begin + shift, r.end + shift, r.item, false});
      prev = r.end;
      continue;
    }
    ++videos;
    if (r.end - r.begin != 1 || r.end >= ids->size() || (*ids)[r.end] != end) {
      return invalid_argument("video " + std::to_string(videos) +
                              ": give it as <|vision_start|><|video_pad|><|vision_end|> with one "
                              "pad (vlm expands it)");
    }
    // Drop the <|vision_start|> before the pad: each group brings its own after its timestamp.
    // The text since the last special token is tokenized again with the first timestamp, where
    // its ids are the tokenizer's own (they came from text): transformers tokenizes it so.
    size_t text = r.begin - 1;
    while (text > prev && !tok.is_special((*ids)[text - 1])) --text;
    out.insert(out.end(), ids->begin() + static_cast<std::ptrdiff_t>(prev),
               ids->begin() + static_cast<std::ptrdiff_t>(text));
    const std::span<const int32_t> before(ids->data() + text, r.begin - 1 - text);
    std::string joined;
    if (!before.empty()) {
      joined = tok.decode(before);
      const std::vector<int32_t> again = tok.encode(joined);
      if (!std::equal(again.begin(), again.end(), before.begin(), before.end())) joined.clear();
    }
    if (joined.empty()) out.insert(out.end(), before.begin(), before.end());
    const StagedImage& v = items[r.item];
    for (size_t g = 0; g < v.timestamps.size(); ++g) {
      const std::vector<int32_t> t =
          tok.encode(g == 0 ? joined + v.timestamps[g] : v.timestamps[g]);
      out.insert(out.end(), t.begin(), t.end());
      out.push_back(start);
      out_runs.push_back({out.size(), out.size() + 1, r.item, true});
      out.push_back(pad);
      out.push_back(end);
    }
    prev = r.end + 1;  // past the <|vision_end|>
  }
  out.insert(out.end(), ids->begin() + static_cast<std::ptrdiff_t>(prev), ids->end());
  *ids = std::move(out);
  *runs = std::move(out_runs);
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

void take_encoded(VisionEncoder::Job& job, std::span<StagedImage* const> images,
                  VisionEncoder::Job* draft) {
  std::vector<VisionOutput>& outs = job.outputs();
  for (size_t i = 0; i < images.size() && i < outs.size(); ++i) {
    StagedImage& img = *images[i];
    auto enc = std::make_shared<EncodedImage>();
    enc->grid = GridThw{img.pixels.grid_t, img.pixels.grid_h, img.pixels.grid_w};
    enc->out = std::move(outs[i]);
    if (draft != nullptr && i < draft->outputs().size())
      enc->draft = std::move(draft->outputs()[i]);
    enc->timestamps = img.timestamps;
    enc->frames = img.frames;
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

Result<std::vector<int32_t>> expand_pad_runs(std::span<const int32_t> ids,
                                             std::span<const PadRun> runs,
                                             std::span<const StagedImage> items,
                                             const Qwen3VLConfig& cfg) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(expanded_length(ids.size(), runs, items)));
  size_t prev = 0;
  for (const PadRun& r : runs) {
    out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(prev),
               ids.begin() + static_cast<std::ptrdiff_t>(r.begin));
    const StagedImage& it = items[r.item];
    const int64_t tokens = it.tokens / it.groups;
    const size_t have = r.end - r.begin;
    if (have != 1 && have != static_cast<size_t>(tokens)) {
      return invalid_argument(std::string(r.video ? "a video" : "an image") + " needs " +
                              std::to_string(tokens) + " pad tokens; the prompt has a run of " +
                              std::to_string(have) +
                              " pads (give one pad per image and vlm expands it)");
    }
    const int32_t pad = static_cast<int32_t>(r.video ? cfg.video_token_id : cfg.image_token_id);
    out.insert(out.end(), static_cast<size_t>(tokens), pad);
    prev = r.end;
  }
  out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(prev), ids.end());
  return out;
}

int64_t expanded_length(size_t num_ids, std::span<const PadRun> runs,
                        std::span<const StagedImage> items) {
  int64_t n = static_cast<int64_t>(num_ids);
  for (const PadRun& r : runs) {
    const StagedImage& it = items[r.item];
    n += it.tokens / it.groups - static_cast<int64_t>(r.end - r.begin);
  }
  return n;
}

void gather_features(std::span<const StagedImage> items, VisionOutput EncodedImage::*which,
                     size_t taps, std::vector<float>* embeds,
                     std::vector<std::vector<float>>* deepstack) {
  embeds->clear();
  deepstack->assign(taps, {});
  for (const StagedImage& item : items) {
    const VisionOutput& o = (*item.encoded).*which;
    embeds->insert(embeds->end(), o.embeds.begin(), o.embeds.end());
    for (size_t d = 0; d < o.deepstack.size() && d < taps; ++d) {
      (*deepstack)[d].insert((*deepstack)[d].end(), o.deepstack[d].begin(), o.deepstack[d].end());
    }
  }
}

Status assemble_multimodal(std::span<const int32_t> ids, std::span<const PadRun> runs,
                           std::span<const StagedImage> items, const Qwen3VLConfig& cfg,
                           PreparedPrompt* out) {
  gather_features(items, &EncodedImage::out, cfg.vision_config.deepstack_visual_indexes.size(),
                  &out->embeds, &out->deepstack);

  // The runs take their items' rows in order: the groups of a video are consecutive runs.
  std::vector<GridThw> grids;
  out->ids.clear();
  out->feature_row.clear();
  out->image_spans.clear();
  size_t prev = 0;
  int32_t feature = 0;
  int64_t images = 0, videos = 0;  // numbered by kind in messages, as the request gives them
  for (size_t k = 0; k < runs.size(); ++k) {
    const PadRun& r = runs[k];
    if (k == 0 || runs[k - 1].item != r.item) ++(r.video ? videos : images);
    const EncodedImage& e = *items[r.item].encoded;
    const int64_t tokens = e.out.tokens / e.grid.t;  // one temporal group's
    const size_t have = r.end - r.begin;
    const std::string what =
        r.video ? "video " + std::to_string(videos) : "image " + std::to_string(images);
    if (have != 1 && have != static_cast<size_t>(tokens)) {
      return invalid_argument(what + " needs " + std::to_string(tokens) +
                              " pad tokens; the prompt has a run of " + std::to_string(have) +
                              " pads (give one pad per image and vlm expands it)");
    }
    grids.push_back(GridThw{1, e.grid.h, e.grid.w});
    for (size_t i = prev; i < r.begin; ++i) {
      out->ids.push_back(ids[i]);
      out->feature_row.push_back(-1);
    }
    const int32_t pad = static_cast<int32_t>(r.video ? cfg.video_token_id : cfg.image_token_id);
    ImageSpan span;
    span.begin = static_cast<int64_t>(out->ids.size());
    for (int64_t i = 0; i < tokens; ++i) {
      out->ids.push_back(pad);
      out->feature_row.push_back(feature++);
    }
    span.end = static_cast<int64_t>(out->ids.size());
    span.key = items[r.item].key;
    out->image_spans.push_back(span);
    prev = r.end;
  }
  if (static_cast<size_t>(feature) * static_cast<size_t>(cfg.vision_config.out_hidden_size) !=
      out->embeds.size()) {
    return invalid_argument("the prompt's pad runs do not cover its images' and videos' tokens");
  }
  for (size_t i = prev; i < ids.size(); ++i) {
    out->ids.push_back(ids[i]);
    out->feature_row.push_back(-1);
  }
  out->vision_tokens = feature;
  VLM_ASSIGN_OR_RETURN(
      out->rope, compute_rope_index(out->ids, grids, cfg.image_token_id, cfg.vision_start_token_id,
                                    cfg.vision_config.spatial_merge_size, cfg.video_token_id));
  return ok_status();
}

}  // namespace vlm
