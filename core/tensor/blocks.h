// GGUF / ggml quantization block layouts, byte for byte as they are stored in a GGUF file's tensor data.
//
// Each struct is one block of a row: `QK*` elements packed into `sizeof(block_*)` bytes, little-endian, no
// padding (every size is asserted below). Names follow ggml's ggml-common.h so they can be checked against the
// format's definition. Scales marked `ggml_half` are IEEE fp16 bit patterns (see fp16.h).
//
// Element order inside a block (what dequantize_row produces):
//   Q4_0/Q4_1/Q5_*:  element j < 16 is the low nibble of qs[j], element j + 16 the high nibble
//                    (Q5_*: bit 4 of element i is bit i of the 32-bit little-endian qh).
//   Q8_0/Q8_1/Q8_K:  element j is qs[j].
//   Q2_K/Q3_K:       element p (p < 256) is 2 bits of qs[32 * (p / 128) + p % 32] at shift 2 * ((p / 32) % 4);
//                    sub-block scale index p / 16. Q3_K's third bit is bit p / 32 of hmask[p % 32].
//   Q4_K/Q5_K:       element p is the (p / 32) % 2 == 0 ? low : high nibble of qs[32 * (p / 64) + p % 32];
//                    sub-block scale index p / 32 (6-bit scale and min packed in 12 bytes);
//                    Q5_K's fifth bit is bit p / 32 of qh[p % 32].
//   Q6_K:            element p: low 4 bits from ql[64 * (p / 128) + p % 64] (low nibble when (p % 128) < 64),
//                    high 2 bits from qh[32 * (p / 128) + p % 32] at shift 2 * ((p % 128) / 32); scale p / 16.
//   IQ4_NL/MXFP4:    as Q4_0 (element j < 16: low nibble of qs[j], j + 16: high nibble); the nibble indexes a
//                    16-entry value table (iq_tables.h) instead of being an offset level.
//   IQ2_XXS:         8 groups of 32, each 4 x uint16 of qs read as two u32 a, b: element 8l + j (l < 4) is
//                    byte j of iq2xxs_grid[byte l of a], negated when bit j of ksigns_iq2xs[(b >> 7l) & 127]
//                    is set; group scale (b >> 28), value = d * (0.5 + scale) * 0.25 * that.
//   IQ1_S:           8 groups of 32, group g: qh[g] bits 3l..3l+2 are the high bits of grid index l (low
//                    byte qs[4g + l]) of elements 8l..8l+7, bits 12..14 the scale s, bit 15 the delta's sign;
//                    value = d * (2s + 1) * (grid byte (-1, 0, 1) + delta), delta = +-0.125.
//   IQ3_XXS:         8 groups of 32: qs[8g + k] (k < 8) is the grid index of elements 4k..4k+3 of group g; the
//                    u32 at qs[64 + 4g] holds the sign codes (bits 7l..7l+6, elements 8l..8l+7, as IQ2_XXS) and
//                    the scale s (bits 28..31); value = d * (0.5 + s) * 0.5 * grid byte * sign.
//   IQ3_S:           8 groups of 32: index of elements 4k..4k+3 of group g is qs[8g + k] | bit k of qh[g] << 8;
//                    bit e % 8 of signs[4g + e / 8] negates element e of the group; scale s is nibble g % 2
//                    of scales[g / 2]; value = d * (1 + 2s) * grid byte * sign.
//   IQ2_XS:          8 groups of 32: qs[4g + l] (u16) holds the 9-bit grid index of elements 8l..8l+7 and (bits
//                    9..15) their sign code; 16-element sub-block scale s = nibble (e / 16) % 2 of scales[g];
//                    value = d * (0.5 + s) * 0.25 * grid byte * sign.
//   IQ2_S:           8 groups of 32: index of elements 8l..8l+7 of group g is qs[4g + l] | bits 2l..2l+1 of qh[g]
//                    << 8; bit j of qs[32 + 4g + l] negates element 8l + j; scales as IQ2_XS.
//   IQ1_M:           8 groups of 32: index of elements 8l..8l+7 of group g is qs[4g + l] | 3 bits of qh[2g + l / 2]
//                    (nibble l % 2, bits 0..2) << 8, the nibble's bit 3 the delta sign of those 8; 16-element
//                    sub-block scale s (3 bits) at bit 6 (g % 2) + 3 (e / 16) of the u16 scales word g / 2; the
//                    four words' top nibbles form the fp16 super-block scale d; value = d * (2s + 1) * (grid +-
//                    0.125).
//   TQ1_0:           ternary, base 3: byte qs[m] (m < 32) holds elements 32n + m (n < 5) as trit n (the value
//                    t = (byte * 3^n mod 256) * 3 >> 8), qs[32 + m] (m < 16) elements 160 + 16n + m, qh[j] (j < 4)
//                    elements 240 + 4n + j (n < 4); value = d * (t - 1).
//   TQ2_0:           element 128 (j / 32) + 32 l + k is bits 2l..2l+1 of qs[j + k] (j in {0, 32}, k < 32) minus 1,
//                    times d.
//   IQ4_XS:          8 sub-blocks of 32, each laid out as one IQ4_NL block's 16 bytes (qs[16 * s ...]); 6-bit
//                    signed sub-block scale s: low 4 bits from scales_l[s / 2] (nibble s % 2), high 2 bits
//                    from scales_h at bit 2 * s, minus 32.
// Plain data; no behaviour here beyond the layout.
#pragma once

