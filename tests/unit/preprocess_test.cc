// Qwen3-VL image preprocessing against transformers 4.57.1 (Qwen2VLImageProcessorFast) goldens made
// by scripts/make_preprocess_reference.py: smart_resize sizes, the resized uint8 pixels
// (torchvision's antialiased bicubic), pixel_values layout and values, grid_thw and token counts.
//
// Resize tolerance: exact. Every resized pixel must equal the reference (max |diff| 0 LSB, 100%
// identical) whenever our decoder produced the same source bytes as PIL (always, for the synthetic
// sources stored as .npy; checked by fingerprint for the test photos). The resampler reproduces
// ATen's fixed-point arithmetic step for step, so any difference is a bug, not rounding noise.
#include "vision/preprocess.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/npy.h"
#include "test_util.h"
#include "vision/image_decode.h"
#include "vision/resize.h"

namespace vlm {
namespace {

using nlohmann::json;

const std::string kFixtures = VLM_FIXTURES_DIR "/../../unit/fixtures/preprocess";
const std::string kPhotos = VLM_TESTDATA_DIR "/images";

const json& cases_json() {
  static const json j = [] {
    const std::string text = test_util::read_file(kFixtures + "/cases.json");
    return text.empty() ? json() : json::parse(text);
  }();
  return j;
}

Image image_from_npy(const std::string& path) {
  auto a = read_npy(path);
  EXPECT_TRUE(a.ok()) << a.status().message();
  Image img;
  if (!a.ok()) return img;
  EXPECT_EQ(a->dtype, DType::kU8) << path;
  EXPECT_EQ(a->shape.size(), 3u) << path;
  if (a->shape.size() != 3 || a->shape[2] != 3) return img;
  img.height = a->shape[0];
  img.width = a->shape[1];
  img.rgb = std::move(a->u8);
  return img;
}

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001B3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct Diff {
  int64_t count = 0, mismatched = 0;
  int max_abs = 0;
  double sum_abs = 0;
};

Diff compare_u8(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  Diff d;
  d.count = static_cast<int64_t>(std::min(a.size(), b.size()));
  for (int64_t i = 0; i < d.count; ++i) {
    const int e = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    d.mismatched += e != 0;
    d.max_abs = std::max(d.max_abs, e);
    d.sum_abs += e;
  }
  return d;
}

PreprocessOptions budget(int64_t min_pixels, int64_t max_pixels) {
  PreprocessOptions o;
  o.min_pixels = min_pixels;
  o.max_pixels = max_pixels;
  return o;
}

std::pair<int64_t, int64_t> sr(int64_t h, int64_t w, int64_t min_pixels = 65536,
                               int64_t max_pixels = 16777216) {
  auto r = smart_resize(h, w, 32, min_pixels, max_pixels);
  EXPECT_TRUE(r.ok()) << h << "x" << w << ": " << r.status().message();
  return r.ok() ? *r : std::make_pair(int64_t{-1}, int64_t{-1});
}

using HW = std::pair<int64_t, int64_t>;

// Design doc §2.3's worked examples (HF defaults), as (height, width).
TEST(SmartResize, WorkedExamples) {
  EXPECT_EQ(sr(1080, 1920), HW(1088, 1920));
  EXPECT_EQ(sr(600, 800), HW(608, 800));
  EXPECT_EQ(sr(480, 640), HW(480, 640));
  EXPECT_EQ(sr(224, 224), HW(256, 256));  // min_pixels branch
  EXPECT_EQ(sr(3000, 4000), HW(3008, 4000));
  EXPECT_EQ(sr(6000, 8000), HW(3520, 4704));  // max_pixels branch
  EXPECT_EQ(sr(1600, 2560), HW(1600, 2560));  // already aligned
}

// 720/32 = 22.5 and 1296/32 = 40.5: Python rounds half to even (22, 40); std::round would give
// 23 and 41, i.e. 736x1312.
TEST(SmartResize, TiesRoundHalfToEven) {
  EXPECT_EQ(sr(720, 1296), HW(704, 1280));
  EXPECT_EQ(sr(80, 112, 1024), HW(64, 128));  // 2.5 -> 2, 3.5 -> 4
  EXPECT_EQ(sr(48, 48, 0), HW(64, 64));       // 1.5 -> 2
}

// transformers 4.57.1 does not raise for tiny images. A side <= 16 rounds to 0 there, which forces
// the min_pixels branch; vlm clamps the rounded side to 32 first (qwen-vl-utils). Both give the
// same answer whenever 32 * (other rounded side) < min_pixels, e.g. every tiny image at the default
// budget below aspect ~128.
TEST(SmartResize, TinyImages) {
  EXPECT_EQ(sr(1, 1), HW(256, 256));     // transformers: the same
  EXPECT_EQ(sr(20, 30), HW(224, 320));   // transformers: the same
  EXPECT_EQ(sr(5, 1000), HW(32, 3648));  // transformers: the same
  // Where the rules differ (transformers' answers are recorded in cases.json and checked below).
  EXPECT_EQ(sr(10, 600, 4096), HW(32, 608));  // transformers: 32x512
  EXPECT_EQ(sr(10, 600, 1), HW(32, 608));     // transformers: 32x32
  EXPECT_EQ(sr(10, 600, 0), HW(32, 608));     // transformers: 0x608, then its resize raises
  EXPECT_EQ(sr(16, 640, 4096), HW(32, 640));  // 16/32 = 0.5 rounds to 0; transformers: 32x416
  EXPECT_EQ(sr(12, 2400), HW(32, 2400));      // transformers: 32x3648
  EXPECT_EQ(sr(5, 5, 0), HW(32, 32));         // transformers: 0x0
}

TEST(SmartResize, MatchesTransformersTable) {
  const json& doc = cases_json();
  ASSERT_TRUE(doc.contains("smart_resize_table")) << "missing " << kFixtures << "/cases.json";
  int differ = 0;
  for (const json& row : doc["smart_resize_table"]) {
    const int64_t h = row["height"], w = row["width"], mn = row["min_pixels"],
                  mx = row["max_pixels"];
    auto r = smart_resize(h, w, 32, mn, mx);
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w) + " min " + std::to_string(mn) +
                 " max " + std::to_string(mx));
    if (row.contains("vlm_error")) {
      ASSERT_FALSE(r.ok());
      EXPECT_TRUE(row.contains("transformers_error"));
      EXPECT_NE(r.status().message().find("aspect ratio must be smaller than 200"),
                std::string::npos)
          << r.status().message();
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->first, row["vlm"][0].get<int64_t>());
    EXPECT_EQ(r->second, row["vlm"][1].get<int64_t>());
    const HW hf(row["transformers"][0], row["transformers"][1]);
    if (hf != *r) {
      ++differ;
      // Only images with a side <= 16 px (rounding to 0 in transformers) may differ.
      EXPECT_LE(std::min(h, w), 16);
      std::printf("  smart_resize %lldx%lld (min %lld): transformers %lldx%lld, vlm %lldx%lld\n",
                  static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(mn),
                  static_cast<long long>(hf.first), static_cast<long long>(hf.second),
                  static_cast<long long>(r->first), static_cast<long long>(r->second));
    }
  }
  EXPECT_EQ(differ, 5);  // the tiny-side rows listed in TinyImages
}

