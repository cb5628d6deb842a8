// Scalar conversions between fp32 and the two 16-bit float formats GGUF stores (IEEE binary16, bfloat16),
// and the round-half-even float-to-int rounding the activation quantizers use.
//
// fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even, exactly as the x86 F16C instruction
// VCVTPS2PH (imm 0) and ggml's fp32->bf16 conversion do; NaN stays NaN (quiet), overflow gives infinity.
// Header-only, constexpr-free (uses memcpy bit casts), usable from every kernel file.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace car::tensor {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// binary16 -> fp32 (exact).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float f = static_cast<float>(mant) * 0x1p-24f;  // zero or subnormal
    return sign ? -f : f;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

/// fp32 -> binary16, round to nearest even.
inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // NaN, quiet
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24. Scaling by 2^24 is exact; rint rounds
    // half to even in the default rounding mode (1024 becomes the smallest normal, which is the right code).
    const float scaled = f32_from_bits(x) * 0x1p24f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits half to even.
  const uint32_t odd = (x >> 13) & 1u;
  const uint32_t r = (x - (112u << 23) + 0xfffu + odd) >> 13;
  return static_cast<uint16_t>(sign | r);
}

/// bfloat16 -> fp32 (exact).
inline float bf16_to_fp32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

/// fp32 -> bfloat16, round to nearest even; NaN is kept quiet.
inline uint16_t fp32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64u);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/// Round half to even for |v| < 2^22 (the quantizers' range), as ggml's nearest_int and the x86
/// round-to-nearest conversion do. Adding 1.5 * 2^23 puts the integer in the low mantissa bits.
inline int nearest_int(float v) {
  const float biased = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &biased, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

/// Round-trip helpers: the value an fp32 takes after storage as fp16 / bf16.
inline float round_fp16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }
inline float round_bf16(float f) { return bf16_to_fp32(fp32_to_bf16(f)); }

}  // namespace car::tensor
