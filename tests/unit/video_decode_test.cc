// Video decoding against the references scripts/make_video_fixtures.py stored: transformers
// 4.57.1's frame sampling, PyAV's RGB frames (±1 per channel), and the hostile files each
// refused with a one-line error, quickly.
#include "vision/video_decode.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/sha256.h"
#include "io/npy.h"
#include "test_util.h"
#include "vision/preprocess.h"

namespace vlm {
namespace {

const std::string kDir = std::string(VLM_FIXTURES_DIR) + "/../../unit/fixtures/videos";

nlohmann::json reference() {
  return nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
}

Result<VideoFrames> decode_file(const std::string& name, const VideoSampling& s = {},
                                const VideoLimits& limits = {}, const FrameSink& sink = {}) {
  const std::string bytes = test_util::read_file(kDir + "/" + name);
  return decode_video(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), s, limits,
                      sink);
}

TEST(VideoSampling, IndicesAreTransformers) {
  const nlohmann::json ref = reference();
  ASSERT_FALSE(ref["sampling_cases"].empty());
  for (const auto& c : ref["sampling_cases"]) {
    const int64_t total = c["total"].get<int64_t>();
    const double fps = c["fps"].get<double>();
    EXPECT_EQ(sample_frame_indices(total, fps, VideoSampling{}),
              c["indices"].get<std::vector<int64_t>>())
        << total << " frames at " << fps;
  }
  EXPECT_TRUE(sample_frame_indices(0, 30, VideoSampling{}).empty());
  VideoSampling s;
  s.fps = 1;
  s.min_frames = 2;
  s.max_frames = 3;
  EXPECT_EQ(sample_frame_indices(100, 10, s), (std::vector<int64_t>{0, 50, 99}));  // 10 → 3
}

TEST(VideoDecode, EveryClipGivesPyAvsFramesAtTransformersIndices) {
  const nlohmann::json ref = reference();
  ASSERT_EQ(ref["clips"].size(), 8u);
  for (const auto& [name, c] : ref["clips"].items()) {
    SCOPED_TRACE(name);
    auto v = decode_file(name);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->indices, c["indices"].get<std::vector<int64_t>>());
    EXPECT_EQ(v->total_frames, c["total_frames"].get<int64_t>());
    EXPECT_NEAR(v->source_fps, c["fps"].get<double>(), 1e-9);
    auto want = read_npy(kDir + "/" + name.substr(0, name.rfind('.')) + ".npy");
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_EQ(want->shape.size(), 4u);
    ASSERT_EQ(static_cast<int64_t>(v->frames.size()), want->shape[0]);
    const int64_t h = want->shape[1], w = want->shape[2];
    int worst = 0;
    for (size_t f = 0; f < v->frames.size(); ++f) {
      const Image& img = v->frames[f];
      ASSERT_EQ(img.width, w);
      ASSERT_EQ(img.height, h);
      const uint8_t* ref_px = want->u8.data() + f * static_cast<size_t>(h * w * 3);
      for (int64_t i = 0; i < h * w * 3; ++i) {
        worst = std::max(worst, std::abs(int{img.rgb[i]} - int{ref_px[i]}));
      }
    }
    EXPECT_LE(worst, 1);
  }
}

TEST(VideoDecode, FormatIsSniffedNotTakenFromTheName) {
  const nlohmann::json ref = reference();
  auto v = decode_file(ref["wrong_extension"].get<std::string>());
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->format.rfind("matroska", 0), 0u) << v->format;  // WebM bytes named .mp4
}

