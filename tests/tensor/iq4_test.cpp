// The 4-bit table formats (IQ4_NL, IQ4_XS, MXFP4, issue #27): hand-built blocks against the format's
// definition (element order, tables, E8M0 scales), quantizer round trips, and every ISA's dot kernel equal
// to the scalar reference bit for bit on general data (the reference is ggml's x86 order, ref_iq4.cpp).
// The shared suites (reference_test, simd_test, matmul_test, rows_kernel_test) cover them too through
// testing::computable_types().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::random_floats;

constexpr GgmlType kIq4Types[] = {GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4};

TEST(Iq4Formats, E8m0HalfIsTwoToTheEMinus128) {
  EXPECT_EQ(e8m0_to_fp32_half(128), 1.0f);
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(2), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));  // subnormal
  EXPECT_EQ(e8m0_to_fp32_half(0), std::ldexp(1.0f, -128));  // subnormal
  EXPECT_EQ(e8m0_to_fp32_half(255), std::ldexp(1.0f, 127));
}

TEST(Iq4Formats, HandBuiltBlocksDequantize) {
  float y[256];
  block_iq4_nl nl{};
  nl.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) nl.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  dequantize_row(GgmlType::IQ4_NL, &nl, y, 32);
  EXPECT_EQ(y[0], -63.5f);  // kvalues_iq4nl[0] = -127
  EXPECT_EQ(y[8], 0.5f);    // kvalues_iq4nl[8] = 1
  EXPECT_EQ(y[15], 56.5f);  // 113
  EXPECT_EQ(y[16], 56.5f);  // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -63.5f);

  block_mxfp4 mx{};
  mx.e = 127;  // scale 2^0; values are kvalues_mxfp4 / 2 = E2M1
  for (int j = 0; j < 16; ++j) mx.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  dequantize_row(GgmlType::MXFP4, &mx, y, 32);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], e2m1[j]) << j;
    EXPECT_EQ(y[16 + j], e2m1[15 - j]) << j;
  }

  block_iq4_xs xs{};
  xs.d = fp32_to_fp16(0.25f);
  // Sub-block s gets scale (s * 7 + 3) % 64 - 32: low nibbles in scales_l, high 2 bits in scales_h.
  int ls[8];
  for (int s = 0; s < 8; ++s) {
    const int stored = (s * 7 + 3) % 64;
    ls[s] = stored - 32;
    xs.scales_l[s / 2] = static_cast<uint8_t>(xs.scales_l[s / 2] | ((stored & 0x0f) << (4 * (s % 2))));
    xs.scales_h = static_cast<uint16_t>(xs.scales_h | ((stored >> 4) << (2 * s)));
  }
  for (int j = 0; j < 128; ++j) xs.qs[j] = static_cast<uint8_t>((j % 16) | (((j + 5) % 16) << 4));
  dequantize_row(GgmlType::IQ4_XS, &xs, y, 256);
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(iq4_xs_scale(xs, s), ls[s]);
    for (int e = 0; e < 32; ++e) {
      const int byte = 16 * s + e % 16;
      const int q = e < 16 ? byte % 16 : (byte + 5) % 16;
      EXPECT_EQ(y[32 * s + e], 0.25f * static_cast<float>(ls[s]) * kvalues_iq4nl[q]) << s << " " << e;
    }
  }
}

// Values already on a format's grid (at a scale the file can hold) come back exactly.
TEST(Iq4Formats, GridValuesRoundTripExactly) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> idx(0, 15);
  {
    std::vector<float> x(64);
    for (int b = 0; b < 2; ++b) {
      for (int j = 0; j < 32; ++j) x[32 * b + j] = 0.125f * kvalues_iq4nl[j == 0 ? 0 : idx(rng)];
    }
    std::vector<uint8_t> q(detail::row_bytes(GgmlType::IQ4_NL, 64));
    quantize_row(GgmlType::IQ4_NL, x.data(), q.data(), 64);
    EXPECT_EQ(testing::dequantized(GgmlType::IQ4_NL, q.data(), 64), x);
  }
  {
    std::vector<float> x(64);
    for (int j = 0; j < 64; ++j) x[j] = 0.25f * kvalues_mxfp4[j % 32 == 0 ? 7 : idx(rng)];  // amax 3 -> e 126
    std::vector<uint8_t> q(detail::row_bytes(GgmlType::MXFP4, 64));
    quantize_row(GgmlType::MXFP4, x.data(), q.data(), 64);
    EXPECT_EQ(q[0], 126);
    EXPECT_EQ(testing::dequantized(GgmlType::MXFP4, q.data(), 64), x);
  }
}