TEST(SmartResize, Errors) {
  auto aspect = smart_resize(10, 2010, 32, 65536, 16777216);
  ASSERT_FALSE(aspect.ok());
  EXPECT_EQ(aspect.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(aspect.status().message().find("aspect ratio must be smaller than 200, got 201"),
            std::string::npos)
      << aspect.status().message();
  EXPECT_TRUE(smart_resize(10, 2000, 32, 65536, 16777216).ok());  // exactly 200 is allowed
  EXPECT_FALSE(smart_resize(0, 10, 32, 65536, 16777216).ok());
  EXPECT_FALSE(smart_resize(10, -1, 32, 65536, 16777216).ok());
  EXPECT_FALSE(smart_resize(10, 10, 0, 65536, 16777216).ok());
  EXPECT_FALSE(smart_resize(10, 10, 32, -1, 16777216).ok());
  EXPECT_FALSE(smart_resize(10, 10, 32, 0, 0).ok());
  EXPECT_FALSE(smart_resize(int64_t{1} << 25, 10, 32, 0, 16777216).ok());
}

// Every stored case: smart_resize, grid and token count, resize_bicubic_antialias on the source
// against the reference pixels, and preprocess_image's pixel_values against the normalised
// reference pixels (and, where stored, against the processor's own pixel_values).
TEST(Preprocess, MatchesTransformersCases) {
  const json& doc = cases_json();
  ASSERT_TRUE(doc.contains("cases")) << "missing " << kFixtures << "/cases.json";
  ThreadPool pool(3);
  int64_t total = 0, mismatched = 0;
  int max_abs = 0;
  for (const json& c : doc["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    Image src;
    bool same_source = true;
    if (c.contains("photo")) {
      auto loaded = load_image_file(kPhotos + "/" + c["photo"].get<std::string>());
      ASSERT_TRUE(loaded.ok()) << loaded.status().message();
      src = std::move(*loaded);
      const std::string got = hex64(fnv1a64(src.rgb));
      same_source = got == c["source_fnv1a64"].get<std::string>();
      if (!same_source) {
        std::printf("  %s: decoded bytes differ from PIL's (fnv %s vs %s)\n", name.c_str(),
                    got.c_str(), c["source_fnv1a64"].get<std::string>().c_str());
      }
    } else {
      src = image_from_npy(kFixtures + "/" + c["source"].get<std::string>());
    }
    ASSERT_EQ(src.height, c["height"].get<int64_t>());
    ASSERT_EQ(src.width, c["width"].get<int64_t>());

    const PreprocessOptions opt = budget(c["min_pixels"], c["max_pixels"]);
    auto pre = preprocess_image(src, opt, &pool);
    ASSERT_TRUE(pre.ok()) << pre.status().message();
    EXPECT_EQ(pre->resized_h, c["resized"][0].get<int64_t>());
    EXPECT_EQ(pre->resized_w, c["resized"][1].get<int64_t>());
    EXPECT_EQ(pre->grid_t, c["grid_thw"][0].get<int64_t>());
    EXPECT_EQ(pre->grid_h, c["grid_thw"][1].get<int64_t>());
    EXPECT_EQ(pre->grid_w, c["grid_thw"][2].get<int64_t>());
    EXPECT_EQ(pre->num_tokens(), c["num_tokens"].get<int64_t>());
    if (c["transformers_resized"] != c["resized"]) EXPECT_LE(std::min(src.height, src.width), 16);

    const Image ref = image_from_npy(kFixtures + "/" + c["resized_npy"].get<std::string>());
    ASSERT_EQ(ref.height, pre->resized_h);
    ASSERT_EQ(ref.width, pre->resized_w);
    const Image mine = resize_bicubic_antialias(src, ref.height, ref.width);
    const Diff d = compare_u8(mine.rgb, ref.rgb);
    std::printf("  %-30s %4lldx%-4lld -> %4lldx%-4lld  %6lld/%lld pixels differ, max |diff| %d\n",
                name.c_str(), static_cast<long long>(src.height), static_cast<long long>(src.width),
                static_cast<long long>(ref.height), static_cast<long long>(ref.width),
                static_cast<long long>(d.mismatched), static_cast<long long>(d.count), d.max_abs);
    if (same_source) {
      EXPECT_EQ(d.mismatched, 0);
      total += d.count;
      mismatched += d.mismatched;
      max_abs = std::max(max_abs, d.max_abs);
    } else {
      // A decoder difference (not ours to test here) blurs through the resize; bound it loosely.
      EXPECT_LE(d.sum_abs / static_cast<double>(d.count), 0.5);
      EXPECT_LE(d.max_abs, 8);
      continue;
    }

    // pixel_values = normalised reference pixels in merge order (the merge-order closed form in
    // vision/preprocess.h), computed here independently of preprocess.cc's loop.
    const int64_t gh = pre->grid_h, gw = pre->grid_w, P = 16, T = 2, cols = 3 * T * P * P;
    ASSERT_EQ(static_cast<int64_t>(pre->pixel_values.size()), gh * gw * cols);
    int64_t bad = 0;
    for (int64_t bh = 0; bh < gh / 2; ++bh) {
      for (int64_t bw = 0; bw < gw / 2; ++bw) {
        for (int64_t ih = 0; ih < 2; ++ih) {
          for (int64_t iw = 0; iw < 2; ++iw) {
            const int64_t r = (bh * (gw / 2) + bw) * 4 + ih * 2 + iw;
            const int64_t y0 = (2 * bh + ih) * P, x0 = (2 * bw + iw) * P;
            for (int64_t ch = 0; ch < 3; ++ch) {
              for (int64_t tt = 0; tt < T; ++tt) {
                for (int64_t py = 0; py < P; ++py) {
                  for (int64_t px = 0; px < P; ++px) {
                    const int64_t k = ((ch * T + tt) * P + py) * P + px;
                    const float want =
                        (static_cast<float>(ref.at(y0 + py, x0 + px, static_cast<int>(ch))) -
                         127.5f) /
                        127.5f;
                    bad += pre->pixel_values[r * cols + k] != want;
                  }
                }
              }
            }
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);

    if (c.contains("pixel_values")) {
      auto pv = read_npy(kFixtures + "/" + c["pixel_values"].get<std::string>());
      ASSERT_TRUE(pv.ok()) << pv.status().message();
      ASSERT_EQ(pv->shape, (std::vector<int64_t>{gh * gw, cols}));
      double worst = 0;
      for (size_t i = 0; i < pv->f32.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(pv->f32[i]) - pre->pixel_values[i]));
      }
      EXPECT_LE(worst, 1e-6);
      EXPECT_EQ(pv->f32, pre->pixel_values);  // in fact bit-identical
    }
  }
  std::printf(
      "  all exact-source cases: %lld/%lld resized values differ (%.4f%% identical), max "
      "|diff| %d LSB\n",
      static_cast<long long>(mismatched), static_cast<long long>(total),
      total ? 100.0 * static_cast<double>(total - mismatched) / total : 0.0, max_abs);
  EXPECT_GT(total, 0);
}

// Large and odd sizes at the default budget, run by the processor on constant images: sizes,
// grids, and the exact float32 value per channel everywhere.
TEST(Preprocess, ConstantImagesAtDefaultBudget) {
  const json& doc = cases_json();
  ASSERT_TRUE(doc.contains("constant_cases"));
  ThreadPool pool(2);
  for (const json& c : doc["constant_cases"]) {
    const int64_t h = c["height"], w = c["width"];
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w));
    Image img;
    img.height = h;
    img.width = w;
    img.rgb.resize(static_cast<size_t>(h * w * 3));
    for (int64_t i = 0; i < h * w; ++i) {
      for (int ch = 0; ch < 3; ++ch) img.rgb[i * 3 + ch] = c["rgb"][ch].get<uint8_t>();
    }
    auto pre = preprocess_image(img, budget(c["min_pixels"], c["max_pixels"]), &pool);
    ASSERT_TRUE(pre.ok()) << pre.status().message();
    EXPECT_EQ(pre->resized_h, c["resized"][0].get<int64_t>());
    EXPECT_EQ(pre->resized_w, c["resized"][1].get<int64_t>());
    EXPECT_EQ(pre->grid_t, c["grid_thw"][0].get<int64_t>());
    EXPECT_EQ(pre->grid_h, c["grid_thw"][1].get<int64_t>());
    EXPECT_EQ(pre->grid_w, c["grid_thw"][2].get<int64_t>());
    const int64_t rows = c["pixel_values_rows"], cols = c["pixel_values_cols"];
    EXPECT_EQ(pre->grid_t * pre->grid_h * pre->grid_w, rows);
    ASSERT_EQ(static_cast<int64_t>(pre->pixel_values.size()), rows * cols);
    EXPECT_EQ(pre->num_tokens(), rows / 4);
    const float want[3] = {c["channel_values"][0].get<float>(), c["channel_values"][1].get<float>(),
                           c["channel_values"][2].get<float>()};
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k)
        bad += pre->pixel_values[r * cols + k] != want[k / (cols / 3)];
    }
    EXPECT_EQ(bad, 0);
  }
}