TEST(VideoDecode, HostileFilesGiveAOneLineErrorQuickly) {
  const nlohmann::json ref = reference();
  ASSERT_FALSE(ref["hostile"].empty());
  for (const auto& [name, reason] : ref["hostile"].items()) {
    SCOPED_TRACE(name);
    const auto t0 = std::chrono::steady_clock::now();
    auto v = decode_file(name);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    const std::string& m = v.status().message();
    EXPECT_EQ(m.rfind("video", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(reason.get<std::string>()), std::string::npos) << m;
    EXPECT_LT(s, 5.0);
  }
  const std::vector<uint8_t> empty;
  EXPECT_FALSE(decode_video(empty.data(), 0, VideoSampling{}).ok());
  // Bounded memory: the 60000x60000 and 65535x65535 headers allocated no frame (an RGBA
  // 60000² canvas alone would be 14 GB).
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  EXPECT_LT(ru.ru_maxrss, 512L << 10) << "peak RSS in KiB";
}

TEST(VideoDecode, LimitsAreCheckedBeforeDecoding) {
  VideoLimits small;
  small.max_bytes = 100;
  auto v = decode_file("mp4_h264_2997.mp4", {}, small);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("bytes exceed"), std::string::npos) << v.status().message();
  VideoLimits pixels;
  pixels.max_frame_pixels = 64 * 47;
  for (const char* name : {"mp4_h264_2997.mp4", "webp_anim.webp", "gif_10.gif"}) {
    v = decode_file(name, {}, pixels);
    ASSERT_FALSE(v.ok()) << name;
    EXPECT_NE(v.status().message().find("pixels"), std::string::npos) << v.status().message();
  }
  VideoLimits total;
  total.max_total_pixels = 64 * 48 * 3;  // 3 of the 4 sampled frames
  v = decode_file("mp4_h264_2997.mp4", {}, total);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("together"), std::string::npos) << v.status().message();
  VideoLimits longest;
  longest.max_duration_s = 1;
  v = decode_file("mp4_h264_2997.mp4", {}, longest);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("duration"), std::string::npos) << v.status().message();
  VideoSampling bad;
  bad.fps = 0;
  EXPECT_FALSE(decode_file("mp4_h264_2997.mp4", bad).ok());
}

TEST(VideoDecode, SamplingSettingsChooseTheFrames) {
  VideoSampling every;
  every.fps = 30000.0 / 1001;  // the source's rate: every frame
  every.max_frames = 1000;
  auto v = decode_file("mp4_h264_2997.mp4", every);
  ASSERT_TRUE(v.ok()) << v.status().message();
  ASSERT_EQ(v->frames.size(), 45u);
  for (int64_t i = 0; i < 45; ++i) EXPECT_EQ(v->indices[static_cast<size_t>(i)], i);
  // The sampled frames of the default run are among them, the same pixels.
  auto d = decode_file("mp4_h264_2997.mp4");
  ASSERT_TRUE(d.ok());
  for (size_t k = 0; k < d->indices.size(); ++k) {
    EXPECT_EQ(d->frames[k].rgb, v->frames[static_cast<size_t>(d->indices[k])].rgb) << k;
  }
}

// Qwen3VLVideoProcessor's pixel_values_videos, bit for bit, from the decoded frames: the video
// smart_resize (64x48 to 64x64, to 32x32 under a small budget, upscaled at the class defaults),
// an odd frame count padded with the last frame, temporal groups in the temporal patch slots.
TEST(VideoPreprocess, PixelValuesAreTransformers) {
  const nlohmann::json ref = reference();
  ASSERT_EQ(ref["preprocess_cases"].size(), 3u);
  for (const auto& c : ref["preprocess_cases"]) {
    const std::string clip = c["clip"].get<std::string>();
    SCOPED_TRACE(clip);
    auto v = decode_file(clip);
    ASSERT_TRUE(v.ok()) << v.status().message();
    PreprocessOptions opt;
    opt.min_pixels = c["min_pixels"].get<int64_t>();
    opt.max_pixels = c["max_pixels"].get<int64_t>();
    auto p = preprocess_video(v->frames, opt);
    ASSERT_TRUE(p.ok()) << p.status().message();
    const auto grid = c["grid_thw"].get<std::vector<int64_t>>();
    EXPECT_EQ((std::vector<int64_t>{p->grid_t, p->grid_h, p->grid_w}), grid);
    const auto shape = c["shape"].get<std::vector<int64_t>>();
    ASSERT_EQ(static_cast<int64_t>(p->pixel_values.size()), shape[0] * shape[1]);
    if (c.contains("npy")) {
      auto want = read_npy(kDir + "/" + c["npy"].get<std::string>());
      ASSERT_TRUE(want.ok()) << want.status().message();
      ASSERT_EQ(want->f32.size(), p->pixel_values.size());
      int64_t differ = 0;
      for (size_t i = 0; i < want->f32.size(); ++i) differ += want->f32[i] != p->pixel_values[i];
      EXPECT_EQ(differ, 0);
    }
    const Sha256Digest d = Sha256::of(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(p->pixel_values.data()), p->pixel_values.size() * 4));
    EXPECT_EQ(sha256_hex(d), c["sha256"].get<std::string>());
  }
}

