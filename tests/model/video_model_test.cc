// Videos through the whole engine against transformers (tests/model/fixtures/video-f32, made by
// scripts/make_video_reference.py from the clips of tests/unit/fixtures/videos): the prompt with
// each temporal group's timestamp text and pads, the prefill logits and greedy continuations, for
// one video, an image and a video, and two videos.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "test_util.h"
#include "vlm/engine.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

const std::string kDir = std::string(VLM_FIXTURES_DIR) + "/video-f32";
const std::string kVideos = std::string(VLM_REPO_DIR) + "/tests/unit/fixtures/videos";
const std::string kImage = std::string(VLM_FIXTURES_DIR) + "/vision-f32/synthetic_tiny.png";
constexpr double kTol = 1e-4;  // max |Δlogit| / max |logit|
constexpr int32_t kVideoPad = 421, kImagePad = 420;

const nlohmann::json& ref() {
  static const nlohmann::json r =
      nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  return r;
}

std::unique_ptr<Engine> engine(int64_t prefill_chunk = 32) {
  EngineOptions o;
  o.model_dir = kDir;
  o.n_threads = 2;
  o.prefill_chunk = prefill_chunk;  // prompts span chunks: groups split across chunk borders
  o.kv_cache_dtype = KvCacheDtype::kF32;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

VideoInput video(const std::string& name) {
  VideoInput v;
  const std::string s = test_util::read_file(kVideos + "/" + name);
  v.bytes.assign(s.begin(), s.end());
  return v;
}

// A 24-bit BMP of an RGB frame [h, w, 3].
std::vector<uint8_t> bmp(const uint8_t* rgb, int64_t w, int64_t h) {
  const int64_t row = (w * 3 + 3) / 4 * 4;
  std::vector<uint8_t> out(static_cast<size_t>(54 + row * h), 0);
  auto put32 = [&](size_t at, int64_t v) {
    for (int i = 0; i < 4; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  out[0] = 'B';
  out[1] = 'M';
  put32(2, static_cast<int64_t>(out.size()));
  put32(10, 54);
  put32(14, 40);
  put32(18, w);
  put32(22, h);  // positive: rows bottom-up
  out[26] = 1;
  out[28] = 24;
  put32(34, row * h);
  for (int64_t y = 0; y < h; ++y) {
    uint8_t* dst = out.data() + 54 + (h - 1 - y) * row;
    for (int64_t x = 0; x < w; ++x) {
      const uint8_t* p = rgb + (y * w + x) * 3;
      dst[x * 3] = p[2];
      dst[x * 3 + 1] = p[1];
      dst[x * 3 + 2] = p[0];
    }
  }
  return out;
}

// The case's prompt as vlm's tokenizer makes it (single pads), and its videos and images. A case
// with `frames_fps` gives its video as the clip's sampled frames (the .npy PyAV wrote), as images.
struct Case {
  std::vector<int32_t> ids;
  std::vector<VideoInput> videos;
  std::vector<ImageInput> images;
};
Case make_case(const Engine& e, const nlohmann::json& c) {
  Case out;
  out.ids = e.tokenizer()->encode(c["text"].get<std::string>());
  for (const auto& name : c["videos"]) {
    if (!c.contains("frames_fps")) {
      out.videos.push_back(video(name));
      continue;
    }
    const std::string file = name.get<std::string>();
    auto frames = read_npy(kVideos + "/" + file.substr(0, file.find('.')) + ".npy");
    EXPECT_TRUE(frames.ok() && frames->shape.size() == 4);
    if (!frames.ok()) continue;
    VideoInput v;
    v.fps = c["frames_fps"].get<double>();
    const int64_t h = frames->shape[1], w = frames->shape[2];
    for (int64_t f = 0; f < frames->shape[0]; ++f) {
      v.frames.push_back({.bytes = bmp(frames->u8.data() + f * h * w * 3, w, h)});
    }
    out.videos.push_back(std::move(v));
  }
  for (size_t i = 0; i < c["images"].size(); ++i) out.images.push_back({.path = kImage});
  return out;
}

using test_util::rel_err;

TEST(VideoModel, PromptAndLogitsMatchTransformers) {
  auto e = engine();
  ASSERT_NE(e, nullptr);
  int checked = 0;
  for (const auto& c : ref()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Case k = make_case(*e, c);
    EXPECT_EQ(k.ids, c["prompt_ids"].get<std::vector<int32_t>>());  // the tokenizers agree
    std::vector<int32_t> expanded;
    Engine::LogitsOptions o;
    o.expanded_ids = &expanded;
    o.videos = k.videos;
    auto got = e->logits(k.ids, k.images, o);
    ASSERT_TRUE(got.ok()) << got.status().message();
    // The timestamps' text and every group's pads, exactly as Qwen3VLProcessor renders them.
    EXPECT_EQ(expanded, c["input_ids"].get<std::vector<int32_t>>());
    // Engine::prompt_tokens (/tokenize) expands them the same, without running anything.
    GenerateRequest count;
    count.prompt_ids = k.ids;
    count.images = k.images;
    count.videos = k.videos;
    auto tokens = e->prompt_tokens(std::move(count));
    ASSERT_TRUE(tokens.ok()) << tokens.status().message();
    EXPECT_EQ(*tokens, c["input_ids"].get<std::vector<int32_t>>());
    auto want = read_npy(kDir + "/" + c["logits"].get<std::string>());
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_EQ(got->size(), want->f32.size());
    EXPECT_LE(rel_err(*got, want->f32), kTol);
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(VideoModel, GreedyContinuationsMatchTransformersAndTheCacheServesRepeats) {
  auto e = engine();
  ASSERT_NE(e, nullptr);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass finds every video in the cache
    for (const auto& c : ref()["cases"]) {
      SCOPED_TRACE(c["name"].get<std::string>() + (pass ? " (cached)" : ""));
      Case k = make_case(*e, c);
      GenerateRequest req;
      req.prompt_ids = k.ids;
      req.videos = k.videos;
      req.images = k.images;
      req.max_new_tokens = 20;
      req.sampling.do_sample = false;
      req.ignore_eos = true;
      auto stream = e->submit(req);
      ASSERT_TRUE(stream.ok()) << stream.status().message();
      std::vector<int32_t> out;
      RequestOutput piece;
      RequestStats stats;
      while ((*stream)->next(&piece)) {
        ASSERT_TRUE(piece.error.ok()) << piece.error.message();
        if (piece.token_id >= 0) out.push_back(piece.token_id);
        stats = piece.stats;
      }
      EXPECT_EQ(out, c["greedy"].get<std::vector<int32_t>>());
      const auto& ids = c["input_ids"];
      EXPECT_EQ(stats.prompt_tokens, static_cast<int64_t>(ids.size()));
      EXPECT_EQ(stats.video_tokens, std::count(ids.begin(), ids.end(), kVideoPad));
      EXPECT_EQ(stats.vision_tokens,
                stats.video_tokens + std::count(ids.begin(), ids.end(), kImagePad));
      EXPECT_EQ(stats.videos, static_cast<int64_t>(c["videos"].size()));
      // Pass 0: two_videos repeats the first case's clip, text_before the second's.
      const bool repeats = c["name"] == "two_videos" || c["name"] == "text_before";
      EXPECT_EQ(stats.videos_cached, pass == 0 ? (repeats ? 1 : 0) : stats.videos);
      if (c["name"] == "frames") EXPECT_EQ(stats.video_frames, 4);
      if (pass == 0 && c["name"] == "video") {
        EXPECT_EQ(stats.video_frames, 4);
        EXPECT_GT(stats.video_decode_ms, 0);
      }
    }
  }
}

// The cache key holds the sampling: the same bytes at another fps are another input, and a GIF
// read as a video is not the GIF read as an image.
TEST(VideoModel, SamplingSettingsChangeThePrompt) {
  auto e = engine();
  ASSERT_NE(e, nullptr);
  const auto& c = ref()["cases"][0];
  Case k = make_case(*e, c);
  std::vector<int32_t> base, faster;
  Engine::LogitsOptions o;
  o.videos = k.videos;
  o.expanded_ids = &base;
  ASSERT_TRUE(e->logits(k.ids, {}, o).ok());
  o.videos[0].fps = 4;  // 45 frames at 29.97 fps: 6 frames, 3 groups (2 at fps 2)
  o.expanded_ids = &faster;
  ASSERT_TRUE(e->logits(k.ids, {}, o).ok());
  auto groups = [](const std::vector<int32_t>& ids) {
    int64_t n = 0;
    for (size_t i = 1; i < ids.size(); ++i) n += ids[i] == kVideoPad && ids[i - 1] != kVideoPad;
    return n;
  };
  EXPECT_EQ(groups(base), 2);
  EXPECT_EQ(groups(faster), 3);
  o.videos[0].fps.reset();
  o.videos[0].min_pixels = 4096;  // a smaller budget over all frames: fewer pads a group
  o.videos[0].max_pixels = 16384;
  std::vector<int32_t> smaller;
  o.expanded_ids = &smaller;
  ASSERT_TRUE(e->logits(k.ids, {}, o).ok());
  EXPECT_EQ(groups(smaller), 2);
  EXPECT_LT(std::count(smaller.begin(), smaller.end(), kVideoPad),
            std::count(base.begin(), base.end(), kVideoPad));

  // The GIF: as an image, one grid; as a video, groups with timestamps.
  const Tokenizer& tok = *e->tokenizer();
  const std::string gif = kVideos + "/gif_10.gif";
  std::vector<int32_t> as_image, as_video;
  Engine::LogitsOptions img;
  img.expanded_ids = &as_image;
  ASSERT_TRUE(
      e->logits(tok.encode("<|vision_start|><|image_pad|><|vision_end|>x"), {{.path = gif}}, img)
          .ok());
  Engine::LogitsOptions vid;
  vid.expanded_ids = &as_video;
  vid.videos = {{.path = gif}};
  ASSERT_TRUE(e->logits(tok.encode("<|vision_start|><|video_pad|><|vision_end|>x"), {}, vid).ok());
  EXPECT_EQ(std::count(as_video.begin(), as_video.end(), kImagePad), 0);
  EXPECT_EQ(groups(as_video), 2);
}

// The prefix cache keys a video's blocks on the video: the same video again is served from the
// cache with the same logits; another video with the same token layout is not.
TEST(VideoModel, ThePrefixCacheKeysBlocksOnTheVideo) {
  auto e = engine();
  ASSERT_NE(e, nullptr);
  const auto& c = ref()["cases"][0];
  Case k = make_case(*e, c);
  auto run = [&](const std::vector<VideoInput>& videos, bool read_cache, int64_t* cached) {
    Engine::LogitsOptions o;
    o.videos = videos;
    o.read_prefix_cache = read_cache;
    o.cached_tokens = cached;
    return e->logits(k.ids, {}, o);
  };
  int64_t cached = -1;
  auto first = run(k.videos, false, &cached);
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto again = run(k.videos, true, &cached);
  ASSERT_TRUE(again.ok()) << again.status().message();
  const int64_t n = static_cast<int64_t>(c["input_ids"].size());
  EXPECT_GE(cached, n / 16 * 16 - 16);  // all whole blocks but possibly the last
  EXPECT_GT(cached, 0);
  const int64_t V = static_cast<int64_t>(first->size()) / n;
  // The uncached tail is computed against the cached blocks: its rows equal the first run's.
  std::vector<float> tail_a(first->begin() + cached * V, first->end());
  std::vector<float> tail_b(again->begin() + cached * V, again->end());
  EXPECT_LE(rel_err(tail_b, tail_a), 1e-6);
  // Other bytes, the same frames (the file with a free atom appended): the same ids, another
  // key, so nothing from the first video's blocks on is served from the cache.
  VideoInput other = k.videos[0];
  const uint8_t free_atom[] = {0, 0, 0, 8, 'f', 'r', 'e', 'e'};
  other.bytes.insert(other.bytes.end(), std::begin(free_atom), std::end(free_atom));
  std::vector<int32_t> ids_other;
  Engine::LogitsOptions o;
  o.videos = {other};
  o.expanded_ids = &ids_other;
  o.read_prefix_cache = true;
  o.cached_tokens = &cached;
  auto third = e->logits(k.ids, {}, o);
  ASSERT_TRUE(third.ok()) << third.status().message();
  ASSERT_EQ(ids_other, c["input_ids"].get<std::vector<int32_t>>());
  const auto first_pad =
      std::find(ids_other.begin(), ids_other.end(), kVideoPad) - ids_other.begin();
  EXPECT_LE(cached, first_pad);
  EXPECT_LE(rel_err(*third, *first), 1e-6);  // the same frames: the same logits
}

// A video_preprocessor_config.json with a setting the engine does not implement leaves the model
// serving text and images; videos get the setting's reason. A max_frames under the model's least
// brings the least down with it.
TEST(VideoModel, AnUnsupportedVideoConfigRefusesVideosOnly) {
  test_util::TempDir tmp;
  for (const auto& f : std::filesystem::directory_iterator(kDir)) {
    if (f.path().filename() != "video_preprocessor_config.json") {
      std::filesystem::create_symlink(f.path(), tmp.path() / f.path().filename());
    }
  }
  { std::ofstream(tmp.path() / "video_preprocessor_config.json") << R"({"num_frames": 16})"; }
  EngineOptions o;
  o.model_dir = tmp.str();
  o.n_threads = 2;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  const Tokenizer& tok = *(*e)->tokenizer();
  GenerateRequest req;
  req.prompt_ids = tok.encode("<|vision_start|><|video_pad|><|vision_end|>What?");
  req.videos = {video("mp4_h264_2997.mp4")};
  req.max_new_tokens = 2;
  auto r = (*e)->generate(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_frames"), std::string::npos) << r.status().message();
  req.videos.clear();
  req.prompt_ids = tok.encode("What?");
  EXPECT_TRUE((*e)->generate(req).ok());

  auto good = engine();
  ASSERT_NE(good, nullptr);
  VideoInput two = video("mp4_h264_2997.mp4");
  two.max_frames = 2;  // under the model's 4
  req.prompt_ids = tok.encode("<|vision_start|><|video_pad|><|vision_end|>What?");
  req.videos = {two};
  auto stream = good->submit(req);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  RequestOutput piece;
  RequestStats stats;
  while ((*stream)->next(&piece)) {
    ASSERT_TRUE(piece.error.ok()) << piece.error.message();
    stats = piece.stats;
  }
  EXPECT_EQ(stats.video_frames, 2);
}

TEST(VideoModel, BadVideosAndPromptsGetClearErrors) {
  auto e = engine();
  ASSERT_NE(e, nullptr);
  const Tokenizer& tok = *e->tokenizer();
  auto submit_error = [&](const std::string& text, std::vector<VideoInput> videos) {
    GenerateRequest req;
    req.prompt_ids = tok.encode(text);
    req.videos = std::move(videos);
    req.max_new_tokens = 2;
    auto s = e->generate(req);
    return s.ok() ? std::string() : s.status().message();
  };
  const std::string one = "<|vision_start|><|video_pad|><|vision_end|>What?";
  EXPECT_NE(submit_error(one, {}).find("1 video placeholders (<|video_pad|>) but 0 videos"),
            std::string::npos);
  EXPECT_NE(submit_error("What?", {video("mp4_h264_2997.mp4")})
                .find("0 video placeholders (<|video_pad|>) but 1 videos"),
            std::string::npos);
  // A video pad outside <|vision_start|> ... is text (as in transformers), not a placeholder.
  EXPECT_NE(submit_error("<|video_pad|>", {video("mp4_h264_2997.mp4")})
                .find("0 video placeholders (<|video_pad|>) but 1 videos"),
            std::string::npos);
  EXPECT_EQ(submit_error("a <|video_pad|> as text", {}), "");
  EXPECT_NE(submit_error("<|vision_start|><|video_pad|><|video_pad|><|vision_end|>",
                         {video("mp4_h264_2997.mp4")})
                .find("with one pad"),
            std::string::npos);
  // A broken file: its own reason, named as the request's first video.
  const std::string truncated = submit_error(one, {video("truncated_mp4.mp4")});
  EXPECT_EQ(truncated.rfind("video 1: ", 0), 0u) << truncated;
  const std::string garbage = submit_error(one, {video("garbage.mp4")});
  EXPECT_EQ(garbage.rfind("video 1: ", 0), 0u) << garbage;
  VideoInput bad_fps = video("mp4_h264_2997.mp4");
  bad_fps.fps = 0;
  EXPECT_NE(submit_error(one, {bad_fps}).find("fps must be in (0, 1000]"), std::string::npos);
  VideoInput bad_frames = video("mp4_h264_2997.mp4");
  bad_frames.min_frames = 8;
  bad_frames.max_frames = 4;
  EXPECT_NE(submit_error(one, {bad_frames}).find("min_frames <= max_frames"), std::string::npos);
  // Over the context: refused once the frames are sampled, before they are resized.
  VideoInput huge = video("mp4_h264_2997.mp4");
  huge.min_pixels = huge.max_pixels = 64LL << 20;
  EXPECT_NE(submit_error(one, {huge}).find("the context leaves for it"), std::string::npos);
  // Lists of frames: one size for all, each a decodable image, not beside a file.
  const std::vector<uint8_t> red(32 * 32 * 3, 200), wide(64 * 32 * 3, 100);
  VideoInput listed;
  listed.frames = {{.bytes = bmp(red.data(), 32, 32)}, {.bytes = bmp(wide.data(), 64, 32)}};
  EXPECT_NE(submit_error(one, {listed}).find("video 1: frame 2 is 64x32, frame 1 32x32"),
            std::string::npos)
      << submit_error(one, {listed});
  listed.frames[1] = {.bytes = {1, 2, 3, 4}};
  EXPECT_EQ(submit_error(one, {listed}).rfind("video 1: frame 2: ", 0), 0u)
      << submit_error(one, {listed});
  listed.frames[1] = listed.frames[0];
  listed.path = kVideos + "/mp4_h264_2997.mp4";
  EXPECT_NE(submit_error(one, {listed}).find("a file or a list of frames, not both"),
            std::string::npos);
  listed.path.clear();
  EXPECT_EQ(submit_error(one, {listed}), "");  // two 32x32 frames: one group
  // The engine still serves a good request after all of them.
  EXPECT_EQ(submit_error(one, {video("mp4_h264_2997.mp4")}), "");
}

}  // namespace
}  // namespace vlm
