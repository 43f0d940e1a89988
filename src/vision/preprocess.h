// Qwen3-VL image preprocessing: smart resize to a multiple of patch*merge, antialiased bicubic
// resampling, normalisation, temporal duplication and patch flattening in merge order.
//
// The reference is transformers 4.57.1's Qwen2VLImageProcessorFast (the processor Qwen3-VL's
// preprocessor_config.json selects). Pixels are bit-exact with it: the
// resize is torchvision's uint8 antialiased bicubic (vision/resize.h) and the normalisation is the
// same float32 expression. The one deliberate difference is in smart_resize for images with a
// side shorter than factor/2 (see there).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "vision/image.h"
#include "vlm/status.h"

namespace vlm {

// Field names follow preprocessor_config.json. The defaults are the Qwen3-VL checkpoints' values.
struct PreprocessOptions {
  int64_t min_pixels = 65536;     // size.shortest_edge: a PIXEL COUNT (64 tokens), not an edge
  int64_t max_pixels = 16777216;  // size.longest_edge: a pixel count (16384 tokens)
  int64_t patch_size = 16;
  int64_t merge_size = 2;
  int64_t temporal_patch_size = 2;
  float mean[3] = {0.5f, 0.5f, 0.5f};   // image_mean, R G B
  float std[3] = {0.5f, 0.5f, 0.5f};    // image_std, R G B
  double rescale_factor = 1.0 / 255.0;  // rescale_factor (transformers' default, 1/255)
  // false: preprocess_image stops after the resize and keeps the resized RGB (a GPU vision
  // tower normalises and patchifies it there: a quarter of the bytes to upload). vlm sets it on
  // --device cuda; preprocessor_config.json does not.
  bool patchify = true;
};

// The fused rescale + normalise of each channel's 256 byte values, exactly as preprocess_image
// applies it: lut[c * 256 + v] = (v − mean_c / rescale) / (std_c / rescale) in float32.
void normalization_lut(const PreprocessOptions& opt, float lut[3 * 256]);

// Python's round() on a float (and numpy's .round()): to nearest, ties to even. std::round and
// lround tie away from zero (720/32 = 22.5 would become 23, not 22); std::nearbyint depends on the
// global rounding mode.
inline double round_half_even(double x) {
  const double r = std::floor(x);
  const double diff = x - r;  // exact: x and r are within one unit of each other
  if (diff > 0.5) return r + 1.0;
  if (diff < 0.5) return r;
  return std::fmod(r, 2.0) == 0.0 ? r : r + 1.0;
}

// Output size (height, width) for an h x w image: both multiples of `factor` (patch * merge),
// aspect ratio kept as closely as possible, pixel count within [min_pixels, max_pixels].
// Follows transformers 4.57.1's smart_resize exactly (float64 math, Python round-half-to-even,
// error when max(h,w)/min(h,w) > 200, floor branch clamped to >= factor), with one change taken
// from qwen-vl-utils: the rounded sides are clamped to >= factor before the min/max tests.
// transformers does not raise for tiny images; a side <= factor/2 rounds to 0 there (16/32 = 0.5
// rounds to even), which sends the image to the min_pixels branch regardless of its size. The two
// rules differ only when a side is <= factor/2 and factor * (rounded other side) >= min_pixels,
// e.g. 10x600 with min_pixels 4096: transformers 32x512, vlm 32x608 (what qwen-vl-utils, the
// training pipeline, produces); with min_pixels 0 transformers returns a 0 side and then fails,
// vlm returns 32x608. At the default min_pixels this needs a side <= 16 px and an aspect ratio
// above ~128. We prefer the clamp because transformers' answer there is a gross distortion
// (10x600 at min_pixels 1 becomes 32x32) that the model never saw in training.
// Errors (kInvalidArgument): non-positive sides or factor, max_pixels <= 0, min_pixels < 0, sides
// or budgets too large for exact float64 math (> 2^24 px a side, > 2^48 px), aspect ratio > 200.
Result<std::pair<int64_t, int64_t>> smart_resize(int64_t h, int64_t w, int64_t factor,
                                                 int64_t min_pixels, int64_t max_pixels);

struct PreprocessedImage {
  int64_t grid_t = 0, grid_h = 0, grid_w = 0;  // image_grid_thw, in patches (not merged)
  int64_t resized_h = 0, resized_w = 0;        // pixels; resized_h = grid_h * patch_size
  int64_t merge_size = 2;
  // [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size * patch_size], rows in merge
  // order: row ((t*(gh/m) + bh)*(gw/m) + bw)*m*m + ih*m + iw is the patch at
  // y0 = (bh*m + ih)*P, x0 = (bw*m + iw)*P; column ((c*T + tt)*P + py)*P + px.
  std::vector<float> pixel_values;
  // With PreprocessOptions::patchify false, instead of pixel_values: the resized image
  // [resized_h, resized_w, 3] and its normalisation table (normalization_lut).
  std::vector<uint8_t> resized_rgb;
  std::vector<float> lut;  // [3 * 256]