// Threads split rows only; the output must not depend on how many.
TEST(Resize, ThreadCountDoesNotChangeOutput) {
  const Image src = image_from_npy(kFixtures + "/src_down_120x200.npy");
  ASSERT_GT(src.width, 0);
  ThreadPool p1(1), p4(4);
  for (auto [h, w] : {HW(32, 64), HW(256, 96), HW(7, 300), HW(120, 33), HW(1, 1)}) {
    const Image a = resize_bicubic_antialias(src, h, w);
    const Image b = resize_bicubic_antialias(src, h, w, &p1);
    const Image c = resize_bicubic_antialias(src, h, w, &p4);
    EXPECT_EQ(a.rgb, b.rgb);
    EXPECT_EQ(a.rgb, c.rgb);
    EXPECT_EQ(a.height, h);
    EXPECT_EQ(a.width, w);
  }
}

// Properties of the fixed-point weights that ATen relies on (and that a refactor could break).
TEST(Resize, WeightsProperties) {
  for (auto [in, out] : {HW(2560, 96), HW(1, 256), HW(100, 160), HW(64, 64), HW(800, 128)}) {
    const ResampleWeights rw = compute_bicubic_aa_weights(in, out);
    SCOPED_TRACE(std::to_string(in) + " -> " + std::to_string(out));
    EXPECT_GE(rw.precision, 14);
    EXPECT_LE(rw.precision, 22);
    for (int64_t i = 0; i < out; ++i) {
      EXPECT_GE(rw.first[i], 0);
      EXPECT_LE(rw.first[i] + rw.count[i], in);
      int64_t sum = 0;
      for (int64_t j = 0; j < rw.taps; ++j) sum += rw.weights[i * rw.taps + j];
      // Normalised to 1, up to one rounding per tap.
      EXPECT_LE(std::abs(sum - (int64_t{1} << rw.precision)), rw.taps);
    }
  }
  // Same size: the identity (weights 1 at distance 0, 0 at distance 1 and 2).
  const Image src = image_from_npy(kFixtures + "/src_vonly_60x64.npy");
  const ResampleWeights id = compute_bicubic_aa_weights(60, 60);
  for (int64_t i = 0; i < 60; ++i) {
    for (int64_t j = 0; j < id.count[i]; ++j) {
      EXPECT_EQ(id.weights[i * id.taps + j], id.first[i] + j == i ? (1 << id.precision) : 0);
    }
  }
  EXPECT_EQ(resize_bicubic_antialias(src, 60, 64).rgb, src.rgb);
}

