#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/half.h"

namespace vlm {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kBool}) {
    DType back;
    ASSERT_TRUE(dtype_from_name(dtype_name(t), &back));
    EXPECT_EQ(back, t);
  }
  DType x;
  EXPECT_FALSE(dtype_from_name("F8_E4M3X", &x));
  // I4 is made at load time only: no safetensors file may claim it.
  EXPECT_STREQ(dtype_name(DType::kI4), "I4");
  EXPECT_FALSE(dtype_from_name("I4", &x));
}

TEST(DType, ByteSizesKnowInt4IsHalfAByte) {
  EXPECT_EQ(dtype_nbytes(DType::kBF16, 6), 12u);
  EXPECT_EQ(dtype_nbytes(DType::kI8, 6), 6u);
  EXPECT_EQ(dtype_nbytes(DType::kI4, 6), 3u);
  EXPECT_EQ(dtype_nbytes(DType::kI4, 7), 4u);  // a partial byte still takes the byte
  EXPECT_EQ(dtype_block(DType::kI4), 2);
  EXPECT_EQ(dtype_block(DType::kI8), 1);
  TensorView v{DType::kI4, {2048, 6144}, nullptr};
  EXPECT_EQ(v.nbytes(), 2048u * 6144 / 2);
  v.dtype = DType::kF32;
  EXPECT_EQ(v.nbytes(), 2048u * 6144 * 4);
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down to 1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_FLOAT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

TEST(Half, F16Decodes) {
  EXPECT_FLOAT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_FLOAT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_FLOAT_EQ(f16_to_f32(0x0001), 5.960464477539063e-08f);  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(Half, F16FiniteDecodeEqualsTheFullDecodeOnEveryFiniteValue) {
  int checked = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;  // inf / NaN: not for the finite decoder
    const float a = f16_to_f32(static_cast<uint16_t>(h));
    const float b = f16_to_f32_finite(static_cast<uint16_t>(h));
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    ASSERT_EQ(ua, ub) << std::hex << h;  // the same bits: −0 stays −0, subnormals exact
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2048);
}

TEST(Half, F16EncodeRoundTripsEveryF16Value) {
  // Every finite f16 decodes to an f32 that must encode back to the same bits.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) continue;  // NaN payloads
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Half, F16EncodeRoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // halfway: down to even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);  // halfway: up to even
  EXPECT_EQ(f32_to_f16(1.0f + 1.5f / 2048), 0x3c01);  // above halfway
  EXPECT_EQ(f32_to_f16(70000.f), 0x7c00);             // overflow → inf
  EXPECT_EQ(f32_to_f16(1e-9f), 0x0000);               // underflow → 0
  EXPECT_EQ(f32_to_f16(3.0e-8f), 0x0001);             // rounds to the smallest subnormal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

}  // namespace
}  // namespace vlm