TEST(Iq4Formats, ZeroRowsQuantizeToZero) {
  for (GgmlType t : kIq4Types) {
    const int64_t n = 512;
    const std::vector<float> zeros(n, 0.0f);
    std::vector<uint8_t> q(detail::row_bytes(t, n), 0xab);
    quantize_row(t, zeros.data(), q.data(), n);
    for (float v : testing::dequantized(t, q.data(), n)) ASSERT_EQ(v, 0.0f) << ggml_type_name(t);
  }
}

TEST(Iq4Formats, ActivationPartnersAreLlamaCpps) {
  EXPECT_EQ(activation_type(GgmlType::IQ4_NL), GgmlType::Q8_0);
  EXPECT_EQ(activation_type(GgmlType::MXFP4), GgmlType::Q8_0);
  EXPECT_EQ(activation_type(GgmlType::IQ4_XS), GgmlType::Q8_K);
  for (GgmlType t : kIq4Types) {
    EXPECT_TRUE(can_compute(t)) << ggml_type_name(t);
    EXPECT_TRUE(can_quantize(t)) << ggml_type_name(t);
  }
}

// Random weight bytes (every nibble, every sub-block scale), quantizer-made scales, activations of varied
// magnitude: each ISA's kernel returns exactly the reference's float, for even and odd block counts.
TEST(Iq4Formats, EveryIsaEqualsTheReferenceBitForBit) {
  std::mt19937 rng(27);
  std::uniform_int_distribution<int> byte(0, 255);
  const auto& ref = detail::scalar_kernels();
  for (GgmlType t : kIq4Types) {
    SCOPED_TRACE(ggml_type_name(t));
    const int64_t bs = testing::block_size(t);
    const GgmlType at = activation_type(t);
    for (int64_t nb : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 64}) {
      const int64_t n = nb * bs;
      for (int rep = 0; rep < 4; ++rep) {
        const auto wf = random_floats(rng, n, rep == 3 ? 1e-3f : 1.0f);
        std::vector<uint8_t> w(detail::row_bytes(t, n));
        quantize_row(t, wf.data(), w.data(), n);
        if (rep % 2 == 1) {  // re-randomize the nibbles (and IQ4_XS's sub-block scales), keep d / e
          const auto g = detail::geometry(t);
          const size_t keep = t == GgmlType::MXFP4 ? 1 : 2;
          for (int64_t b = 0; b < nb; ++b) {
            for (size_t k = keep; k < static_cast<size_t>(g.block_bytes); ++k) {
              w[static_cast<size_t>(b * g.block_bytes) + k] = static_cast<uint8_t>(byte(rng));
            }
          }
        }
        const auto x = random_floats(rng, n, rep == 2 ? 30.0f : 1.0f);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        ref.quantize_act[detail::slot(at)](x.data(), act.data(), n);
        const float want = ref.dot[detail::slot(t)](w.data(), act.data(), n);
        for (Isa isa : available_isas()) {
          const auto& k = detail::kernels_for(isa);
          ASSERT_EQ(k.dot[detail::slot(t)](w.data(), act.data(), n), want) << isa_name(isa) << " n=" << n;
          ASSERT_EQ(k.dot_id[detail::slot(t)](w.data(), act.data(), n), want) << isa_name(isa) << " n=" << n;
        }
      }
    }
  }
}