TEST(Preprocess, TemporalCopiesAndTokenCount) {
  const Image src = image_from_npy(kFixtures + "/src_pv_70x100.npy");
  PreprocessOptions opt = budget(1024, 16777216);
  opt.temporal_patch_size = 3;  // not Qwen3-VL's 2: the layout must follow the option
  auto pre = preprocess_image(src, opt);
  ASSERT_TRUE(pre.ok()) << pre.status().message();
  EXPECT_EQ(pre->grid_t, 1);
  EXPECT_EQ(pre->num_tokens(), (64 / 32) * (96 / 32));
  const int64_t pp = 16 * 16, cols = 3 * 3 * pp;
  ASSERT_EQ(static_cast<int64_t>(pre->pixel_values.size()), 24 * cols);
  for (int64_t r = 0; r < 24; ++r) {
    for (int64_t c = 0; c < 3; ++c) {
      const float* slot0 = &pre->pixel_values[r * cols + c * 3 * pp];
      for (int64_t tt = 1; tt < 3; ++tt) {
        EXPECT_TRUE(std::equal(slot0, slot0 + pp, slot0 + tt * pp));
      }
    }
  }
}

// patchify = false (what a GPU vision tower takes): the resized image and the normalisation
// table instead of the patches; normalising and patchifying them by the layout of preprocess.h
// (written out here) gives the patchify = true output exactly. Both the resized case and the
// already-right-size one (no resize).
TEST(Preprocess, WithoutPatchifyKeepsTheResizedImageAndItsTable) {
  const Image src = image_from_npy(kFixtures + "/src_pv_70x100.npy");
  for (int64_t min_pixels : {int64_t{1024}, int64_t{200000}}) {
    PreprocessOptions opt = budget(min_pixels, 16777216);
    opt.mean[1] = 0.4f;  // distinct channels
    opt.std[2] = 0.3f;
    auto full = preprocess_image(src, opt);
    opt.patchify = false;
    auto rgb = preprocess_image(src, opt);
    ASSERT_TRUE(full.ok() && rgb.ok());
    EXPECT_TRUE(rgb->pixel_values.empty());
    ASSERT_EQ(rgb->lut.size(), 3u * 256u);
    ASSERT_EQ(static_cast<int64_t>(rgb->resized_rgb.size()), rgb->resized_h * rgb->resized_w * 3);
    EXPECT_EQ(rgb->grid_h, full->grid_h);
    EXPECT_EQ(rgb->grid_w, full->grid_w);
    const int64_t P = 16, M = 2, T = 2, cols = 3 * T * P * P, gw = rgb->grid_w;
    std::vector<float> patches(full->pixel_values.size());
    for (int64_t r = 0; r < rgb->grid_h * gw; ++r) {
      const int64_t block = r / (M * M), in_block = r % (M * M);
      const int64_t y0 = (block / (gw / M) * M + in_block / M) * P;
      const int64_t x0 = (block % (gw / M) * M + in_block % M) * P;
      for (int64_t col = 0; col < cols; ++col) {
        const int64_t px = col % P, py = col / P % P, c = col / (P * P * T);
        const uint8_t v = rgb->resized_rgb[((y0 + py) * rgb->resized_w + x0 + px) * 3 + c];
        patches[r * cols + col] = rgb->lut[c * 256 + v];
      }
    }
    EXPECT_EQ(patches, full->pixel_values) << "min_pixels " << min_pixels;
  }
}

