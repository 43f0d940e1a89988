// GGUF's dequantizers (src/io/gguf_quants.h) against the PyPI `gguf` package's own: for every
// type vlm reads, random blocks and the package's f32 values for them
// (tests/unit/fixtures/gguf/quants.gguf, scripts/make_gguf_quant_fixture.py), equal bit for bit.
// Sizes that are not whole blocks and types vlm does not read are refused by name.
#include "io/gguf_quants.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace vlm {
namespace {

const std::string kFile = std::string(VLM_REPO_DIR) + "/tests/unit/fixtures/gguf/quants.gguf";

const GgmlType kTypes[] = {GgmlType::kF16,    GgmlType::kBF16,  GgmlType::kQ4_0, GgmlType::kQ4_1,
                           GgmlType::kQ5_0,   GgmlType::kQ5_1,  GgmlType::kQ8_0, GgmlType::kQ2_K,
                           GgmlType::kQ3_K,   GgmlType::kQ4_K,  GgmlType::kQ5_K, GgmlType::kQ6_K,
                           GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};

TEST(GgufQuants, EveryTypeEqualsTheGgufPackageBitForBit) {
  auto f = GgufFile::open(kFile);
  ASSERT_TRUE(f.ok()) << f.status().message();
  for (GgmlType type : kTypes) {
    const std::string name = ggml_type_name(type);
    SCOPED_TRACE(name);
    const GgufTensor* q = f->tensor("q." + name);
    const GgufTensor* ref = f->tensor("f." + name);
    ASSERT_NE(q, nullptr);
    ASSERT_NE(ref, nullptr);
    ASSERT_EQ(q->type, type);
    ASSERT_EQ(q->shape, ref->shape);
    EXPECT_TRUE(ggml_can_dequantize(type));
    std::vector<float> got(q->numel(), -1.0f);
    const Status s = dequantize(*q, got);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<uint32_t> got_bits(got.size());
    std::vector<uint32_t> want_bits(got.size());
    std::memcpy(got_bits.data(), got.data(), got.size() * 4);
    std::memcpy(want_bits.data(), ref->data, ref->nbytes);
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got_bits[i] != want_bits[i];
    EXPECT_EQ(differ, 0u) << "of " << got.size();
    // Not all zeros: the blocks' values really vary.
    size_t nonzero = 0;
    for (float v : got) nonzero += v != 0.0f;
    EXPECT_GT(nonzero, got.size() / 2);
  }
}

TEST(GgufQuants, F32IsCopied) {
  const std::vector<float> src = {1.5f, -0.0f, 3e-40f, 7.0f};
  std::vector<float> out(4);
  const auto* p = reinterpret_cast<const uint8_t*>(src.data());
  ASSERT_TRUE(dequantize(GgmlType::kF32, {p, 16}, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), src.data(), 16), 0);
}

TEST(GgufQuants, PartialBlocksAndUnreadTypesAreRefused) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> out(256);
  // 256 Q8_0 elements are 8 blocks of 34 bytes.
  EXPECT_TRUE(dequantize(GgmlType::kQ8_0, {bytes.data(), 8 * 34}, out).ok());
  const Status wrong_bytes = dequantize(GgmlType::kQ8_0, {bytes.data(), 8 * 34 - 1}, out);
  EXPECT_FALSE(wrong_bytes.ok());
  EXPECT_NE(wrong_bytes.message().find("Q8_0"), std::string::npos) << wrong_bytes.message();
  std::vector<float> partial(100);
  EXPECT_FALSE(dequantize(GgmlType::kQ4_K, {bytes.data(), 144}, partial).ok());
  for (GgmlType t : {GgmlType::kIQ2_XXS, GgmlType::kQ8_1, GgmlType::kTQ1_0, GgmlType::kMXFP4}) {
    EXPECT_FALSE(ggml_can_dequantize(t));
    const Status s = dequantize(t, {bytes.data(), 0}, std::span<float>());
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(ggml_type_name(t)), std::string::npos) << s.message();
  }
  // A tensor's errors name it.
  GgufTensor t;
  t.name = "blk.0.attn_q.weight";
  t.type = GgmlType::kQ4_0;
  t.shape = {32};
  t.data = bytes.data();
  t.nbytes = 17;
  std::vector<float> one(32);
  const Status s = dequantize(t, one);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blk.0.attn_q.weight"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace vlm
