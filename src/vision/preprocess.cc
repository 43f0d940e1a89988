#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "vision/resize.h"

namespace vlm {
namespace {

using nlohmann::json;

// Bounds that keep smart_resize's float64 arithmetic exact (products below 2^53) and its int64
// products far from overflow. Real images are under 2^16 a side.
constexpr int64_t kMaxSide = int64_t{1} << 24;
constexpr int64_t kMaxBudget = int64_t{1} << 48;
// Sanity bounds on the model geometry, only so that products like 3*T*P*P cannot overflow.
constexpr int64_t kMaxPatch = 1024;
constexpr int64_t kMaxMerge = 64;
constexpr int64_t kMaxTemporal = 64;

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Status validate_options(const PreprocessOptions& o) {
  if (o.patch_size <= 0 || o.patch_size > kMaxPatch) {
    return invalid_argument("patch_size must be in [1, " + std::to_string(kMaxPatch) + "], got " +
                            std::to_string(o.patch_size));
  }
  if (o.merge_size <= 0 || o.merge_size > kMaxMerge) {
    return invalid_argument("merge_size must be in [1, " + std::to_string(kMaxMerge) + "], got " +
                            std::to_string(o.merge_size));
  }
  if (o.temporal_patch_size <= 0 || o.temporal_patch_size > kMaxTemporal) {
    return invalid_argument("temporal_patch_size must be in [1, " + std::to_string(kMaxTemporal) +
                            "], got " + std::to_string(o.temporal_patch_size));
  }
  if (o.min_pixels < 0 || o.max_pixels <= 0 || o.min_pixels > kMaxBudget ||
      o.max_pixels > kMaxBudget) {
    return invalid_argument(
        "pixel budget must satisfy 0 <= min_pixels, 0 < max_pixels, both <= 2^48;"
        " got min_pixels " +
        std::to_string(o.min_pixels) + ", max_pixels " + std::to_string(o.max_pixels));
  }
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(o.mean[c]) || !std::isfinite(o.std[c]) || o.std[c] == 0.0f) {
      return invalid_argument("image_mean and image_std must be finite and image_std non-zero");
    }
  }
  if (!(o.rescale_factor > 0.0) || !std::isfinite(o.rescale_factor)) {
    return invalid_argument("rescale_factor must be positive, got " + num(o.rescale_factor));
  }
  return ok_status();
}

}  // namespace