TEST(Preprocess, RejectsBadInput) {
  Image empty;
  EXPECT_EQ(preprocess_image(empty, {}).status().code(), StatusCode::kInvalidArgument);
  Image torn;
  torn.width = 4;
  torn.height = 4;
  torn.rgb.resize(47);
  EXPECT_EQ(preprocess_image(torn, {}).status().code(), StatusCode::kInvalidArgument);
  Image ok_img;
  ok_img.width = 40;
  ok_img.height = 40;
  ok_img.rgb.assign(40 * 40 * 3, 9);
  PreprocessOptions bad_std;
  bad_std.std[1] = 0.0f;
  EXPECT_FALSE(preprocess_image(ok_img, bad_std).ok());
  PreprocessOptions bad_patch;
  bad_patch.patch_size = 0;
  EXPECT_FALSE(preprocess_image(ok_img, bad_patch).ok());
  Image thin;
  thin.width = 2010;
  thin.height = 10;
  thin.rgb.assign(2010 * 10 * 3, 0);
  auto r = preprocess_image(thin, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("aspect ratio"), std::string::npos);
}

// The Qwen3-VL checkpoints' preprocessor_config.json (all sizes, design doc §2.1).
constexpr char kQwen3VLConfig[] = R"({
  "size": {"longest_edge": 16777216, "shortest_edge": 65536},
  "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
  "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"
})";

