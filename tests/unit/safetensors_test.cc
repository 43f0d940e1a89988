// Safetensors reader/writer and WeightStore: round trips, and one test per way a file can lie.
// Every error test checks that the message names the file (and the tensor where there is one),
// because that is what a user needs to fix a broken checkpoint.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "test_util.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;

using ::vlm::test_util::TempDir;

using ::vlm::test_util::read_file;
using ::vlm::test_util::write_bytes;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A raw safetensors image: length prefix, header (space-padded to 8 unless told not to), data.
std::string raw_file(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

// Asserts `s` is an error whose message contains every one of `parts`.
void expect_error(const Status& s, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(s.ok()) << "expected an error mentioning " << *parts.begin();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos)
        << "message '" << s.message() << "' should mention '" << p << "'";
  }
}

template <typename T>
void expect_error(const Result<T>& r, std::initializer_list<std::string> parts) {
  expect_error(r.status(), parts);
}

// Writes `raw` to <dir>/name and returns the open result.
Result<SafetensorsFile> open_raw(const TempDir& dir, const std::string& raw,
                                 const std::string& name = "bad.safetensors") {
  write_bytes(dir.file(name), raw);
  return SafetensorsFile::open(dir.file(name));
}

TensorView view(DType t, std::vector<int64_t> shape, const void* data) {
  TensorView v;
  v.dtype = t;
  v.shape = std::move(shape);
  v.data = data;
  return v;
}

// ------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripF32Bf16F16) {
  TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};  // [2, 3]
  std::vector<uint16_t> bf16(8);                                            // [2, 2, 2]
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(0.5f * i - 1.0f);
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7c00};  // [4]: 1, -2, tiny, inf
  const uint8_t flags[3] = {1, 0, 1};                                  // [3], odd byte count
  const int64_t ids[2] = {-5, 151643};                                 // [2]
  const float scalar = 42.0f;                                          // []

  const std::string path = dir.file("model.safetensors");
  ASSERT_TRUE(write_safetensors(path,
                                {{"w.f32", view(DType::kF32, {2, 3}, f32.data())},
                                 {"w.bf16", view(DType::kBF16, {2, 2, 2}, bf16.data())},
                                 {"w.f16", view(DType::kF16, {4}, f16.data())},
                                 {"flags", view(DType::kBool, {3}, flags)},
                                 {"ids", view(DType::kI64, {2}, ids)},
                                 {"scalar", view(DType::kF32, {}, &scalar)},
                                 {"empty", view(DType::kF32, {0, 4}, nullptr)}},
                                {{"format", "pt"}})
                  .ok());
  // The data section starts 8-byte aligned, as the reference writer pads it.
  const std::string bytes = read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->num_tensors(), 7u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->names(), (std::vector<std::string>{"empty", "flags", "ids", "scalar", "w.bf16",
                                                  "w.f16", "w.f32"}));

  auto a = f->get("w.f32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(a->data, f32.data(), 24), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);

  auto b = f->get("w.bf16");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 2, 2}));
  const auto* bp = static_cast<const uint16_t*>(b->data);
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_FLOAT_EQ(bf16_to_f32(bp[i]), 0.5f * i - 1.0f);

  auto h = f->get("w.f16");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->dtype, DType::kF16);
  EXPECT_EQ(std::memcmp(h->data, f16.data(), 8), 0);

  auto fl = f->get("flags");
  ASSERT_TRUE(fl.ok());
  EXPECT_EQ(fl->dtype, DType::kBool);
  EXPECT_EQ(std::memcmp(fl->data, flags, 3), 0);

  auto i = f->get("ids");
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(i->data) % 8, 0u);
  EXPECT_EQ(static_cast<const int64_t*>(i->data)[1], 151643);

  auto s = f->get("scalar");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(*static_cast<const float*>(s->data), 42.0f);

  auto e = f->get("empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(e->nbytes(), 0u);
}

TEST(Safetensors, ViewsSurviveMove) {
  TempDir dir;
  const float v[2] = {3.0f, 4.0f};
  ASSERT_TRUE(
      write_safetensors(dir.file("a.safetensors"), {{"x", view(DType::kF32, {2}, v)}}).ok());
  auto f = SafetensorsFile::open(dir.file("a.safetensors"));
  ASSERT_TRUE(f.ok());
  const void* before = f->get("x")->data;
  SafetensorsFile moved = std::move(f).value();
  EXPECT_EQ(moved.get("x")->data, before);
  EXPECT_EQ(static_cast<const float*>(before)[1], 4.0f);
}

