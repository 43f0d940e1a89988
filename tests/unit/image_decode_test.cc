// Image decoding: every fixture and test photo must decode to exactly the RGB bytes PIL's
// Image.open(f).convert("RGB") gives (goldens in fixtures/images/expected.json, written by
// scripts/make_image_fixtures.py), and every bad input must fail with a message that says what
// is wrong -- never a crash (this binary is also run under AddressSanitizer).
#include "vision/image_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace vlm {
namespace {

using nlohmann::json;

// VLM_FIXTURES_DIR is tests/model/fixtures; the image fixtures sit beside it under unit/.
const std::string kFixtureDir = std::string(VLM_FIXTURES_DIR) + "/../../unit/fixtures/images";
const std::string kPhotoDir = std::string(VLM_TESTDATA_DIR) + "/images";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::string s = test_util::read_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

const json& expected() {
  static const json doc = [] {
    std::ifstream f(kFixtureDir + "/expected.json");
    return f ? json::parse(f, nullptr, /*allow_exceptions=*/false) : json();
  }();
  return doc;
}

std::vector<std::string> names_in(const char* section) {
  std::vector<std::string> names;
  const json& doc = expected();
  if (doc.is_object() && doc.contains(section)) {
    for (const auto& [name, _] : doc[section].items()) names.push_back(name);
  }
  return names;
}

// The two checksums the script records: sum of bytes, and sum of byte[i] * (i % 251 + 1).
struct Checksums {
  int64_t sum = 0;
  int64_t wsum = 0;
};

Checksums checksums(const Image& img) {
  Checksums c;
  for (size_t i = 0; i < img.rgb.size(); ++i) {
    c.sum += img.rgb[i];
    c.wsum += int64_t{img.rgb[i]} * static_cast<int64_t>(i % 251 + 1);
  }
  return c;
}

void expect_matches_pil(const Image& img, const json& want) {
  ASSERT_EQ(img.width, want["width"].get<int64_t>());
  ASSERT_EQ(img.height, want["height"].get<int64_t>());
  ASSERT_EQ(img.rgb.size(), static_cast<size_t>(img.width * img.height * 3));
  const int tol = want.value("tolerance", 0);
  const Checksums got = checksums(img);
  const auto n = static_cast<int64_t>(img.rgb.size());
  // With a per-byte tolerance t the sums can move by at most t per byte (x251 for wsum).
  EXPECT_LE(std::llabs(got.sum - want["sum"].get<int64_t>()), tol * n);
  EXPECT_LE(std::llabs(got.wsum - want["wsum"].get<int64_t>()), tol * n * 251);
  for (const json& s : want["samples"]) {
    const int64_t x = s[0], y = s[1];
    for (int c = 0; c < 3; ++c) {
      EXPECT_LE(std::abs(int{img.at(y, x, c)} - s[2 + c].get<int>()), tol)
          << "pixel (" << x << ", " << y << ") channel " << c;
    }
  }
}

TEST(ImageDecode, GoldensArePresent) {
  ASSERT_TRUE(expected().is_object()) << "cannot read " << kFixtureDir << "/expected.json";
  EXPECT_GE(names_in("fixtures").size(), 30u);
  EXPECT_EQ(names_in("photos").size(), 8u);  // every photo in tests/data/images
}

class FixtureTest : public testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, MatchesPil) {
  const json& want = expected()["fixtures"][GetParam()];
  const std::string path = kFixtureDir + "/" + GetParam();
  Result<Image> img = load_image_file(path);
  if (want.contains("expect_error")) {
    ASSERT_FALSE(img.ok()) << "decoder accepted a file it must refuse";
    EXPECT_EQ(img.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(img.status().message().find(want["expect_error"].get<std::string>()),
              std::string::npos)
        << img.status().message();
    EXPECT_NE(img.status().message().find(path), std::string::npos) << img.status().message();
    return;
  }
  ASSERT_TRUE(img.ok()) << img.status().message();
  expect_matches_pil(*img, want);
}

class PhotoTest : public testing::TestWithParam<std::string> {};

TEST_P(PhotoTest, MatchesPil) {
  // Includes the greyscale PNG whose iCCP libpng calls "known incorrect sRGB profile" and the
  // 2560x1600 progressive 4:2:2 JPEG.
  Result<Image> img = load_image_file(kPhotoDir + "/" + GetParam());
  ASSERT_TRUE(img.ok()) << img.status().message();
  expect_matches_pil(*img, expected()["photos"][GetParam()]);
}

std::string param_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest, testing::ValuesIn(names_in("fixtures")),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Photos, PhotoTest, testing::ValuesIn(names_in("photos")), param_name);