TEST(PreprocessorConfig, Qwen3VLCheckpoint) {
  auto o = parse_preprocessor_config(kQwen3VLConfig, "preprocessor_config.json");
  ASSERT_TRUE(o.ok()) << o.status().message();
  const PreprocessOptions d;
  EXPECT_EQ(o->min_pixels, 65536);
  EXPECT_EQ(o->max_pixels, 16777216);
  EXPECT_EQ(o->patch_size, 16);
  EXPECT_EQ(o->temporal_patch_size, 2);
  EXPECT_EQ(o->merge_size, 2);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(o->mean[c], 0.5f);
    EXPECT_EQ(o->std[c], 0.5f);
  }
  EXPECT_EQ(o->rescale_factor, d.rescale_factor);
}

TEST(PreprocessorConfig, OverridesAndVariants) {
  // Top-level min_pixels/max_pixels win over size (transformers' backward-compatible spelling).
  auto o = parse_preprocessor_config(
      R"({"size": {"shortest_edge": 3136, "longest_edge": 1003520}, "min_pixels": 4096,
          "max_pixels": 131072, "image_mean": 0.25,
          "image_std": [0.26862954, 0.26130258, 0.27577711],
          "rescale_factor": 0.00392156862745098, "do_resize": true, "resample": 3,
          "do_convert_rgb": true, "image_processor_type": "Qwen2VLImageProcessor"})",
      "cfg");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->min_pixels, 4096);
  EXPECT_EQ(o->max_pixels, 131072);
  EXPECT_EQ(o->mean[2], 0.25f);
  EXPECT_EQ(o->std[0], 0.26862954f);
  // Budgets only, no size object.
  auto b = parse_preprocessor_config(R"({"min_pixels": 1024, "max_pixels": 65536.0})", "cfg");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->min_pixels, 1024);
  EXPECT_EQ(b->max_pixels, 65536);
  // Empty object: every field keeps the Qwen3-VL default.
  auto e = parse_preprocessor_config("{}", "cfg");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->max_pixels, 16777216);
}

