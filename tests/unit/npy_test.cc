// .npy reader/writer: round trips, byte-exact numpy-style files, and malformed inputs.
#include "io/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "npy_writer.h"
#include "test_util.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;

using ::vlm::test_util::TempDir;

using ::vlm::test_util::read_file;
using ::vlm::test_util::write_bytes;

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A v1.0 file: magic, version, 2-byte little-endian header length, header text, data.
std::string npy_v1(const std::string& header, const std::string& data) {
  std::string s = "\x93NUMPY\x01";
  s += '\0';
  s += static_cast<char>(header.size() & 0xff);
  s += static_cast<char>(header.size() >> 8);
  return s + header + data;
}

void expect_error(const Result<NpyArray>& r, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(r.ok());
  for (const std::string& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "message '" << r.status().message() << "' should mention '" << p << "'";
  }
}

TEST(Npy, RoundTripShapes) {
  TempDir dir;
  const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {5}, {}, {0, 4}, {1, 2, 3, 2}};
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[i] = 0.25f * static_cast<float>(i) - 1.0f;
    const std::string path = dir.file("a.npy");
    ASSERT_TRUE(vlm_cli::write_npy_f32(path, data.data(), shape).ok());
    // numpy aligns the data start to 64 bytes; so does the writer.
    const std::string bytes = read_file(path);
    ASSERT_GE(bytes.size(), 10u);
    const size_t header_len =
        static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(bytes[10 + header_len - 1], '\n');

    auto r = read_npy(path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->dtype, DType::kF32);
    EXPECT_EQ(r->shape, shape);
    EXPECT_EQ(r->f32, data);
    EXPECT_TRUE(r->i64.empty());
  }
}

