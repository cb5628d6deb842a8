// fp16 / bf16 conversions and round-half-even, checked exhaustively where the domain allows.
#include "core/tensor/fp16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

namespace car::tensor {
namespace {

TEST(Fp16, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = fp16_to_fp32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << std::hex << h;
      continue;
    }
    EXPECT_EQ(fp32_to_fp16(f), bits) << std::hex << h;
  }
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // the tie above the largest half rounds to infinity
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);  // tie to even (zero)
  EXPECT_EQ(fp32_to_fp16(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_FLOAT_EQ(fp16_to_fp32(0x3555), 0.33325195f);
}

TEST(Fp16, MidpointsRoundToEven) {
  // The midpoint between consecutive finite halves a < b goes to whichever has an even mantissa;
  // anything strictly between goes to the nearer one.
  for (uint32_t h = 0; h < 0x7bffu; ++h) {
    const double a = fp16_to_fp32(static_cast<uint16_t>(h));
    const double b = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const auto mid = static_cast<float>((a + b) / 2);  // exact in float (one more bit than a half)
    const uint16_t even = (h & 1u) == 0 ? static_cast<uint16_t>(h) : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(fp32_to_fp16(mid), even) << std::hex << h;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 1e9f)), h + 1) << std::hex << h;
    ASSERT_EQ(fp32_to_fp16(-mid), 0x8000u | even) << std::hex << h;
  }
}

TEST(Bf16, RoundsHalfToEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), h);
    }
  }
}

TEST(NearestInt, IsRoundHalfEven) {
  EXPECT_EQ(nearest_int(2.5f), 2);
  EXPECT_EQ(nearest_int(3.5f), 4);
  EXPECT_EQ(nearest_int(-2.5f), -2);
  EXPECT_EQ(nearest_int(-0.5f), 0);
  EXPECT_EQ(nearest_int(126.5f), 126);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-200.0f, 200.0f);
  for (int i = 0; i < 100000; ++i) {
    const float v = dist(rng);
    ASSERT_EQ(nearest_int(v), static_cast<int>(std::nearbyint(v))) << v;
  }
}

}  // namespace
}  // namespace car::tensor