TEST(WeightStore, SingleFile) {
  TempDir dir;
  const float w[6] = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"),
                                {{"layer.weight", view(DType::kF32, {2, 3}, w)}})
                  .ok());
  auto store = WeightStore::open_dir(dir.str());
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_TRUE(store->has("layer.weight"));
  EXPECT_FALSE(store->has("nope"));
  EXPECT_EQ(store->names(), std::vector<std::string>{"layer.weight"});
  EXPECT_EQ(store->file_of("layer.weight"), dir.file("model.safetensors"));
  EXPECT_EQ(store->file_of("nope"), "");
  auto t = store->get("layer.weight", {2, 3}, {DType::kBF16, DType::kF32});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(static_cast<const float*>(t->data)[5], 6.0f);
  // An empty allowed list accepts any dtype.
  EXPECT_TRUE(store->get("layer.weight", {2, 3}, {}).ok());
}

TEST(WeightStore, ReleasedPagesStayReadableAndOtherMemoryIsLeftAlone) {
  TempDir dir;
  std::vector<float> w(5 * 4096 + 3);  // several pages, not page-aligned at either end
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 1000) + 0.5f;
  const int64_t n = static_cast<int64_t>(w.size());
  ASSERT_TRUE(
      write_safetensors(dir.file("model.safetensors"), {{"w", view(DType::kF32, {n}, w.data())}})
          .ok());
  auto store = WeightStore::open_dir(dir.str());
  ASSERT_TRUE(store.ok());
  auto t = store->get("w");
  ASSERT_TRUE(t.ok());
  const float* p = static_cast<const float*>(t->data);
  ASSERT_EQ(std::memcmp(p, w.data(), w.size() * 4), 0);  // resident now
  store->release_pages(*t);
  EXPECT_EQ(std::memcmp(p, w.data(), w.size() * 4), 0);  // faulted back in from the file
  // Heap memory is not the store's: releasing it must not drop (zero) anything.
  std::vector<float> heap = w;
  store->release_pages(view(DType::kF32, {static_cast<int64_t>(heap.size())}, heap.data()));
  EXPECT_EQ(heap, w);
}

// Two shards plus an index, as transformers writes a sharded checkpoint.
void write_sharded(const TempDir& dir, const float* a, const uint16_t* b, const float* c) {
  ASSERT_TRUE(
      write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                        {{"a", view(DType::kF32, {2}, a)}, {"b", view(DType::kBF16, {3}, b)}})
          .ok());
  ASSERT_TRUE(write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                                {{"c", view(DType::kF32, {1, 2}, c)}})
                  .ok());
}

const char* kIndex = R"({"metadata": {"total_size": 24}, "weight_map": {
  "a": "model-00001-of-00002.safetensors",
  "b": "model-00001-of-00002.safetensors",
  "c": "model-00002-of-00002.safetensors"}})";