// The prompt's "<t.t seconds>" texts as Qwen3VLProcessor writes them for each clip, one per
// temporal group.
TEST(VideoPreprocess, TimestampsAndGroupsAreTransformers) {
  const nlohmann::json ref = reference();
  int checked = 0;
  for (const auto& [name, c] : ref["clips"].items()) {
    SCOPED_TRACE(name);
    auto v = decode_file(name);
    ASSERT_TRUE(v.ok()) << v.status().message();
    const std::vector<std::string> ts = video_timestamps(v->indices, v->source_fps, 2);
    PreprocessOptions opt;
    opt.min_pixels = 4096;
    opt.max_pixels = 25165824;
    auto p = preprocess_video(v->frames, opt);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(static_cast<int64_t>(ts.size()), p->grid_t);
    if (!c.contains("timestamps")) {  // one frame: transformers raises; vlm pads it to two
      EXPECT_EQ(ts, (std::vector<std::string>{"<0.0 seconds>"}));
      continue;
    }
    EXPECT_EQ(ts, c["timestamps"].get<std::vector<std::string>>());
    EXPECT_EQ(p->grid_t, c["groups"].get<int64_t>());
    ++checked;
  }
  EXPECT_EQ(checked, 7);
  EXPECT_TRUE(video_timestamps({0, 1}, 0, 2).empty());
  EXPECT_EQ(
      video_timestamps({0, 3, 6}, 2.0, 2),
      (std::vector<std::string>{"<0.8 seconds>", "<3.0 seconds>"}));  // 0.75: binary 0.75 → 0.8
}

TEST(VideoPreprocess, SmartResizeFollowsTransformersAndPricesOneFrameAsTwo) {
  // 4 frames of 64x48 at 4096..25165824: round(48/32) = 2 (half to even), so 64x64.
  auto hw = smart_resize_video(4, 48, 64, 2, 32, 4096, 25165824);
  ASSERT_TRUE(hw.ok());
  EXPECT_EQ(*hw, std::make_pair(int64_t{64}, int64_t{64}));
  // One frame: priced as two (transformers raises); the same size as a two-frame clip.
  auto one = smart_resize_video(1, 480, 640, 2, 32, 4096, 200000);
  auto two = smart_resize_video(2, 480, 640, 2, 32, 4096, 200000);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(*one, *two);
  EXPECT_LE(2 * one->first * one->second, 200000);
  EXPECT_FALSE(smart_resize_video(4, 20, 64, 2, 32, 4096, 25165824).ok());    // a side under 32
  EXPECT_FALSE(smart_resize_video(4, 32, 7000, 2, 32, 4096, 25165824).ok());  // ratio over 200
  std::vector<Image> odd(3);
  for (Image& f : odd) {
    f.width = 64;
    f.height = 64;
    f.rgb.assign(64 * 64 * 3, 10);
  }
  odd[2].rgb.assign(64 * 64 * 3, 200);
  auto p = preprocess_video(odd, PreprocessOptions{});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->grid_t, 2);  // 3 frames padded to 4
  // Group 1's two slots both hold frame 2 (value 200).
  const int64_t cols = 3 * 2 * 16 * 16, per_t = p->grid_h * p->grid_w;
  const float* row = p->pixel_values.data() + per_t * cols;
  EXPECT_EQ(row[0], row[16 * 16]);
  EXPECT_GT(row[0], 0.5f);
  odd[1].width = 32;
  EXPECT_FALSE(preprocess_video(odd, PreprocessOptions{}).ok());
  EXPECT_FALSE(preprocess_video({}, PreprocessOptions{}).ok());
}