  // Number of <|image_pad|> tokens: grid_t * grid_h * grid_w / merge_size^2.
  int64_t num_tokens() const { return grid_t * grid_h * grid_w / (merge_size * merge_size); }
};

// smart_resize, resize_bicubic_antialias, then (u8 - mean*255) / (std*255) in float32 per channel
// (the fast processor's fused rescale+normalise), the image repeated temporal_patch_size times
// (grid_t = 1), flattened as above. `pool` splits the resize and the flattening across threads.
// Errors: kInvalidArgument for an empty or inconsistent image, bad options or a smart_resize error;
// kUnavailable when the output cannot be allocated.
Result<PreprocessedImage> preprocess_image(const Image& img, const PreprocessOptions& opt,
                                           ThreadPool* pool = nullptr);

// The video smart_resize of transformers 4.57.1 (video_processing_qwen3_vl.smart_resize): the
// budget [min_pixels, max_pixels] bounds t̄·h̄·w̄ over all frames, with t̄ the frame count rounded
// to a multiple of temporal_factor (half to even) and the scale from the frame count itself.
// Errors as there: a side under `factor`, an aspect ratio over 200. One deliberate difference:
// fewer frames than temporal_factor (a one-frame clip) are priced as temporal_factor frames, what
// padding makes of them, where transformers raises.
Result<std::pair<int64_t, int64_t>> smart_resize_video(int64_t num_frames, int64_t h, int64_t w,
                                                       int64_t temporal_factor, int64_t factor,
                                                       int64_t min_pixels, int64_t max_pixels);

// One video's frames (all the same size) as Qwen3VLVideoProcessor makes them: each resized to
// smart_resize_video's size (the same antialiased bicubic as images), normalised, the count padded
// to a multiple of temporal_patch_size by repeating the last frame, flattened as above with
// grid_t = the temporal groups. `opt`'s pixel budget is the video's (video_preprocessor_config.json
// `size`). Errors: kInvalidArgument (no frames, frames of different sizes, a smart_resize_video
// error), kUnavailable when the output cannot be allocated.
// `size` (height, width), when given, is the resize target instead of smart_resize_video's (the
// frames' own size when they were resized as they were decoded).
Result<PreprocessedImage> preprocess_video(const std::vector<Image>& frames,
                                           const PreprocessOptions& opt, ThreadPool* pool = nullptr,
                                           std::optional<std::pair<int64_t, int64_t>> size = {});

// Reads preprocessor_config.json text. Pixel budget: top-level min_pixels / max_pixels when present
// (transformers lets them override size), else size.shortest_edge / size.longest_edge. Also reads
// patch_size, temporal_patch_size, merge_size, image_mean, image_std (3 numbers or 1 broadcast) and
// rescale_factor. Keys that are absent (or null) keep the PreprocessOptions defaults (the Qwen3-VL
// values; transformers' class defaults would be Qwen2-VL's instead). Rejects (kInvalidArgument or
// kUnimplemented, message prefixed with `source`) malformed JSON, wrong types, non-positive sizes,
// a zero std, a `size` without both edges, and settings this engine does not implement: do_resize,
// do_rescale or do_normalize false, resample other than 3 (bicubic), or an image_processor_type
// other than Qwen2VLImageProcessor(Fast).
Result<PreprocessOptions> parse_preprocessor_config(const std::string& json_text,
                                                    const std::string& source);

// What video_preprocessor_config.json sets: the pixel budget over all of a video's frames and the
// patch geometry (`pixels`), and the frame sampling (Qwen3VLVideoProcessor's fields and class
// defaults: fps 2, 4..768 frames).
struct VideoPreprocessConfig {
  PreprocessOptions pixels;
  double fps = 2;
  int64_t min_frames = 4;
  int64_t max_frames = 768;
};

// The class defaults of Qwen3VLVideoProcessor (size 128..768 tokens' pixels), with the image
// options' patch geometry and normalisation: what transformers uses when a checkpoint has no
// video_preprocessor_config.json and its preprocessor_config.json sets no size.
VideoPreprocessConfig default_video_config(const PreprocessOptions& image);

// Reads video_preprocessor_config.json text over `defaults`: size (shortest_edge / longest_edge,
// pixel counts over all frames), patch_size, temporal_patch_size, merge_size, image_mean,
// image_std, rescale_factor, fps, min_frames, max_frames. transformers falls back to
// preprocessor_config.json when a checkpoint has no video file, and so does the engine (its
// image-only keys are ignored). Rejects what parse_preprocessor_config rejects, a
// video_processor_type other than Qwen3VLVideoProcessor, do_sample_frames false or num_frames
// (fixed frame counts: not implemented), a non-positive fps, min_frames > max_frames, and a
// merge_size that differs from temporal_patch_size (each temporal group's timestamp averages
// `merge_size` frames in Qwen3VLProcessor, `temporal_patch_size` in the model).
Result<VideoPreprocessConfig> parse_video_preprocessor_config(
    const std::string& json_text, const std::string& source, const VideoPreprocessConfig& defaults);

}  // namespace vlm