TEST(WeightStore, ShardedIndex) {
  TempDir dir;
  const float a[2] = {1, 2}, c[2] = {5, 6};
  const uint16_t b[3] = {f32_to_bf16(1.0f), f32_to_bf16(2.0f), f32_to_bf16(3.0f)};
  write_sharded(dir, a, b, c);
  write_bytes(dir.file("model.safetensors.index.json"), kIndex);

  auto store = WeightStore::open_dir(dir.str());
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(store->files().size(), 2u);
  EXPECT_EQ(store->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(store->file_of("b"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(store->file_of("c"), dir.file("model-00002-of-00002.safetensors"));
  auto tb = store->get("b", {3}, {DType::kBF16});
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(bf16_to_f32(static_cast<const uint16_t*>(tb->data)[2]), 3.0f);
  auto tc = store->get("c", {1, 2}, {DType::kF32});
  ASSERT_TRUE(tc.ok());
  EXPECT_EQ(static_cast<const float*>(tc->data)[1], 6.0f);

  // Moving the store keeps the maps (and so the views) alive.
  WeightStore moved = std::move(store).value();
  EXPECT_EQ(static_cast<const float*>(tc->data)[0], 5.0f);
  EXPECT_TRUE(moved.has("a"));
}

// ------------------------------------------------------------------------------------------
// File-level errors

TEST(SafetensorsError, MissingFile) {
  TempDir dir;
  auto f = SafetensorsFile::open(dir.file("absent.safetensors"));
  expect_error(f, {"absent.safetensors", "No such file"});
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsError, Directory) {
  TempDir dir;
  expect_error(SafetensorsFile::open(dir.str()), {dir.str(), "not a regular file"});
}

TEST(SafetensorsError, EmptyFile) {
  TempDir dir;
  expect_error(open_raw(dir, ""), {"bad.safetensors", "0 bytes"});
}

TEST(SafetensorsError, ShorterThanLengthPrefix) {
  TempDir dir;
  expect_error(open_raw(dir, std::string("\x10\0\0\0\0", 5)), {"bad.safetensors", "5 bytes"});
}

TEST(SafetensorsError, HeaderLengthLargerThanFile) {
  TempDir dir;
  expect_error(open_raw(dir, le64(1000) + "{}"), {"bad.safetensors", "header length 1000"});
}

TEST(SafetensorsError, HeaderLengthAbsurd) {
  TempDir dir;
  expect_error(open_raw(dir, le64(~uint64_t{0}) + "{}"), {"bad.safetensors", "limit"});
  expect_error(open_raw(dir, le64(200u * 1000 * 1000) + "{}"), {"bad.safetensors", "limit"});
}

TEST(SafetensorsError, TruncatedData) {
  TempDir dir;
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  const std::string path = dir.file("cut.safetensors");
  ASSERT_TRUE(
      write_safetensors(path, {{"a", view(DType::kF32, {4}, a)}, {"b", view(DType::kF32, {4}, b)}})
          .ok());
  std::string bytes = read_file(path);
  bytes.resize(bytes.size() - 6);  // cut in the middle of "b", the last tensor
  expect_error(open_raw(dir, bytes, "cut.safetensors"),
               {"cut.safetensors", "tensor 'b'", "beyond", "truncated"});
}

TEST(SafetensorsError, EveryTruncationFails) {
  // Shows that no prefix of a valid file is accepted or read past (run under ASan for the latter).
  TempDir dir;
  const float a[3] = {1, 2, 3};
  const uint16_t b[2] = {1, 2};
  const std::string path = dir.file("full.safetensors");
  ASSERT_TRUE(
      write_safetensors(path, {{"a", view(DType::kF32, {3}, a)}, {"b", view(DType::kBF16, {2}, b)}})
          .ok());
  const std::string bytes = read_file(path);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = open_raw(dir, bytes.substr(0, n), "prefix.safetensors");
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes accepted";
    if (!f.ok()) EXPECT_NE(f.status().message().find("prefix.safetensors"), std::string::npos);
  }
}

TEST(SafetensorsError, ByteMutationsNeverCrash) {
  // Every single-byte corruption of a small valid file either loads with in-bounds views or fails
  // with a message naming the file. Meaningful mostly under AddressSanitizer.
  TempDir dir;
  const float a[3] = {1, 2, 3};
  const uint16_t b[2] = {1, 2};
  const std::string path = dir.file("full.safetensors");
  ASSERT_TRUE(
      write_safetensors(path, {{"a", view(DType::kF32, {3}, a)}, {"b", view(DType::kBF16, {2}, b)}})
          .ok());
  const std::string bytes = read_file(path);
  const char kValues[] = {'\0', '\xff', '9', '"', '-', '[', '{', ' ', '1', 'e'};
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    for (char v : kValues) {
      std::string mutated = bytes;
      mutated[pos] = v;
      auto f = open_raw(dir, mutated, "mut.safetensors");
      if (!f.ok()) {
        EXPECT_NE(f.status().message().find("mut.safetensors"), std::string::npos);
        continue;
      }
      // ASan does not poison the tail of an mmap'd page, so also check the views' extent: all
      // tensors together must fit in the bytes after the 8-byte length prefix.
      uintptr_t lo = UINTPTR_MAX, hi = 0;
      for (const std::string& name : f->names()) {
        auto t = f->get(name);
        ASSERT_TRUE(t.ok());
        const auto* p = static_cast<const uint8_t*>(t->data);
        volatile unsigned sum = 0;  // read every byte: a view past the mapping faults here
        for (size_t k = 0; k < t->nbytes(); ++k) sum = sum + p[k];
        lo = std::min(lo, reinterpret_cast<uintptr_t>(p));
        hi = std::max(hi, reinterpret_cast<uintptr_t>(p) + t->nbytes());
      }
      if (hi > lo) EXPECT_LE(hi - lo, mutated.size() - 8);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Header-level errors

TEST(SafetensorsError, InvalidJson) {
  TempDir dir;
  expect_error(open_raw(dir, raw_file(R"({"a": {"dtype": )", "")),
               {"bad.safetensors", "invalid JSON"});
  expect_error(open_raw(dir, raw_file("\xff\xfe garbage", "")), {"bad.safetensors", "JSON"});
}

TEST(SafetensorsError, HeaderNotObject) {
  TempDir dir;
  expect_error(open_raw(dir, raw_file("[1, 2, 3]", "")), {"bad.safetensors", "not a JSON object"});
}

TEST(SafetensorsError, DeepNesting) {
  TempDir dir;
  expect_error(open_raw(dir, raw_file(std::string(10000, '['), "")),
               {"bad.safetensors", "nests deeper"});
}

TEST(SafetensorsError, UnknownDtype) {
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"w": {"dtype": "F8_E5M2", "shape": [2],
                                   "data_offsets": [0, 2]}})",
                                  "ab"));
  expect_error(f, {"bad.safetensors", "tensor 'w'", "F8_E5M2"});
}