#include <cstddef>
#include <cstdint>

namespace car::tensor {

using ggml_half = uint16_t;  ///< IEEE 754 binary16 bit pattern
using ggml_bf16 = uint16_t;  ///< bfloat16 bit pattern (upper half of an fp32)

inline constexpr int QK4_0 = 32;
inline constexpr int QK4_1 = 32;
inline constexpr int QK5_0 = 32;
inline constexpr int QK5_1 = 32;
inline constexpr int QK8_0 = 32;
inline constexpr int QK8_1 = 32;
inline constexpr int QK_K = 256;         ///< super-block size of the K-quants
inline constexpr int K_SCALE_SIZE = 12;  ///< bytes of packed 6-bit scales+mins in Q4_K / Q5_K

struct block_q4_0 {
  ggml_half d;             ///< scale
  uint8_t qs[QK4_0 / 2];   ///< nibbles; value = (q - 8) * d
};
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "wrong q4_0 block size/padding");

struct block_q4_1 {
  ggml_half d;             ///< scale
  ggml_half m;             ///< min; value = q * d + m
  uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(block_q4_1) == 2 * 2 + QK4_1 / 2, "wrong q4_1 block size/padding");

struct block_q5_0 {
  ggml_half d;
  uint8_t qh[4];           ///< 5th bits, little-endian u32
  uint8_t qs[QK5_0 / 2];   ///< value = (q - 16) * d
};
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "wrong q5_0 block size/padding");

struct block_q5_1 {
  ggml_half d;
  ggml_half m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];   ///< value = q * d + m
};
static_assert(sizeof(block_q5_1) == 2 * 2 + 4 + QK5_1 / 2, "wrong q5_1 block size/padding");

struct block_q8_0 {
  ggml_half d;
  int8_t qs[QK8_0];        ///< value = q * d
};
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "wrong q8_0 block size/padding");

/// Activation partner of Q4_1 / Q5_1 (never stored in model files in practice).
struct block_q8_1 {
  ggml_half d;             ///< scale
  ggml_half s;             ///< d * sum(qs), rounded to fp16
  int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 2 * 2 + QK8_1, "wrong q8_1 block size/padding");

/// 2-bit: 16 sub-blocks of 16, 4-bit scale and 4-bit min per sub-block. value = d*sc*q - dmin*m.
struct block_q2_K {
  uint8_t scales[QK_K / 16];  ///< low nibble scale, high nibble min
  uint8_t qs[QK_K / 4];
  ggml_half d;
  ggml_half dmin;
};
static_assert(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4, "wrong q2_K block size/padding");

/// 3-bit: 16 sub-blocks of 16, signed 6-bit scales (stored + 32). value = d * (sc - 32) * (q - 4*!hbit).
struct block_q3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];
  ggml_half d;
};
static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "wrong q3_K block size/padding");

/// 4-bit: 8 sub-blocks of 32, 6-bit scale and min each. value = d*sc*q - dmin*m.
struct block_q4_K {
  ggml_half d;
  ggml_half dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "wrong q4_K block size/padding");

/// 5-bit: as Q4_K plus one high bit per element.
struct block_q5_K {
  ggml_half d;
  ggml_half dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8, "wrong q5_K block size/padding");

/// 6-bit: 16 sub-blocks of 16, int8 scales. value = d * sc * (q - 32).
struct block_q6_K {
  uint8_t ql[QK_K / 2];       ///< low 4 bits
  uint8_t qh[QK_K / 4];       ///< high 2 bits
  int8_t scales[QK_K / 16];
  ggml_half d;
};
static_assert(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4, "wrong q6_K block size/padding");

/// Activation partner of the K-quants: fp32 scale, sums of each 16 quants.
struct block_q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
static_assert(sizeof(block_q8_K) == sizeof(float) + QK_K + QK_K / 16 * sizeof(int16_t),
              "wrong q8_K block size/padding");

/// 2.0625 bpw codebook format: 8-element grid points with 7-bit sign codes and 4-bit group scales.
struct block_iq2_xxs {
  ggml_half d;
  uint16_t qs[QK_K / 8];
};
static_assert(sizeof(block_iq2_xxs) == 2 + QK_K / 4, "wrong iq2_xxs block size/padding");

/// 1.5625 bpw codebook format: ternary 8-element grid points (2048), 3-bit group scales, a shifted grid.
struct block_iq1_s {
  ggml_half d;
  uint8_t qs[QK_K / 8];   ///< grid index, low 8 bits
  uint16_t qh[QK_K / 32]; ///< grid index high 3 bits x 4, group scale (bits 12..14), delta sign (bit 15)
};
static_assert(sizeof(block_iq1_s) == 2 + QK_K / 8 + QK_K / 16, "wrong iq1_s block size/padding");
inline constexpr float IQ1S_DELTA = 0.125f;