// The reference dot against a double-precision sum of the dequantized weights times the dequantized
// activations: the layouts of weights and activations agree (a wrong element order fails this).
TEST(Iq4Formats, ReferenceDotMatchesDequantizedProduct) {
  std::mt19937 rng(2027);
  for (GgmlType t : kIq4Types) {
    const int64_t n = 1024;
    const auto wf = random_floats(rng, n);
    const auto x = random_floats(rng, n);
    std::vector<uint8_t> w(detail::row_bytes(t, n)), act(activation_row_bytes(t, n));
    quantize_row(t, wf.data(), w.data(), n);
    quantize_activation(t, x.data(), act.data(), n);
    const auto wd = testing::dequantized(t, w.data(), n);
    const auto ad = testing::dequantized(activation_type(t), act.data(), n);
    double want = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      want += double(wd[i]) * ad[i];
      mag += std::fabs(double(wd[i]) * ad[i]);
    }
    EXPECT_NEAR(detail::scalar_kernels().dot[detail::slot(t)](w.data(), act.data(), n), want, 1e-5 * mag)
        << ggml_type_name(t);
  }
}

}  // namespace
}  // namespace car::tensor

namespace car::tensor {
namespace {

// IQ2_XXS and IQ1_S (issue #27's codebook formats; both written by synth). Random blocks under a sane fp16
// scale (every grid index, sign code, group scale and delta sign is valid): every ISA's dot equals the
// reference bit for bit, and the reference equals the double-precision product of the dequantized rows.
std::vector<uint8_t> random_codebook_row(GgmlType t, std::mt19937& rng, int64_t n) {
  std::vector<uint8_t> row(detail::row_bytes(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const uint16_t d = fp32_to_fp16(scale(rng));
    std::memcpy(row.data() + b * detail::geometry(t).block_bytes, &d, 2);  // d first in both blocks
  }
  return row;
}

TEST(Iq2Xxs, ComputedAndOnlyIq2XxsWritten) {
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::IQ1_S}) {
    EXPECT_TRUE(can_compute(t)) << ggml_type_name(t);
    EXPECT_EQ(activation_type(t), GgmlType::Q8_K) << ggml_type_name(t);
  }
  EXPECT_TRUE(can_quantize(GgmlType::IQ2_XXS));
  EXPECT_TRUE(can_quantize(GgmlType::IQ1_S));  // since slice 2 (quantize_codebook.cpp)
}

// The plain IQ2_XXS quantizer: N(0, 1) rows come back within the format's resolution (2.06 bits a weight;
// measured 0.33 rel rms), zero rows as zeros, and a grid point times a scale the file can hold exactly.
TEST(Iq2Xxs, QuantizerRoundTrip) {
  std::mt19937 rng(11);
  const int64_t n = 4096;
  const auto x = random_floats(rng, n);
  std::vector<uint8_t> q(detail::row_bytes(GgmlType::IQ2_XXS, n));
  quantize_row(GgmlType::IQ2_XXS, x.data(), q.data(), n);
  const auto y = testing::dequantized(GgmlType::IQ2_XXS, q.data(), n);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(x[i]) * x[i];
  }
  std::printf("  IQ2_XXS rel rms error %.4f\n", std::sqrt(err / ref));
  EXPECT_LT(std::sqrt(err / ref), 0.40);
  EXPECT_GT(std::sqrt(err / ref), 0.0);

  const std::vector<float> zeros(256, 0.0f);
  quantize_row(GgmlType::IQ2_XXS, zeros.data(), q.data(), 256);
  for (float v : testing::dequantized(GgmlType::IQ2_XXS, q.data(), 256)) ASSERT_EQ(v, 0.0f);

  // Every group: grid point 1 (43, 8 x 7) with signs (+ - + + + + + -: two negatives), scale 15, d 1/16.
  std::vector<float> on_grid(256);
  for (int g = 0; g < 8; ++g) {
    for (int l = 0; l < 4; ++l) {
      for (int j = 0; j < 8; ++j) {
        const float mag = j == 0 ? 43.0f : 8.0f;
        const bool neg = j == 1 || j == 7;
        on_grid[static_cast<size_t>(32 * g + 8 * l + j)] = (neg ? -mag : mag) * (15.5f / 4.0f) / 16.0f;
      }
    }
  }
  quantize_row(GgmlType::IQ2_XXS, on_grid.data(), q.data(), 256);
  EXPECT_EQ(testing::dequantized(GgmlType::IQ2_XXS, q.data(), 256), on_grid);
}