// A sink sees every sampled frame at the source's size, with the sampled count, and what it
// returns is what is kept (and counted against max_total_pixels); its error stops the decode.
TEST(VideoDecode, TheSinkKeepsWhatItReturns) {
  for (const char* name : {"mp4_h264_2997.mp4", "webp_anim.webp"}) {
    SCOPED_TRACE(name);
    auto whole = decode_file(name);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    int calls = 0;
    FrameSink shrink = [&](Image f, int64_t sampled) -> Result<Image> {
      EXPECT_EQ(sampled, static_cast<int64_t>(whole->indices.size()));
      EXPECT_EQ(f.rgb, whole->frames[calls].rgb);  // the frame as decode_video gives it
      ++calls;
      Image small;
      small.width = small.height = 2;
      small.rgb.assign(12, static_cast<uint8_t>(calls));
      return small;
    };
    VideoLimits tight;
    tight.max_total_pixels = 4 * static_cast<int64_t>(whole->frames.size());  // 2x2 frames only
    auto kept = decode_file(name, {}, tight, shrink);
    ASSERT_TRUE(kept.ok()) << kept.status().message();
    EXPECT_EQ(calls, static_cast<int>(whole->frames.size()));
    ASSERT_EQ(kept->frames.size(), whole->frames.size());
    EXPECT_EQ(kept->frames.back().width, 2);
    EXPECT_EQ(kept->frames.back().rgb[0], calls);
    EXPECT_EQ(kept->indices, whole->indices);
    EXPECT_FALSE(decode_file(name, {}, tight).ok());  // the full frames are over that limit
    FrameSink refuse = [](Image, int64_t) -> Result<Image> {
      return Status(StatusCode::kOutOfRange, "too many tokens");
    };
    auto refused = decode_file(name, {}, {}, refuse);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().message(), "too many tokens");
  }
}

// Seeking: where the samples lie 16 or more frames apart the decoder jumps to the keyframe before
// each, and gives the same frames as decoding every frame, from fewer decoded frames (the clip:
// 150 frames, a keyframe every 8, B-frames). Denser samples decode in order.
TEST(VideoDecode, SeekingGivesTheSameFramesFromFewerDecodes) {
  VideoLimits sequential;
  sequential.seek = false;
  for (double fps : {1.0, 0.5, 2.0, 30.0}) {  // 5 and 4 samples; 10 (15 apart) and all 150
    SCOPED_TRACE(fps);
    VideoSampling s;
    s.fps = fps;
    auto sought = decode_file("mp4_h264_gop8.mp4", s);
    auto whole = decode_file("mp4_h264_gop8.mp4", s, sequential);
    ASSERT_TRUE(sought.ok()) << sought.status().message();
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    EXPECT_EQ(sought->indices, whole->indices);
    ASSERT_EQ(sought->frames.size(), whole->frames.size());
    for (size_t i = 0; i < whole->frames.size(); ++i) {
      EXPECT_EQ(sought->frames[i].rgb, whole->frames[i].rgb) << "frame " << whole->indices[i];
    }
    EXPECT_EQ(whole->decoded_frames, whole->indices.back() + 1);
    if (fps >= 2.0) {  // samples under 16 frames apart: decoded in order
      EXPECT_EQ(sought->decoded_frames, whole->decoded_frames);
    } else {
      EXPECT_LT(sought->decoded_frames * 2, whole->decoded_frames)
          << sought->decoded_frames << " of " << whole->decoded_frames;
    }
  }
}

}  // namespace
}  // namespace vlm