// FP8 E4M3 (Qwen's FP8 checkpoints, compressed-tensors' float-quantized ones): one byte each.
TEST(Safetensors, ReadsE4m3Tensors) {
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"w": {"dtype": "F8_E4M3", "shape": [2],
                                   "data_offsets": [0, 2]}})",
                                  "ab"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto w = f->get("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->dtype, DType::kF8E4M3);
  EXPECT_EQ(w->nbytes(), 2u);
  EXPECT_EQ(static_cast<const char*>(w->data)[1], 'b');
}

TEST(SafetensorsError, EndBeyondData) {
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [4],
                                   "data_offsets": [0, 16]}})",
                                  std::string(8, '\0')));
  expect_error(f, {"bad.safetensors", "tensor 'w'", "beyond"});
}

TEST(SafetensorsError, BeginAfterEnd) {
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [1],
                                   "data_offsets": [8, 4]}})",
                                  std::string(8, '\0')));
  expect_error(f, {"bad.safetensors", "tensor 'w'", "begin > end"});
}

TEST(SafetensorsError, SizeNotNumelTimesDtype) {
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"w": {"dtype": "BF16", "shape": [2, 3],
                                   "data_offsets": [0, 8]}})",
                                  std::string(8, '\0')));
  expect_error(f, {"bad.safetensors", "tensor 'w'", "needs 12"});
}

TEST(SafetensorsError, ShapeOverflow) {
  // 2^32 * 2^32 * 4 bytes wraps to 0 in 64 bits; it must not match the empty range [0, 0].
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                                   "data_offsets": [0, 0]}})",
                                  ""));
  expect_error(f, {"bad.safetensors", "tensor 'w'", "overflow"});
}

TEST(SafetensorsError, BadShapeEntries) {
  TempDir dir;
  const std::string data(4, '\0');
  expect_error(open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [-1],
                                       "data_offsets": [0, 4]}})",
                                      data)),
               {"bad.safetensors", "tensor 'w'", "non-negative"});
  expect_error(open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [1.0],
                                       "data_offsets": [0, 4]}})",
                                      data)),
               {"bad.safetensors", "tensor 'w'", "non-negative"});
  expect_error(open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": 1,
                                       "data_offsets": [0, 4]}})",
                                      data)),
               {"bad.safetensors", "tensor 'w'", "shape"});
  expect_error(open_raw(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [1]}})", data)),
               {"bad.safetensors", "tensor 'w'", "data_offsets"});
  expect_error(open_raw(dir, raw_file(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", data)),
               {"bad.safetensors", "tensor 'w'", "dtype"});
  expect_error(open_raw(dir, raw_file(R"({"w": [1, 2]})", data)),
               {"bad.safetensors", "tensor 'w'", "not a JSON object"});
}

TEST(SafetensorsError, OverlapAndGap) {
  TempDir dir;
  // Both tensors claim bytes [0, 4): legal bounds each, but the header and data disagree.
  expect_error(
      open_raw(dir, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                 "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                             std::string(8, '\0'))),
      {"bad.safetensors", "overlap or gap"});
  expect_error(
      open_raw(dir, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                             std::string(8, '\0'))),
      {"bad.safetensors", "tensor 'a'", "overlap or gap"});
  expect_error(
      open_raw(dir, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                             std::string(8, '\0'))),
      {"bad.safetensors", "trailing"});
}