Result<std::pair<int64_t, int64_t>> smart_resize(int64_t h, int64_t w, int64_t factor,
                                                 int64_t min_pixels, int64_t max_pixels) {
  if (h <= 0 || w <= 0 || h > kMaxSide || w > kMaxSide) {
    return invalid_argument("image size " + std::to_string(w) + "x" + std::to_string(h) +
                            " is out of range (each side must be in [1, 2^24])");
  }
  if (factor <= 0 || factor > kMaxSide) {
    return invalid_argument("resize factor must be in [1, 2^24], got " + std::to_string(factor));
  }
  if (min_pixels < 0 || max_pixels <= 0 || min_pixels > kMaxBudget || max_pixels > kMaxBudget) {
    return invalid_argument("pixel budget out of range: min_pixels " + std::to_string(min_pixels) +
                            ", max_pixels " + std::to_string(max_pixels));
  }
  const double ratio = static_cast<double>(std::max(h, w)) / static_cast<double>(std::min(h, w));
  if (ratio > 200.0) {
    return invalid_argument("absolute aspect ratio must be smaller than 200, got " + num(ratio) +
                            " (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  }
  const double f = static_cast<double>(factor);
  const double hd = static_cast<double>(h), wd = static_cast<double>(w);
  // The clamp to >= factor is qwen-vl-utils'; transformers 4.57.1 lets a side <= factor/2 round to
  // 0 (see the header for when that changes the answer and why we prefer the clamp).
  int64_t h_bar = std::max(factor, static_cast<int64_t>(round_half_even(hd / f)) * factor);
  int64_t w_bar = std::max(factor, static_cast<int64_t>(round_half_even(wd / f)) * factor);
  if (h_bar * w_bar > max_pixels) {
    // Python: math.sqrt((height * width) / max_pixels); the int product is exact below 2^53.
    const double beta = std::sqrt(static_cast<double>(h * w) / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(hd / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(wd / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(h * w));
    h_bar = static_cast<int64_t>(std::ceil(hd * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(wd * beta / f)) * factor;
  }
  return std::make_pair(h_bar, w_bar);
}

void normalization_lut(const PreprocessOptions& opt, float lut[3 * 256]) {
  // The fast processor fuses rescale and normalise: mean and std are scaled by 1/rescale_factor
  // (float32 tensor times a Python float, so float32 * float32), then (x - mean) / std in float32.
  // A 256-entry table per channel holds exactly those values.
  const float inv_rescale = static_cast<float>(1.0 / opt.rescale_factor);
  for (int c = 0; c < 3; ++c) {
    const float mean = opt.mean[c] * inv_rescale;
    const float stdv = opt.std[c] * inv_rescale;
    for (int v = 0; v < 256; ++v) lut[c * 256 + v] = (static_cast<float>(v) - mean) / stdv;
  }
}

namespace {

// An image whose buffer holds exactly width x height RGB pixels.
bool rgb_matches(const Image& img) {
  return img.width > 0 && img.height > 0 &&
         static_cast<uint64_t>(img.rgb.size()) ==
             static_cast<uint64_t>(img.width) * static_cast<uint64_t>(img.height) * 3;
}

// The geometry of an output resized to rh x rw with grid_t temporal groups (no pixels yet).
PreprocessedImage output_grid(int64_t rh, int64_t rw, int64_t grid_t, const PreprocessOptions& o) {
  PreprocessedImage out;
  out.resized_h = rh;
  out.resized_w = rw;
  out.merge_size = o.merge_size;
  out.grid_t = grid_t;
  out.grid_h = rh / o.patch_size;
  out.grid_w = rw / o.patch_size;
  return out;
}

// pixel_values from frames (each resized_h x resized_w RGB, at least one): temporal group g's slot
// tt holds frame min(g*T + tt, n - 1), so a lone image fills every slot and an odd count of
// video frames repeats its last, as the processors pad. Rows in merge order (PreprocessedImage).
void flatten_patches(const std::vector<const uint8_t*>& frames, int64_t rw,
                     const PreprocessOptions& opt, const float* lut, PreprocessedImage* out,
                     ThreadPool* pool) {
  const int64_t P = opt.patch_size, M = opt.merge_size, T = opt.temporal_patch_size;
  const int64_t n = static_cast<int64_t>(frames.size());
  const int64_t per_t = out->grid_h * out->grid_w;
  const int64_t rows = out->grid_t * per_t;
  const int64_t cols = 3 * T * P * P;
  const int64_t blocks_w = out->grid_w / M;
  float* dst = out->pixel_values.data();
  auto flatten = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r / per_t, in_t = r % per_t;
      const int64_t block = in_t / (M * M), in_block = in_t % (M * M);
      const int64_t bh = block / blocks_w, bw = block % blocks_w;
      const int64_t y0 = (bh * M + in_block / M) * P, x0 = (bw * M + in_block % M) * P;
      float* row = dst + r * cols;
      for (int c = 0; c < 3; ++c) {
        const float* l = lut + c * 256;
        for (int64_t tt = 0; tt < T; ++tt) {
          const int64_t f = std::min(t * T + tt, n - 1);
          float* slot = row + (c * T + tt) * P * P;
          if (tt > 0 && f == std::min(t * T + tt - 1, n - 1)) {  // the same frame again
            std::memcpy(slot, slot - P * P, sizeof(float) * P * P);
            continue;
          }
          for (int64_t py = 0; py < P; ++py) {
            const uint8_t* s = frames[static_cast<size_t>(f)] + ((y0 + py) * rw + x0) * 3 + c;
            float* d = slot + py * P;
            for (int64_t x = 0; x < P; ++x) d[x] = l[s[x * 3]];
          }
        }
      }
    }
  };
  if (pool == nullptr || pool->n_threads() <= 1) {
    flatten(0, rows);
  } else {
    pool->parallel_for(rows, 64, [&](int64_t b, int64_t e, int) { flatten(b, e); });
  }
}

}  // namespace

Result<PreprocessedImage> preprocess_image(const Image& img, const PreprocessOptions& opt,
                                           ThreadPool* pool) {
  if (!rgb_matches(img)) {
    return invalid_argument("preprocess: image is empty or its buffer does not match " +
                            std::to_string(img.width) + "x" + std::to_string(img.height) + "x3");
  }
  VLM_RETURN_IF_ERROR(validate_options(opt).with_context("preprocess"));
  const int64_t P = opt.patch_size, M = opt.merge_size, T = opt.temporal_patch_size;
  auto hw = smart_resize(img.height, img.width, P * M, opt.min_pixels, opt.max_pixels);
  if (!hw.ok()) return hw.status().with_context("preprocess");
  const auto [rh, rw] = *hw;

  // One frame, repeated T times below: ceil(1 / T) = 1 temporal group.
  PreprocessedImage out = output_grid(rh, rw, 1, opt);
  const int64_t rows = out.grid_t * out.grid_h * out.grid_w;
  const int64_t cols = 3 * T * P * P;

  Image resized;
  const Image* src = &img;  // already the right size: flatten straight from the input
  try {
    if (rh != img.height || rw != img.width) {
      resized = resize_bicubic_antialias(img, rh, rw, pool);
      src = &resized;
    }
    if (opt.patchify) out.pixel_values.resize(static_cast<size_t>(rows * cols));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kUnavailable, "preprocess: out of memory for a " +
                                                std::to_string(rw) + "x" + std::to_string(rh) +
                                                " image (" + std::to_string(rows) + " patches)");
  }

  float lut[3][256];
  normalization_lut(opt, &lut[0][0]);
  if (!opt.patchify) {  // a device normalises and patchifies (see PreprocessOptions)
    out.resized_rgb = src == &img ? img.rgb : std::move(resized.rgb);
    out.lut.assign(&lut[0][0], &lut[0][0] + 3 * 256);
    return out;
  }

  flatten_patches({src->rgb.data()}, rw, opt, &lut[0][0], &out, pool);
  return out;
}

Result<std::pair<int64_t, int64_t>> smart_resize_video(int64_t num_frames, int64_t h, int64_t w,
                                                       int64_t temporal_factor, int64_t factor,
                                                       int64_t min_pixels, int64_t max_pixels) {
  if (num_frames < 1 || temporal_factor < 1 || temporal_factor > kMaxTemporal) {
    return invalid_argument("video of " + std::to_string(num_frames) + " frames (temporal factor " +
                            std::to_string(temporal_factor) + ")");
  }
  if (h <= 0 || w <= 0 || h > kMaxSide || w > kMaxSide || factor <= 0 || factor > kMaxSide) {
    return invalid_argument("video frame size " + std::to_string(w) + "x" + std::to_string(h) +
                            " is out of range");
  }
  if (h < factor || w < factor) {
    return invalid_argument("video frames of " + std::to_string(w) + "x" + std::to_string(h) +
                            " are smaller than " + std::to_string(factor) + " pixels a side");
  }
  if (min_pixels < 0 || max_pixels <= 0 || min_pixels > kMaxBudget || max_pixels > kMaxBudget) {
    return invalid_argument("pixel budget out of range: min_pixels " + std::to_string(min_pixels) +
                            ", max_pixels " + std::to_string(max_pixels));
  }
  const double ratio = static_cast<double>(std::max(h, w)) / static_cast<double>(std::min(h, w));
  if (ratio > 200.0) {
    return invalid_argument("absolute aspect ratio must be smaller than 200, got " + num(ratio));
  }
  const int64_t n = std::max(num_frames, temporal_factor);  // transformers raises below it
  const double f = static_cast<double>(factor);
  const double hd = static_cast<double>(h), wd = static_cast<double>(w);
  int64_t h_bar = static_cast<int64_t>(round_half_even(hd / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(round_half_even(wd / f)) * factor;
  const int64_t t_bar =
      static_cast<int64_t>(round_half_even(static_cast<double>(n) / temporal_factor)) *
      temporal_factor;
  // Python: t_bar * h_bar * w_bar (ints) against the budget; beta from n * h * w (float64).
  const double volume = static_cast<double>(t_bar) * static_cast<double>(h_bar * w_bar);
  const double frames_px = static_cast<double>(n) * static_cast<double>(h * w);
  if (volume > static_cast<double>(max_pixels)) {
    const double beta = std::sqrt(frames_px / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(hd / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(wd / beta / f)) * factor);
  } else if (volume < static_cast<double>(min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / frames_px);
    h_bar = static_cast<int64_t>(std::ceil(hd * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(wd * beta / f)) * factor;
  }
  return std::make_pair(h_bar, w_bar);
}

Result<PreprocessedImage> preprocess_video(const std::vector<Image>& frames,
                                           const PreprocessOptions& opt, ThreadPool* pool,
                                           std::optional<std::pair<int64_t, int64_t>> size) {
  if (frames.empty()) return invalid_argument("preprocess: a video without frames");
  const int64_t h = frames[0].height, w = frames[0].width;
  for (const Image& f : frames) {
    if (f.width != w || f.height != h || !rgb_matches(f)) {
      return invalid_argument(
          "preprocess: video frames differ in size or do not match their "
          "buffers");
    }
  }
  VLM_RETURN_IF_ERROR(validate_options(opt).with_context("preprocess"));
  const int64_t P = opt.patch_size, M = opt.merge_size, T = opt.temporal_patch_size;
  const int64_t n = static_cast<int64_t>(frames.size());
  auto hw = size ? Result<std::pair<int64_t, int64_t>>(*size)
                 : smart_resize_video(n, h, w, T, P * M, opt.min_pixels, opt.max_pixels);
  if (!hw.ok()) return hw.status().with_context("preprocess");
  if (hw->first % (P * M) != 0 || hw->second % (P * M) != 0 || hw->first <= 0 || hw->second <= 0) {
    return invalid_argument("preprocess: a video size that is not a multiple of " +
                            std::to_string(P * M));
  }
  const auto [rh, rw] = *hw;
  PreprocessedImage out = output_grid(rh, rw, (n + T - 1) / T, opt);
  std::vector<Image> resized;
  std::vector<const uint8_t*> px;
  try {
    out.pixel_values.resize(
        static_cast<size_t>(out.grid_t * out.grid_h * out.grid_w * 3 * T * P * P));
    for (const Image& f : frames) {
      if (rh != h || rw != w) {
        resized.push_back(resize_bicubic_antialias(f, rh, rw, pool));
      }
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kUnavailable, "preprocess: out of memory for a video of " +
                                                std::to_string(n) + " frames at " +
                                                std::to_string(rw) + "x" + std::to_string(rh));
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    px.push_back(resized.empty() ? frames[i].rgb.data() : resized[i].rgb.data());
  }
  float lut[3][256];
  normalization_lut(opt, &lut[0][0]);
  flatten_patches(px, rw, opt, &lut[0][0], &out, pool);
  return out;
}

namespace {

Status get_int(const json& j, const char* key, int64_t* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  // transformers would accept 65536.0 too; an integral float is accepted, anything else is not.
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
  } else if (it->is_number_float() && std::nearbyint(it->get<double>()) == it->get<double>() &&
             std::abs(it->get<double>()) < 9.0e15) {
    *out = static_cast<int64_t>(it->get<double>());
  } else {
    return invalid_argument(where + ": '" + key + "' must be an integer, got " + it->dump());
  }
  return ok_status();
}

// image_mean / image_std: a list of 3 numbers, or one number for all channels (as transformers).
Status get_triple(const json& j, const char* key, float out[3], const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (it->is_number()) {
    for (int c = 0; c < 3; ++c) out[c] = it->get<float>();
    return ok_status();
  }
  if (!it->is_array() || it->size() != 3) {
    return invalid_argument(where + ": '" + key + "' must be a list of 3 numbers, got " +
                            it->dump());
  }
  for (int c = 0; c < 3; ++c) {
    if (!(*it)[c].is_number()) {
      return invalid_argument(where + ": '" + key + "' must be a list of 3 numbers, got " +
                              it->dump());
    }
    out[c] = (*it)[c].get<float>();
  }
  return ok_status();
}

// A processor config's text as a JSON object, or an error naming `source`.
Result<json> parse_config_object(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return invalid_argument(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return invalid_argument(source + ": expected a JSON object");
  return j;
}

// The patch geometry and normalisation fields images and videos share.
Status read_geometry_and_normalisation(const json& j, const std::string& source,
                                       PreprocessOptions* o) {
  VLM_RETURN_IF_ERROR(get_int(j, "patch_size", &o->patch_size, source));
  VLM_RETURN_IF_ERROR(get_int(j, "temporal_patch_size", &o->temporal_patch_size, source));
  VLM_RETURN_IF_ERROR(get_int(j, "merge_size", &o->merge_size, source));
  VLM_RETURN_IF_ERROR(get_triple(j, "image_mean", o->mean, source));
  VLM_RETURN_IF_ERROR(get_triple(j, "image_std", o->std, source));
  if (auto it = j.find("rescale_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) return invalid_argument(source + ": 'rescale_factor' must be a number");
    o->rescale_factor = it->get<double>();
  }
  return ok_status();
}

Status require_true(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_boolean()) return invalid_argument(where + ": '" + key + "' must be a boolean");
  if (!it->get<bool>()) {
    return unimplemented(where + ": '" + key + "': false is not supported (Qwen3-VL sets it true)");
  }
  return ok_status();
}

}  // namespace

Result<PreprocessOptions> parse_preprocessor_config(const std::string& json_text,
                                                    const std::string& source) {
  VLM_ASSIGN_OR_RETURN(const json j, parse_config_object(json_text, source));
  PreprocessOptions o;
  if (auto it = j.find("image_processor_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return invalid_argument(source + ": 'image_processor_type' not a string");
    const std::string t = it->get<std::string>();
    if (t != "Qwen2VLImageProcessorFast" && t != "Qwen2VLImageProcessor") {
      return unimplemented(source + ": image_processor_type '" + t +
                           "' is not supported (expected Qwen2VLImageProcessorFast)");
    }
  }
  if (auto it = j.find("size"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_argument(source + ": 'size' must be an object");
    // transformers raises unless size has both keys (min_pixels/max_pixels can fill them in).
    const bool has_short = it->contains("shortest_edge") || j.contains("min_pixels");
    const bool has_long = it->contains("longest_edge") || j.contains("max_pixels");
    if (!has_short || !has_long) {
      return invalid_argument(source +
                              ": 'size' must contain 'shortest_edge' and 'longest_edge'"
                              " (pixel counts), got " +
                              it->dump());
    }
    VLM_RETURN_IF_ERROR(get_int(*it, "shortest_edge", &o.min_pixels, source + ": size"));
    VLM_RETURN_IF_ERROR(get_int(*it, "longest_edge", &o.max_pixels, source + ": size"));
  }
  VLM_RETURN_IF_ERROR(get_int(j, "min_pixels", &o.min_pixels, source));
  VLM_RETURN_IF_ERROR(get_int(j, "max_pixels", &o.max_pixels, source));
  VLM_RETURN_IF_ERROR(read_geometry_and_normalisation(j, source, &o));
  for (const char* key : {"do_resize", "do_rescale", "do_normalize"}) {
    VLM_RETURN_IF_ERROR(require_true(j, key, source));
  }
  if (auto it = j.find("resample"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 3) {
      return unimplemented(source + ": resample " + it->dump() +
                           " is not supported (only 3, bicubic)");
    }
  }
  VLM_RETURN_IF_ERROR(validate_options(o).with_context(source));
  return o;
}

VideoPreprocessConfig default_video_config(const PreprocessOptions& image) {
  VideoPreprocessConfig v;
  v.pixels = image;
  v.pixels.min_pixels = 128 * 32 * 32;
  v.pixels.max_pixels = 768 * 32 * 32;
  v.pixels.patchify = true;
  return v;
}

Result<VideoPreprocessConfig> parse_video_preprocessor_config(
    const std::string& json_text, const std::string& source,
    const VideoPreprocessConfig& defaults) {
  VLM_ASSIGN_OR_RETURN(const json j, parse_config_object(json_text, source));
  VideoPreprocessConfig v = defaults;
  PreprocessOptions& o = v.pixels;
  if (auto it = j.find("video_processor_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "Qwen3VLVideoProcessor") {
      return unimplemented(source + ": video_processor_type " + it->dump() +
                           " is not supported (expected Qwen3VLVideoProcessor)");
    }
  }
  if (auto it = j.find("size"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("shortest_edge") || !it->contains("longest_edge")) {
      return invalid_argument(source +
                              ": 'size' must contain 'shortest_edge' and 'longest_edge'"
                              " (pixel counts), got " +
                              it->dump());
    }
    VLM_RETURN_IF_ERROR(get_int(*it, "shortest_edge", &o.min_pixels, source + ": size"));
    VLM_RETURN_IF_ERROR(get_int(*it, "longest_edge", &o.max_pixels, source + ": size"));
  }
  VLM_RETURN_IF_ERROR(read_geometry_and_normalisation(j, source, &o));
  for (const char* key : {"do_resize", "do_rescale", "do_normalize", "do_sample_frames"}) {
    VLM_RETURN_IF_ERROR(require_true(j, key, source));
  }
  if (auto it = j.find("num_frames"); it != j.end() && !it->is_null()) {
    return unimplemented(source + ": num_frames (a fixed frame count) is not supported; use fps");
  }
  if (auto it = j.find("fps"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() > 0)) {
      return invalid_argument(source + ": 'fps' must be a positive number, got " + it->dump());
    }
    v.fps = it->get<double>();
  }
  VLM_RETURN_IF_ERROR(get_int(j, "min_frames", &v.min_frames, source));
  VLM_RETURN_IF_ERROR(get_int(j, "max_frames", &v.max_frames, source));
  if (v.min_frames < 1 || v.max_frames < v.min_frames) {
    return invalid_argument(source + ": frames must satisfy 1 <= min_frames <= max_frames, got " +
                            std::to_string(v.min_frames) + ".." + std::to_string(v.max_frames));
  }
  if (o.merge_size != o.temporal_patch_size) {
    return unimplemented(source + ": merge_size " + std::to_string(o.merge_size) +
                         " differs from temporal_patch_size " +
                         std::to_string(o.temporal_patch_size) +
                         " (the timestamps would not match the temporal groups)");
  }
  VLM_RETURN_IF_ERROR(validate_options(o).with_context(source));
  return v;
}

}  // namespace vlm