TEST(ImageDecode, FromMemoryEqualsFromFile) {
  const std::string path = kPhotoDir + "/rocket_falcon9.jpg";
  std::vector<uint8_t> bytes = read_bytes(path);
  Result<Image> a = decode_image(bytes.data(), bytes.size());
  Result<Image> b = load_image_file(path);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rgb, b->rgb);
}

TEST(ImageDecode, FormatNames) {
  EXPECT_STREQ(image_format_name(ImageFormat::kJpeg), "JPEG");
  EXPECT_STREQ(image_format_name(ImageFormat::kPng), "PNG");
  EXPECT_STREQ(image_format_name(ImageFormat::kWebp), "WebP");
  EXPECT_STREQ(image_format_name(ImageFormat::kGif), "GIF");
  EXPECT_STREQ(image_format_name(ImageFormat::kBmp), "BMP");
}

// ---- bad inputs --------------------------------------------------------------------------------

void expect_error(const Result<Image>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(ImageDecodeErrors, EmptyInput) {
  expect_error(decode_image(nullptr, 0), "empty");
  const uint8_t byte = 0;
  expect_error(decode_image(&byte, 0), "empty");
  EXPECT_EQ(decode_image(&byte, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(ImageDecodeErrors, RandomBytes) {
  const uint8_t junk[3] = {0x13, 0x37, 0xC0};
  Result<Image> r = decode_image(junk, sizeof(junk));
  expect_error(r, "unrecognised image format");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  // The message never quotes the input (a server must not echo a file's contents).
  for (const char* leak : {"13", "37", "c0", "C0"}) {
    EXPECT_EQ(r.status().message().find(leak), std::string::npos) << r.status().message();
  }
  // Magic bytes alone are not an image.
  const uint8_t jpeg_magic[3] = {0xFF, 0xD8, 0xFF};
  expect_error(decode_image(jpeg_magic, 3), "JPEG");
  const uint8_t bm[2] = {'B', 'M'};
  expect_error(decode_image(bm, 2), "BMP");
}

TEST(ImageDecodeErrors, TextFileNamesPath) {
  test_util::TempDir dir;
  const std::string path = dir.file("notes.png");  // the extension must not fool the sniffer
  std::ofstream(path) << "This is a text file, not an image.\n";
  Result<Image> r = load_image_file(path);
  expect_error(r, "unrecognised image format");
  expect_error(r, path);
}

TEST(ImageDecodeErrors, MissingFileNamesPath) {
  const std::string path = "/nonexistent-dir/no_such_image.jpg";
  Result<Image> r = load_image_file(path);
  expect_error(r, path);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  test_util::TempDir dir;
  expect_error(load_image_file(dir.str()), "not a regular file");
}

TEST(ImageDecodeErrors, TruncatedSharedImages) {
  for (const char* name : {"cat_chelsea.png", "cat_chelsea.webp", "astronaut_eileen_collins.png",
                           "rocket_falcon9.jpg", "document_scan_page.png", "retina_2560x1600.jpg",
                           "coffee_cup.png", "document_screenshot.png"}) {
    std::vector<uint8_t> bytes = read_bytes(kPhotoDir + "/" + name);
    ASSERT_GT(bytes.size(), 1000u) << name;
    const std::string format = std::string(name).ends_with(".png")    ? "PNG"
                               : std::string(name).ends_with(".webp") ? "WebP"
                                                                      : "JPEG";
    for (size_t keep : {bytes.size() / 2, size_t{10}}) {
      SCOPED_TRACE(std::string(name) + " cut to " + std::to_string(keep) + " bytes");
      Result<Image> r = decode_image(bytes.data(), keep);
      expect_error(r, format + ": ");
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(ImageDecodeErrors, TruncatedFixturesOfEveryFormat) {
  for (const std::string& name : names_in("fixtures")) {
    if (expected()["fixtures"][name].contains("expect_error")) continue;
    std::vector<uint8_t> bytes = read_bytes(kFixtureDir + "/" + name);
    for (size_t keep : {bytes.size() / 2, size_t{10}}) {
      SCOPED_TRACE(name + " cut to " + std::to_string(keep) + " bytes");
      EXPECT_FALSE(decode_image(bytes.data(), keep).ok());
    }
  }
}

// ---- decompression bombs: the header alone must be refused ----------------------------------

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

// A PNG signature and a valid IHDR (correct CRC) claiming width x height RGB, then nothing.
std::vector<uint8_t> png_header_only(uint32_t width, uint32_t height) {
  std::vector<uint8_t> v = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  put_be32(v, 13);
  const size_t type_at = v.size();
  for (char c : std::string("IHDR")) v.push_back(static_cast<uint8_t>(c));
  put_be32(v, width);
  put_be32(v, height);
  for (uint8_t b : {8, 2, 0, 0, 0}) v.push_back(b);  // 8-bit RGB, deflate, no filter, no interlace
  put_be32(v, crc32(v.data() + type_at, v.size() - type_at));
  return v;
}

TEST(ImageDecodeBombs, PngHeaderClaims65000Squared) {
  std::vector<uint8_t> png = png_header_only(65000, 65000);
  Result<Image> r = decode_image(png.data(), png.size());
  expect_error(r, "PNG: image size 65000x65000 exceeds the limit");
  // Sides within max_side, area over max_pixels.
  png = png_header_only(30000, 30000);
  expect_error(decode_image(png.data(), png.size()), "PNG: image size 30000x30000");
  expect_error(decode_image(png.data(), png.size()), "exceeds the limit of 50000000 pixels");
}

// Offset of the SOFn marker (FF C0..C2) in a JPEG, found by walking the marker segments.
size_t find_sof(const std::vector<uint8_t>& j) {
  size_t i = 2;
  while (i + 4 <= j.size() && j[i] == 0xFF) {
    const uint8_t m = j[i + 1];
    if (m >= 0xC0 && m <= 0xC2) return i;
    i += 2 + (size_t{j[i + 2]} << 8 | j[i + 3]);
  }
  return 0;
}

TEST(ImageDecodeBombs, JpegHeaderClaims65000Squared) {
  std::vector<uint8_t> jpeg = read_bytes(kFixtureDir + "/jpeg_baseline_420.jpg");
  const size_t sof = find_sof(jpeg);
  ASSERT_GT(sof, 0u);
  // SOF: FF C0, length (2), precision (1), height (2), width (2).
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = 65000 >> 8;
    jpeg[at + 1] = 65000 & 0xFF;
  }
  Result<Image> r = decode_image(jpeg.data(), jpeg.size());
  expect_error(r, "JPEG: image size 65000x65000 exceeds the limit");
}

TEST(ImageDecodeBombs, OtherFormatHeaders) {
  // GIF logical screen 65000 x 65000.
  std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a', 0xE8, 0xFD, 0xE8, 0xFD, 0, 0, 0, ';'};
  expect_error(decode_image(gif.data(), gif.size()), "GIF: image size 65000x65000 exceeds");
  // BMP: patch a real file's width and height.
  std::vector<uint8_t> bmp = read_bytes(kFixtureDir + "/bmp_24.bmp");
  ASSERT_GT(bmp.size(), 26u);
  for (size_t at : {size_t{18}, size_t{22}}) {
    bmp[at] = 0xE8, bmp[at + 1] = 0xFD, bmp[at + 2] = 0, bmp[at + 3] = 0;
  }
  expect_error(decode_image(bmp.data(), bmp.size()), "BMP: image size 65000x65000 exceeds");
  // WebP lossless header at the format's maximum, 16384 x 16384 (268 MP).
  std::vector<uint8_t> webp = {'R', 'I', 'F', 'F', 26,  0,  0, 0, 'W', 'E', 'B',
                               'P', 'V', 'P', '8', 'L', 14, 0, 0, 0,   0x2F};
  const uint32_t bits = 16383u | (16383u << 14);  // (width - 1) | (height - 1) << 14, no alpha
  for (int s = 0; s < 32; s += 8) webp.push_back(static_cast<uint8_t>(bits >> s));
  webp.resize(webp.size() + 9, 0);
  expect_error(decode_image(webp.data(), webp.size()),
               "WebP: image size 16384x16384 (268435456 pixels) exceeds");
}

TEST(ImageDecodeBombs, CustomLimits) {
  std::vector<uint8_t> bytes = read_bytes(kFixtureDir + "/png_rgb.png");  // 37 x 23
  ImageDecodeLimits limits;
  limits.max_side = 36;
  expect_error(decode_image(bytes.data(), bytes.size(), limits), "exceeds the limit of 36");
  limits = {};
  limits.max_pixels = 37 * 23 - 1;
  expect_error(decode_image(bytes.data(), bytes.size(), limits), "exceeds the limit of 850");
  limits = {};
  limits.max_bytes = 100;
  expect_error(decode_image(bytes.data(), bytes.size(), limits), "more than the limit of 100");
  expect_error(load_image_file(kFixtureDir + "/png_rgb.png", limits), "more than the limit");
  limits = {};
  limits.max_pixels = 37 * 23;  // exactly at the limit is fine
  EXPECT_TRUE(decode_image(bytes.data(), bytes.size(), limits).ok());
}

// ---- corrupt data -------------------------------------------------------------------------------

// Offset of the first IDAT chunk's data.
size_t find_idat(const std::vector<uint8_t>& png) {
  for (size_t i = 8; i + 8 <= png.size();) {
    const uint32_t len = uint32_t{png[i]} << 24 | png[i + 1] << 16 | png[i + 2] << 8 | png[i + 3];
    if (std::memcmp(&png[i + 4], "IDAT", 4) == 0) return i + 8;
    i += 12 + len;
  }
  return 0;
}

TEST(ImageDecodeErrors, CorruptPngMiddle) {
  const std::vector<uint8_t> good = read_bytes(kPhotoDir + "/cat_chelsea.png");
  const size_t idat = find_idat(good);
  ASSERT_GT(idat, 0u);
  const uint32_t idat_len =
      uint32_t{good[idat - 8]} << 24 | good[idat - 7] << 16 | good[idat - 6] << 8 | good[idat - 5];
  ASSERT_GT(idat_len, 1000u);

  // A flipped byte inside IDAT: the chunk CRC no longer matches.
  std::vector<uint8_t> bad = good;
  bad[idat + idat_len / 2] ^= 0x55;
  expect_error(decode_image(bad.data(), bad.size()), "PNG: ");

  // Garbage deflate data with a CRC that matches it: zlib itself must object.
  bad = good;
  for (size_t i = 2; i < 64; ++i) bad[idat + i] = static_cast<uint8_t>(0xFF - i);
  const uint32_t crc = crc32(&bad[idat - 4], idat_len + 4);
  for (int k = 0; k < 4; ++k) bad[idat + idat_len + k] = static_cast<uint8_t>(crc >> (24 - 8 * k));
  expect_error(decode_image(bad.data(), bad.size()), "PNG: ");
}

// Deterministic mutation fuzzing over every fixture: flips, zeroed runs and cuts. Most mutants
// fail, some decode; what matters is that none crashes, hangs or (under ASan) reads out of bounds.
TEST(ImageDecodeErrors, MutatedFixturesNeverCrash) {
  std::mt19937 rng(1234);
  int decoded = 0, refused = 0;
  for (const std::string& name : names_in("fixtures")) {
    const std::vector<uint8_t> good = read_bytes(kFixtureDir + "/" + name);
    ASSERT_FALSE(good.empty()) << name;
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<uint8_t> bytes = good;
      const size_t at = rng() % bytes.size();
      switch (trial % 3) {
        case 0:
          bytes[at] ^= static_cast<uint8_t>(1 + rng() % 255);
          break;
        case 1:
          for (size_t i = at; i < bytes.size() && i < at + 8; ++i) bytes[i] = 0;
          break;
        case 2:
          bytes.resize(std::max<size_t>(at, 1));
          break;
      }
      Result<Image> r = decode_image(bytes.data(), bytes.size());
      if (r.ok()) {
        ++decoded;
        EXPECT_EQ(r->rgb.size(), static_cast<size_t>(r->width * r->height * 3));
      } else {
        ++refused;
        EXPECT_FALSE(r.status().message().empty());
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(decoded, 0);
}

}  // namespace
}  // namespace vlm