TEST(SafetensorsError, Misaligned) {
  TempDir dir;
  auto f = open_raw(dir, raw_file(R"({"u": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                   "w": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
                                  std::string(6, '\0')));
  expect_error(f, {"bad.safetensors", "tensor 'w'", "aligned"});
}

TEST(SafetensorsError, BadMetadata) {
  TempDir dir;
  expect_error(open_raw(dir, raw_file(R"({"__metadata__": {"format": 1}})", "")),
               {"bad.safetensors", "__metadata__", "format"});
  expect_error(open_raw(dir, raw_file(R"({"__metadata__": "pt"})", "")),
               {"bad.safetensors", "__metadata__"});
}

TEST(SafetensorsError, ControlBytesInNameAreEscaped) {
  TempDir dir;
  auto f = open_raw(dir, raw_file("{\"w\\u001b[2J\": {\"dtype\": \"Q\", \"shape\": [], "
                                  "\"data_offsets\": [0, 0]}}",
                                  ""));
  expect_error(f, {"bad.safetensors", "tensor 'w\\x1b[2J'"});
}

TEST(SafetensorsError, TensorNotFound) {
  TempDir dir;
  const float v = 1;
  ASSERT_TRUE(
      write_safetensors(dir.file("a.safetensors"), {{"x", view(DType::kF32, {}, &v)}}).ok());
  auto f = SafetensorsFile::open(dir.file("a.safetensors"));
  ASSERT_TRUE(f.ok());
  expect_error(f->get("y"), {"a.safetensors", "tensor 'y'", "not found"});
}

// ------------------------------------------------------------------------------------------
// WeightStore errors

TEST(WeightStoreError, MissingDir) {
  TempDir dir;
  auto s = WeightStore::open_dir(dir.file("nope"));
  expect_error(s, {dir.file("nope")});
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
}

TEST(WeightStoreError, NoCheckpointFiles) {
  TempDir dir;
  auto s = WeightStore::open_dir(dir.str());
  expect_error(s, {dir.str(), "model.safetensors"});
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
}

TEST(WeightStoreError, CorruptSingleFile) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), "junk");
  expect_error(WeightStore::open_dir(dir.str()), {dir.file("model.safetensors")});
}

class WeightStoreChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint16_t> w(2048 * 1024);
    ASSERT_TRUE(write_safetensors(dir_.file("model.safetensors"),
                                  {{kName, view(DType::kF16, {2048, 1024}, w.data())}})
                    .ok());
    auto s = WeightStore::open_dir(dir_.str());
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_.emplace(std::move(s).value());
  }

  static constexpr const char* kName = "model.language_model.layers.0.self_attn.q_proj.weight";
  TempDir dir_;
  std::optional<WeightStore> store_;
};

TEST_F(WeightStoreChecks, MissingTensor) {
  auto t = store_->get("model.language_model.norm.weight");
  expect_error(t, {"tensor 'model.language_model.norm.weight' not found in " + dir_.str()});
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  expect_error(store_->get("lm_head.weight", {1}, {DType::kF32}), {"lm_head.weight", dir_.str()});
}

TEST_F(WeightStoreChecks, WrongShape) {
  expect_error(store_->get(kName, {2048, 2048}, {DType::kF16}),
               {dir_.file("model.safetensors") + ": tensor '" + kName +
                "': expected shape [2048, 2048], got [2048, 1024]"});
}

TEST_F(WeightStoreChecks, WrongDtype) {
  expect_error(store_->get(kName, {2048, 1024}, {DType::kBF16, DType::kF32}),
               {dir_.file("model.safetensors") + ": tensor '" + kName +
                "': expected dtype BF16 or F32, got F16"});
}

TEST(WeightStoreError, IndexPointsAtMissingShard) {
  TempDir dir;
  const float a[2] = {1, 2}, c[2] = {5, 6};
  const uint16_t b[3] = {0, 0, 0};
  write_sharded(dir, a, b, c);
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  write_bytes(dir.file("model.safetensors.index.json"), kIndex);
  auto s = WeightStore::open_dir(dir.str());
  expect_error(s, {"model.safetensors.index.json", dir.file("model-00002-of-00002.safetensors")});
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
}

