// The GGUF parser (src/io/gguf.h): what the PyPI `gguf` package's writer wrote, read back as its
// own reader reads it (tests/unit/fixtures/gguf, scripts/make_gguf_parser_fixture.py): every
// metadata type, the alignment, each tensor's type, shape, place and bytes. A file cut anywhere
// is an error, never a read outside it; each kind of corruption is named.
#include "io/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "test_util.h"

namespace vlm {
namespace {

const std::string kDir = std::string(VLM_REPO_DIR) + "/tests/unit/fixtures/gguf";

std::vector<uint8_t> file_bytes(const std::string& path) {
  const std::string s = test_util::read_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

// A value of the fixture's metadata against reference.json's.
void expect_value(const GgufValue& v, const nlohmann::json& want, const std::string& key) {
  SCOPED_TRACE(key);
  const std::string type = want["type"];
  const nlohmann::json& x = want["value"];
  if (type == "ARRAY") {
    ASSERT_EQ(v.type, GgufType::kArray);
    ASSERT_EQ(v.count, x.size());
    for (size_t k = 0; k < x.size(); ++k) {
      const nlohmann::json& e = x[k];
      if (e.is_array()) {
        ASSERT_EQ(v.elem, GgufType::kArray);
        ASSERT_EQ(v.arrays[k].count, e.size());
        for (size_t j = 0; j < e.size(); ++j) {
          EXPECT_EQ(v.arrays[k].item(j).as_int(), e[j].get<int64_t>());
        }
      } else if (e.is_string()) {
        EXPECT_EQ(v.strings[k], e.get<std::string>());
      } else if (e.is_boolean()) {
        EXPECT_EQ(v.item(k).u, e.get<bool>() ? 1u : 0u);
      } else if (e.is_number_integer()) {
        EXPECT_EQ(v.item(k).as_int(), e.get<int64_t>());
      } else {
        EXPECT_EQ(v.item(k).f, e.get<double>());
      }
    }
    return;
  }
  std::string lower = type;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_EQ(gguf_type_name(v.type), lower);
  if (type == "STRING") {
    EXPECT_EQ(v.s, x.get<std::string>());
  } else if (type == "BOOL") {
    EXPECT_EQ(v.type, GgufType::kBool);
    EXPECT_EQ(v.u, x.get<bool>() ? 1u : 0u);
  } else if (type == "FLOAT32" || type == "FLOAT64") {
    EXPECT_EQ(v.f, x.get<double>());
  } else if (type == "UINT64") {
    EXPECT_EQ(v.type, GgufType::kUint64);
    EXPECT_EQ(v.u, x.get<uint64_t>());
  } else if (type.rfind("UINT", 0) == 0) {
    EXPECT_EQ(v.u, x.get<uint64_t>());
  } else {
    EXPECT_EQ(v.i, x.get<int64_t>());
  }
}

TEST(Gguf, ReadsWhatTheGgufPackageWrote) {
  const nlohmann::json ref = nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  auto g = GgufFile::open(kDir + "/reference.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->version(), ref["version"].get<uint32_t>());
  EXPECT_EQ(g->alignment(), ref["alignment"].get<uint64_t>());
  EXPECT_EQ(g->data_offset(), ref["data_offset"].get<uint64_t>());
  for (const auto& [key, want] : ref["metadata"].items()) {
    const GgufValue* v = g->find(key);
    ASSERT_NE(v, nullptr) << key;
    expect_value(*v, want, key);
  }
  EXPECT_EQ(*g->get_string("general.architecture"), "vlmtest");
  EXPECT_EQ(*g->get_int("t.u32"), 4294967295);
  EXPECT_FALSE(g->get_int("t.u64").ok());  // past INT64_MAX
  EXPECT_FALSE(g->get_string("t.u8").ok());
  EXPECT_EQ(g->get_string("no.such").status().code(), StatusCode::kNotFound);
  ASSERT_EQ(g->tensors().size(), ref["tensors"].size());
  for (const auto& want : ref["tensors"]) {
    const GgufTensor* t = g->tensor(want["name"].get<std::string>());
    ASSERT_NE(t, nullptr) << want["name"];
    SCOPED_TRACE(t->name);
    EXPECT_EQ(ggml_type_name(t->type), want["type"].get<std::string>());
    EXPECT_EQ(t->shape, want["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t->offset, want["offset"].get<uint64_t>());
    EXPECT_EQ(t->nbytes, want["nbytes"].get<uint64_t>());
    EXPECT_EQ(sha256_hex(Sha256::of(std::span<const uint8_t>(t->data, t->nbytes))),
              want["sha256"].get<std::string>());
  }
}

// After release_header the metadata and tensor table are gone, while a tensor's bytes, taken
// before, still read as the file holds them.
TEST(Gguf, ReleasingTheHeaderKeepsTheTensorBytes) {
  const nlohmann::json ref = nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  auto g = GgufFile::open(kDir + "/reference.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();
  const auto& want = ref["tensors"][0];
  const GgufTensor* t = g->tensor(want["name"].get<std::string>());
  ASSERT_NE(t, nullptr);
  const uint8_t* data = t->data;
  const uint64_t nbytes = t->nbytes;
  g->release_header();
  EXPECT_EQ(g->find("general.architecture"), nullptr);
  EXPECT_EQ(g->get_string("general.architecture").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(g->tensors().empty());
  EXPECT_EQ(g->tensor(want["name"].get<std::string>()), nullptr);
  EXPECT_EQ(sha256_hex(Sha256::of(std::span<const uint8_t>(data, nbytes))),
            want["sha256"].get<std::string>());
}

TEST(Gguf, AFileCutAnywhereIsAnError) {
  const std::vector<uint8_t> bytes = file_bytes(kDir + "/reference.gguf");
  auto whole = GgufFile::parse(bytes, "whole");
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  // The writer pads the data section's end to the alignment: a cut in that padding loses nothing.
  uint64_t needed = whole->data_offset();
  for (const GgufTensor& t : whole->tensors()) {
    needed = std::max(needed, whole->data_offset() + t.offset + t.nbytes);
  }
  ASSERT_LE(bytes.size() - needed, whole->alignment());
  for (size_t n = needed; n <= bytes.size(); ++n) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_TRUE(GgufFile::parse(cut, "padding cut").ok()) << "cut at " << n;
  }
  for (size_t n = 0; n < needed; ++n) {
    // A copy of its own, so that a read past the prefix is past the allocation (ASan sees it).
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    auto g = GgufFile::parse(cut, "cut");
    ASSERT_FALSE(g.ok()) << "cut at " << n;
    EXPECT_FALSE(g.status().message().empty());
  }
}

// A GGUF file built field by field, for the corruptions.
struct Builder {
  std::vector<uint8_t> b;
  template <typename T>
  Builder& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(uint32_t version, uint64_t tensors, uint64_t kvs) {
    return put<uint32_t>(0x46554747).put(version).put(tensors).put(kvs);
  }
  // A tensor entry: name, dims (ggml order), type, offset.
  Builder& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                  uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put(d);
    return put(type).put(offset);
  }
  // Pads to 32 and appends `n` data bytes.
  Builder& data(size_t n) {
    while (b.size() % 32 != 0) b.push_back(0);
    b.resize(b.size() + n, 7);
    return *this;
  }
  Status parse() const { return GgufFile::parse(b, "built.gguf").status(); }
};

void expect_error(const Builder& f, const std::string& says) {
  const Status st = f.parse();
  ASSERT_FALSE(st.ok()) << "wanted: " << says;
  EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("built.gguf"), std::string::npos) << st.message();
}

TEST(Gguf, EachCorruptionIsNamed) {
  // A good one: one key, one F32 tensor [8, 2].
  Builder good;
  good.header(3, 1, 1).str("a.key").put<uint32_t>(4).put<uint32_t>(7);
  good.tensor("w", {8, 2}, 0, 0).data(64);
  ASSERT_TRUE(good.parse().ok()) << good.parse().message();
  EXPECT_TRUE(Builder(good).parse().ok());

  Builder magic = good;
  magic.b[0] = 'X';
  expect_error(magic, "no GGUF magic");
  for (uint32_t version : {1u, 4u}) {
    Builder v;
    v.header(version, 0, 0);
    EXPECT_EQ(v.parse().code(), StatusCode::kUnimplemented);
    EXPECT_NE(v.parse().message().find("version " + std::to_string(version)), std::string::npos);
  }
  Builder type;
  type.header(3, 0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
  expect_error(type, "unknown value type 13");
  Builder elem;
  elem.header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(99).put<uint64_t>(1);
  expect_error(elem, "an array of unknown type 99");
  Builder huge;
  huge.header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 60);
  expect_error(huge, "longer than the file");
  Builder counts;
  counts.header(3, 1ull << 40, 1ull << 40);
  expect_error(counts, "more than the file holds");
  Builder twice;
  twice.header(3, 0, 2)
      .str("k")
      .put<uint32_t>(0)
      .put<uint8_t>(1)
      .str("k")
      .put<uint32_t>(0)
      .put<uint8_t>(2);
  expect_error(twice, "'k' appears twice");
  Builder boolean;
  boolean.header(3, 0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2);
  expect_error(boolean, "a bool that is 2");
  Builder align;
  align.header(3, 0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(48);
  expect_error(align, "power of two");

  auto one_tensor = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data) {
    Builder t;
    t.header(3, 1, 0).tensor("w", std::move(dims), type, offset).data(data);
    return t;
  };
  expect_error(one_tensor({8, 2}, 0, 0, 63), "runs past the end of the file");
  expect_error(one_tensor({8, 2}, 0, 16, 96), "not aligned to 32");
  expect_error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 4), "5 dimensions");
  expect_error(one_tensor({8, 0}, 0, 0, 0), "impossible shape");
  expect_error(one_tensor({1ull << 62, 4}, 0, 0, 0), "impossible shape");
  // Element counts whose bytes wrap around 2^64 (4 · 2^62 = 0; 8 · 2^61 = 0): larger than the
  // file, refused before any byte count is computed.
  expect_error(one_tensor({1ull << 62}, 0, 0, 0), "larger than the file");
  expect_error(one_tensor({1ull << 61}, 28, 0, 0), "larger than the file");
  expect_error(one_tensor({1ull << 40, 32}, 8, 0, 0), "larger than the file");
  expect_error(one_tensor({48}, 8, 0, 64), "not a whole number of Q8_0 blocks (32)");
  const Status unknown = one_tensor({32}, 4, 0, 64).parse();  // 4: a type ggml removed
  EXPECT_EQ(unknown.code(), StatusCode::kUnimplemented);
  EXPECT_NE(unknown.message().find("ggml type 4"), std::string::npos) << unknown.message();
  Builder dup;
  dup.header(3, 2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).data(64);
  expect_error(dup, "tensor 'w' appears twice");
  // A version 2 file reads as a version 3 one (the same layout).
  Builder v2 = one_tensor({8, 2}, 0, 0, 64);
  v2.b[4] = 2;
  EXPECT_TRUE(v2.parse().ok()) << v2.parse().message();
}

// Every tensor type the gguf package knows: the same number, name and block geometry.
TEST(Gguf, BlockGeometryIsTheGgufPackages) {
  const nlohmann::json ref = nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  ASSERT_GT(ref["types"].size(), 30u);
  for (const auto& [name, t] : ref["types"].items()) {
    const auto type = static_cast<GgmlType>(t[0].get<uint32_t>());
    EXPECT_EQ(ggml_type_name(type), name);
    EXPECT_EQ(ggml_block(type).block, t[1].get<int64_t>()) << name;
    EXPECT_EQ(ggml_block(type).bytes, t[2].get<int64_t>()) << name;
  }
  EXPECT_EQ(ggml_block(static_cast<GgmlType>(4)).block, 0);  // a type ggml removed
  EXPECT_STREQ(ggml_type_name(static_cast<GgmlType>(4)), "?");
}

}  // namespace
}  // namespace vlm