TEST(PreprocessorConfig, Errors) {
  struct Bad {
    const char* json;
    const char* needle;
  };
  const Bad bad[] = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"size": {"height": 448, "width": 448}})", "shortest_edge"},
      {R"({"size": 65536})", "'size' must be an object"},
      {R"({"patch_size": "16"})", "'patch_size' must be an integer"},
      {R"({"patch_size": 16.5})", "'patch_size' must be an integer"},
      {R"({"merge_size": 0})", "merge_size"},
      {R"({"image_mean": [0.5, 0.5]})", "list of 3 numbers"},
      {R"({"image_std": [0.5, 0.0, 0.5]})", "image_std non-zero"},
      {R"({"size": {"shortest_edge": 65536, "longest_edge": 0}})", "max_pixels"},
      {R"({"do_normalize": false})", "do_normalize"},
      {R"({"do_rescale": "yes"})", "boolean"},
      {R"({"resample": 2})", "resample"},
      {R"({"image_processor_type": "CLIPImageProcessor"})", "CLIPImageProcessor"},
  };
  for (const Bad& b : bad) {
    auto r = parse_preprocessor_config(b.json, "my/preprocessor_config.json");
    ASSERT_FALSE(r.ok()) << b.json;
    EXPECT_NE(r.status().message().find(b.needle), std::string::npos)
        << b.json << " -> " << r.status().message();
    EXPECT_EQ(r.status().message().rfind("my/preprocessor_config.json", 0), 0u)
        << r.status().message();
  }
}