TEST(WeightStoreError, IndexNamesTensorShardLacks) {
  TempDir dir;
  const float a[2] = {1, 2}, c[2] = {5, 6};
  const uint16_t b[3] = {0, 0, 0};
  write_sharded(dir, a, b, c);
  write_bytes(dir.file("model.safetensors.index.json"),
              R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                 "c": "model-00001-of-00002.safetensors"}})");
  expect_error(WeightStore::open_dir(dir.str()),
               {"model.safetensors.index.json", "tensor 'c'",
                dir.file("model-00001-of-00002.safetensors"), "does not contain"});
}

TEST(WeightStoreError, CorruptShard) {
  TempDir dir;
  const float a[2] = {1, 2}, c[2] = {5, 6};
  const uint16_t b[3] = {0, 0, 0};
  write_sharded(dir, a, b, c);
  write_bytes(dir.file("model-00002-of-00002.safetensors"), le64(4) + "{}");
  write_bytes(dir.file("model.safetensors.index.json"), kIndex);
  expect_error(WeightStore::open_dir(dir.str()),
               {dir.file("model-00002-of-00002.safetensors"), "header length 4"});
}

TEST(WeightStoreError, BadIndexJson) {
  TempDir dir;
  const std::string index = dir.file("model.safetensors.index.json");
  write_bytes(index, "{\"weight_map\": ");
  expect_error(WeightStore::open_dir(dir.str()), {index, "invalid JSON"});
  write_bytes(index, R"({"metadata": {}})");
  expect_error(WeightStore::open_dir(dir.str()), {index, "weight_map"});
  write_bytes(index, R"({"weight_map": {"a": 3}})");
  expect_error(WeightStore::open_dir(dir.str()), {index, "tensor 'a'"});
  write_bytes(index, R"({"weight_map": {"a": "../../etc/passwd"}})");
  expect_error(WeightStore::open_dir(dir.str()), {index, "tensor 'a'", "plain file name"});
  write_bytes(index, "");
  expect_error(WeightStore::open_dir(dir.str()), {index});
}

TEST(WeightStoreError, UnindexedTensorInTwoShards) {
  TempDir dir;
  const float v[1] = {1};
  ASSERT_TRUE(write_safetensors(dir.file("s1.safetensors"), {{"a", view(DType::kF32, {1}, v)},
                                                             {"dup", view(DType::kF32, {1}, v)}})
                  .ok());
  ASSERT_TRUE(write_safetensors(dir.file("s2.safetensors"), {{"b", view(DType::kF32, {1}, v)},
                                                             {"dup", view(DType::kF32, {1}, v)}})
                  .ok());
  write_bytes(dir.file("model.safetensors.index.json"),
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error(WeightStore::open_dir(dir.str()),
               {"tensor 'dup'", "s1.safetensors", "s2.safetensors"});
}

// ------------------------------------------------------------------------------------------
// Writer errors

TEST(SafetensorsWriter, RejectsBadInput) {
  TempDir dir;
  const float v[1] = {1};
  const std::string path = dir.file("w.safetensors");
  expect_error(
      write_safetensors(path, {{"x", view(DType::kF32, {1}, v)}, {"x", view(DType::kF32, {1}, v)}}),
      {path, "tensor 'x'", "duplicate"});
  expect_error(write_safetensors(path, {{"__metadata__", view(DType::kF32, {1}, v)}}),
               {path, "reserved"});
  expect_error(write_safetensors(path, {{"x", view(DType::kF32, {-1}, v)}}), {path, "negative"});
  expect_error(write_safetensors(path, {{"x", view(DType::kF32, {2}, nullptr)}}), {path, "null"});
  expect_error(write_safetensors(path, {{"x", view(DType::kI4, {2, 32}, v)}}),
               {path, "tensor 'x'", "I4 is not a safetensors dtype"});
  expect_error(write_safetensors(path, {{"\xff", view(DType::kF32, {1}, v)}}), {path});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  expect_error(write_safetensors(dir.file("no/such/dir/w.safetensors"), {}), {"no/such/dir"});
}

}  // namespace
}  // namespace vlm