TEST(Npy, WriterHeaderText) {
  TempDir dir;
  const float v[3] = {1, 2, 3};
  ASSERT_TRUE(vlm_cli::write_npy_f32(dir.file("a.npy"), v, {3}).ok());
  const std::string bytes = read_file(dir.file("a.npy"));
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(bytes.substr(10, 57), "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
}

// Bytes exactly as numpy >= 1.23 writes np.arange(6, dtype=np.float32).reshape(2, 3) (format.py
// _write_array_header): the 59-byte dict, 20 spaces reserved for growing the first axis
// (GROWTH_AXIS_MAX_DIGITS 21 - len('2')), 38 spaces of padding to 64-byte alignment, '\n':
// header length 118 = 0x76, data at offset 128.
TEST(Npy, ReadsNumpyWrittenF32) {
  TempDir dir;
  const std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n";
  ASSERT_EQ(header.size(), 0x76u);
  const std::vector<float> data = {0, 1, 2, 3, 4, 5};
  const std::string file = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header + raw(data);
  ASSERT_EQ(file.size(), 128u + 24u);
  write_bytes(dir.file("np.npy"), file);
  auto r = read_npy(dir.file("np.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->f32, data);
  EXPECT_EQ(r->numel(), 6);
}

TEST(Npy, ReadsInt32And64AsInt64) {
  TempDir dir;
  const std::vector<int32_t> i4 = {-1, 7, 151645};
  write_bytes(dir.file("i4.npy"),
              npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }\n", raw(i4)));
  auto r4 = read_npy(dir.file("i4.npy"));
  ASSERT_TRUE(r4.ok()) << r4.status().message();
  EXPECT_EQ(r4->dtype, DType::kI64);
  EXPECT_EQ(r4->i64, (std::vector<int64_t>{-1, 7, 151645}));
  EXPECT_TRUE(r4->f32.empty());

  const std::vector<int64_t> i8 = {-5, int64_t{1} << 40};
  // Python 2 era spelling ("2L") and double quotes are accepted too.
  write_bytes(
      dir.file("i8.npy"),
      npy_v1("{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (1, 2L)}\n", raw(i8)));
  auto r8 = read_npy(dir.file("i8.npy"));
  ASSERT_TRUE(r8.ok()) << r8.status().message();
  EXPECT_EQ(r8->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r8->i64, i8);
}

// Images are stored as numpy uint8, which numpy spells '|u1' (no byte order); '<u1' also occurs.
TEST(Npy, ReadsUint8) {
  TempDir dir;
  const std::vector<uint8_t> u1 = {0, 1, 127, 128, 254, 255};
  write_bytes(dir.file("u1.npy"),
              npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }\n", raw(u1)));
  auto r = read_npy(dir.file("u1.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->dtype, DType::kU8);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r->u8, u1);
  EXPECT_TRUE(r->f32.empty());
  EXPECT_TRUE(r->i64.empty());

  write_bytes(dir.file("le.npy"),
              npy_v1("{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }\n", "\x07\xf0"));
  auto le = read_npy(dir.file("le.npy"));
  ASSERT_TRUE(le.ok()) << le.status().message();
  EXPECT_EQ(le->u8, (std::vector<uint8_t>{7, 240}));

  // One byte short of [2, 2].
  write_bytes(dir.file("short.npy"),
              npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }\n", "abc"));
  expect_error(read_npy(dir.file("short.npy")), {"short.npy", "3 bytes", "needs 4"});
  // Signed bytes are not uint8.
  write_bytes(dir.file("i1.npy"),
              npy_v1("{'descr': '|i1', 'fortran_order': False, 'shape': (1,), }\n", "x"));
  expect_error(read_npy(dir.file("i1.npy")), {"i1.npy", "'|i1'"});
}

TEST(Npy, ReadsVersion2) {
  TempDir dir;
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n";
  std::string file = std::string("\x93NUMPY\x02\x00", 8);
  file += static_cast<char>(header.size());
  file += std::string(3, '\0');
  const std::vector<float> data = {9.5f};
  write_bytes(dir.file("v2.npy"), file + header + raw(data));
  auto r = read_npy(dir.file("v2.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->f32, data);
}

TEST(NpyError, MissingFile) {
  TempDir dir;
  expect_error(read_npy(dir.file("absent.npy")), {"absent.npy"});
}

TEST(NpyError, BadMagicAndEmpty) {
  TempDir dir;
  write_bytes(dir.file("e.npy"), "");
  expect_error(read_npy(dir.file("e.npy")), {"e.npy", "magic"});
  write_bytes(dir.file("m.npy"), "PK\x03\x04 this is a zip");
  expect_error(read_npy(dir.file("m.npy")), {"m.npy", "magic"});
  write_bytes(dir.file("v.npy"), std::string("\x93NUMPY\x09\x00", 8) + "xx");
  expect_error(read_npy(dir.file("v.npy")), {"v.npy", "version 9"});
}

TEST(NpyError, HeaderLengthPastEnd) {
  TempDir dir;
  write_bytes(dir.file("h.npy"), std::string("\x93NUMPY\x01\x00\xff\x00", 10) + "{}");
  expect_error(read_npy(dir.file("h.npy")), {"h.npy", "header length 255"});
  write_bytes(dir.file("s.npy"), std::string("\x93NUMPY\x01\x00\x05", 9));
  expect_error(read_npy(dir.file("s.npy")), {"s.npy", "truncated"});
}

TEST(NpyError, UnsupportedDtypeAndOrder) {
  TempDir dir;
  write_bytes(
      dir.file("f8.npy"),
      npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n", std::string(8, '\0')));
  expect_error(read_npy(dir.file("f8.npy")), {"f8.npy", "'<f8'"});
  write_bytes(
      dir.file("be.npy"),
      npy_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n", std::string(4, '\0')));
  expect_error(read_npy(dir.file("be.npy")), {"be.npy", "'>f4'"});
  write_bytes(dir.file("obj.npy"),
              npy_v1("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n", "x"));
  expect_error(read_npy(dir.file("obj.npy")), {"obj.npy", "'|O'"});
  write_bytes(dir.file("f.npy"),
              npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n",
                     std::string(16, '\0')));
  expect_error(read_npy(dir.file("f.npy")), {"f.npy", "Fortran"});
}

TEST(NpyError, DataSizeMismatch) {
  TempDir dir;
  const std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  write_bytes(dir.file("short.npy"), npy_v1(h, std::string(20, '\0')));
  expect_error(read_npy(dir.file("short.npy")), {"short.npy", "20 bytes", "needs 24"});
  write_bytes(dir.file("long.npy"), npy_v1(h, std::string(28, '\0')));
  expect_error(read_npy(dir.file("long.npy")), {"long.npy", "28 bytes", "needs 24"});
  // 2^62 * 2^62 elements: must report overflow, not wrap to a small size.
  write_bytes(dir.file("big.npy"),
              npy_v1("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (4611686018427387904, 4611686018427387904), }\n",
                     ""));
  expect_error(read_npy(dir.file("big.npy")), {"big.npy", "overflow"});
  write_bytes(
      dir.file("huge.npy"),
      npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", ""));
  expect_error(read_npy(dir.file("huge.npy")), {"huge.npy", "overflow"});
}

TEST(NpyError, MalformedHeader) {
  TempDir dir;
  const std::vector<std::string> bad = {
      "",
      "not a dict\n",
      "{'descr': '<f4', 'fortran_order': False}\n",                         // no shape
      "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }\n",            // not a bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': [1], }\n",         // list, not tuple
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n",       // negative
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}\n",  // unknown key
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } junk\n",   // trailing bytes
      "{'descr': '<f4",                                                     // unterminated
  };
  for (const std::string& h : bad) {
    write_bytes(dir.file("bad.npy"), npy_v1(h, std::string(4, '\0')));
    expect_error(read_npy(dir.file("bad.npy")), {"bad.npy", "header"});
  }
}

TEST(NpyWriter, RejectsBadInput) {
  TempDir dir;
  const float v = 1;
  EXPECT_FALSE(vlm_cli::write_npy_f32(dir.file("a.npy"), &v, {-1}).ok());
  EXPECT_FALSE(vlm_cli::write_npy_f32(dir.file("a.npy"), nullptr, {2}).ok());
  auto s = vlm_cli::write_npy_f32(dir.file("no/such/a.npy"), &v, {1});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/a.npy"), std::string::npos);
}

}  // namespace
}  // namespace vlm