TEST(Iq1S, HandBuiltBlockDequantizes) {
  block_iq1_s b{};
  b.d = fp32_to_fp16(0.5f);
  b.qs[0] = 1;                     // group 0, point 0: grid index 1 (0xffffffffffffff01: element 0 is 1)
  b.qh[0] = (2u << 12) | 0x8000u;  // scale 2 -> 5, delta -0.125
  std::vector<float> y(256);
  dequantize_row(GgmlType::IQ1_S, &b, y.data(), 256);
  EXPECT_EQ(y[0], 0.5f * 5 * (1 - 0.125f));
  EXPECT_EQ(y[1], 0.5f * 5 * (-1 - 0.125f));
  EXPECT_EQ(y[8], 0.5f * 5 * (-1 - 0.125f));   // point 1: grid index 0, all -1
  EXPECT_EQ(y[32], 0.5f * 1 * (-1 + 0.125f));  // group 1: scale 0 -> 1, delta +0.125
}

TEST(Iq2Xxs, HandBuiltBlockDequantizes) {
  block_iq2_xxs b{};
  b.d = fp32_to_fp16(1.0f);
  // group 0: grid points 0 (all 8) and 1 (0x080808080808082b: element 0 is 43), sign code 1 on point 0
  // (element 0 negated, and bit 7 for parity), scale 3 -> (0.5 + 3) * 0.25 = 0.875
  const uint32_t grid = 0 | (1u << 8) | (0u << 16) | (0u << 24);
  const uint32_t signs = 1u | (3u << 28);
  std::memcpy(b.qs, &grid, 4);
  std::memcpy(b.qs + 2, &signs, 4);
  std::vector<float> y(256);
  dequantize_row(GgmlType::IQ2_XXS, &b, y.data(), 256);
  EXPECT_EQ(y[0], -8 * 0.875f);  // sign bit 0
  EXPECT_EQ(y[1], 8 * 0.875f);
  EXPECT_EQ(y[7], -8 * 0.875f);  // the parity bit: one other negation -> bit 7
  EXPECT_EQ(y[8], 43 * 0.875f);  // point 1, element 0
  EXPECT_EQ(y[9], 8 * 0.875f);
  EXPECT_EQ(y[32], 8 * 0.125f);  // group 1: all zero bytes -> point 0, scale 0 -> 0.125
}

TEST(Iq2Xxs, EveryIsaEqualsTheReferenceAndTheDequantizedProduct) {
  std::mt19937 rng(2);
  const auto& ref = detail::scalar_kernels();
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::IQ1_S}) {
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    for (int64_t nb : {1, 2, 3, 5, 16}) {
      const int64_t n = nb * QK_K;
      for (int rep = 0; rep < 4; ++rep) {
        const auto w = random_codebook_row(t, rng, n);
        const auto x = random_floats(rng, n, rep == 3 ? 40.0f : 1.0f);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        ref.quantize_act[detail::slot(GgmlType::Q8_K)](x.data(), act.data(), n);
        const float want = ref.dot[detail::slot(t)](w.data(), act.data(), n);
        for (Isa isa : available_isas()) {
          const auto& k = detail::kernels_for(isa);
          ASSERT_EQ(k.dot[detail::slot(t)](w.data(), act.data(), n), want) << isa_name(isa);
        }
        const auto wd = testing::dequantized(t, w.data(), n);
        const auto ad = testing::dequantized(GgmlType::Q8_K, act.data(), n);
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += double(wd[i]) * ad[i];
          mag += std::fabs(double(wd[i]) * ad[i]);
        }
        EXPECT_NEAR(want, exact, 1e-5 * mag) << "nb " << nb;
      }
    }
  }
}

}  // namespace
}  // namespace car::tensor