// Not a benchmark gate: prints how long the big test photo takes. At the default budget the
// 2560x1600 photo is already aligned (no resize), so a downscaling budget is timed as well.
TEST(Preprocess, TimingBigPhoto) {
  auto img = load_image_file(kPhotos + "/retina_2560x1600.jpg");
  ASSERT_TRUE(img.ok()) << img.status().message();
  ThreadPool pool(0);
  struct Run {
    const char* what;
    PreprocessOptions opt;
    ThreadPool* pool;
  };
  const Run runs[] = {
      {"default budget, 1 thread", PreprocessOptions{}, nullptr},
      {"default budget, pool", PreprocessOptions{}, &pool},
      {"max 1024 tokens, 1 thread", budget(65536, 1024 * 32 * 32), nullptr},
      {"max 1024 tokens, pool", budget(65536, 1024 * 32 * 32), &pool},
  };
  for (const Run& run : runs) {
    double best = 1e30;
    int64_t tokens = 0, rh = 0, rw = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      auto pre = preprocess_image(*img, run.opt, run.pool);
      const auto t1 = std::chrono::steady_clock::now();
      ASSERT_TRUE(pre.ok()) << pre.status().message();
      tokens = pre->num_tokens();
      rh = pre->resized_h;
      rw = pre->resized_w;
      best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::printf("  retina 2560x1600 -> %lldx%lld (%lld tokens), %s (%d threads): %.1f ms\n",
                static_cast<long long>(rw), static_cast<long long>(rh),
                static_cast<long long>(tokens), run.what, run.pool ? run.pool->n_threads() : 1,
                best);
  }
}

// video_preprocessor_config.json: the published Qwen3-VL file, the class defaults for what it
// leaves out, and the settings the engine refuses.
TEST(VideoPreprocessorConfig, ReadsTheCheckpointFileAndRefusesWhatIsNotImplemented) {
  const VideoPreprocessConfig defaults = default_video_config(PreprocessOptions{});
  EXPECT_EQ(defaults.pixels.min_pixels, 128 * 32 * 32);
  EXPECT_EQ(defaults.pixels.max_pixels, 768 * 32 * 32);
  const std::string published = R"({
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor"})";
  auto v = parse_video_preprocessor_config(published, "v.json", defaults);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->pixels.min_pixels, 4096);
  EXPECT_EQ(v->pixels.max_pixels, 25165824);
  EXPECT_EQ(v->fps, 2);
  EXPECT_EQ(v->min_frames, 4);
  EXPECT_EQ(v->max_frames, 768);
  auto tuned = parse_video_preprocessor_config(R"({"fps": 1.5, "min_frames": 2, "max_frames": 64})",
                                               "v.json", defaults);
  ASSERT_TRUE(tuned.ok()) << tuned.status().message();
  EXPECT_EQ(tuned->fps, 1.5);
  EXPECT_EQ(tuned->min_frames, 2);
  EXPECT_EQ(tuned->max_frames, 64);
  EXPECT_EQ(tuned->pixels.max_pixels, defaults.pixels.max_pixels);
  for (const char* bad :
       {R"({"merge_size": 2, "temporal_patch_size": 3})", R"({"num_frames": 16})", R"({"fps": 0})",
        R"({"do_sample_frames": false})", R"({"min_frames": 9, "max_frames": 8})",
        R"({"video_processor_type": "Qwen2VLVideoProcessor"})", R"({"size": {"longest_edge": 5}})",
        "[1]", "{"}) {
    auto r = parse_video_preprocessor_config(bad, "v.json", defaults);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().message().rfind("v.json", 0), 0u) << r.status().message();
  }
}

}  // namespace
}  // namespace vlm