/// 3.0625 bpw codebook format: 4-element grid points (256), IQ2_XXS's sign codes, 4-bit group scales.
struct block_iq3_xxs {
  ggml_half d;
  uint8_t qs[3 * QK_K / 8];  ///< 64 grid indices, then 8 x u32 of sign codes and scale
};
static_assert(sizeof(block_iq3_xxs) == 2 + 3 * QK_K / 8, "wrong iq3_xxs block size/padding");

/// 3.4375 bpw codebook format: 4-element grid points (512), free signs, 4-bit group scales.
struct block_iq3_s {
  ggml_half d;
  uint8_t qs[QK_K / 4];      ///< grid index, low 8 bits
  uint8_t qh[QK_K / 32];     ///< grid index bit 8, one byte per group
  uint8_t signs[QK_K / 8];   ///< one bit per element
  uint8_t scales[QK_K / 64]; ///< 4-bit group scales, two per byte
};
static_assert(sizeof(block_iq3_s) == 2 + 13 * (QK_K / 32) + QK_K / 64, "wrong iq3_s block size/padding");

/// 2.3125 bpw codebook format: 8-element grid points (512) with sign codes, 4-bit scales per 16 elements.
struct block_iq2_xs {
  ggml_half d;
  uint16_t qs[QK_K / 8];     ///< 9-bit grid index | 7-bit sign code << 9
  uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_xs) == 2 + QK_K / 4 + QK_K / 32, "wrong iq2_xs block size/padding");

/// 2.5625 bpw codebook format: 8-element grid points (1024), free signs, 4-bit scales per 16 elements.
struct block_iq2_s {
  ggml_half d;
  uint8_t qs[QK_K / 4];      ///< 32 grid index low bytes, then 32 sign bytes
  uint8_t qh[QK_K / 32];     ///< grid index bits 8..9, four per byte
  uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_s) == 2 + QK_K / 4 + QK_K / 16, "wrong iq2_s block size/padding");

/// 1.75 bpw codebook format: IQ1_S's ternary grid, a delta sign per 8 elements, 3-bit scales per 16 elements;
/// the fp16 super-block scale is spread over the top nibbles of the scale words.
struct block_iq1_m {
  uint8_t qs[QK_K / 8];      ///< grid index, low 8 bits
  uint8_t qh[QK_K / 16];     ///< per 8 elements (a nibble): grid index high 3 bits, delta sign (bit 3)
  uint8_t scales[QK_K / 32]; ///< 4 x u16: 4 x 3-bit sub-block scales, top nibble a quarter of d
};
static_assert(sizeof(block_iq1_m) == QK_K / 8 + QK_K / 16 + QK_K / 32, "wrong iq1_m block size/padding");
inline constexpr float IQ1M_DELTA = 0.125f;

/// 1.6875 bpw ternary format: 5 trits a byte (4 in qh), one fp16 scale at the end.
struct block_tq1_0 {
  uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];  ///< 48 bytes of 5 trits
  uint8_t qh[QK_K / 64];                   ///< 4 bytes of 4 trits
  ggml_half d;
};
static_assert(sizeof(block_tq1_0) == 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5, "wrong tq1_0 block size/padding");

/// 2.0625 bpw ternary format: 2 bits a value (0, 1, 2 = -1, 0, +1), one fp16 scale at the end.
struct block_tq2_0 {
  uint8_t qs[QK_K / 4];
  ggml_half d;
};
static_assert(sizeof(block_tq2_0) == 2 + QK_K / 4, "wrong tq2_0 block size/padding");

inline constexpr int QK4_NL = 32;
inline constexpr int QK_MXFP4 = 32;

/// Non-linear 4-bit: value = d * kvalues_iq4nl[q].
struct block_iq4_nl {
  ggml_half d;
  uint8_t qs[QK4_NL / 2];
};
static_assert(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "wrong iq4_nl block size/padding");

/// IQ4_NL's values in super-blocks of 256 with 6-bit sub-block scales.
/// value = d * (ls - 32) * kvalues_iq4nl[q].
struct block_iq4_xs {
  ggml_half d;
  uint16_t scales_h;          ///< high 2 bits of the 8 sub-block scales
  uint8_t scales_l[QK_K / 64];  ///< low 4 bits, two per byte
  uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "wrong iq4_xs block size/padding");

/// OCP microscaling FP4: an E8M0 shared exponent and 32 E2M1 values. value = 2^(e - 127) * e2m1(q), computed
/// as ggml does: kvalues_mxfp4[q] (the E2M1 values doubled, so integers) times 2^(e - 128).
struct block_mxfp4 {
  uint8_t e;
  uint8_t qs[QK_MXFP4 / 2];
};
static_assert(sizeof(block_mxfp4) == 1 + QK_MXFP4 / 2, "wrong mxfp4 block size/padding");

}  // namespace car::tensor
