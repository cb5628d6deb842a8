// The second slice of issue #27's codebook formats - IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M - and the ternary
// TQ1_0, TQ2_0: every ISA's dot
// kernel equal to the scalar reference bit for bit over sizes (random blocks: every grid index, sign, scale
// and delta; and the quantizer's blocks), the reference equal to the double-precision product of the
// dequantized rows, and the quantizers' round trips. Their bits against llama.cpp's own kernels:
// iq4_llama_cpp_test.cpp (IqSlice2LlamaCpp) with tests/data/reference/iq27/kernel_goldens.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/codebook.h"
#include "core/tensor/first_min.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::random_floats;

constexpr GgmlType kSlice2Types[] = {GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ2_XS, GgmlType::IQ2_S,
                               GgmlType::IQ1_M,   GgmlType::TQ1_0, GgmlType::TQ2_0};

/// Random bytes with a sane fp16 super-block scale (IQ1_M keeps it in the top nibbles of its scale words, the
/// TQ formats in their last two bytes).
std::vector<uint8_t> random_row(GgmlType t, std::mt19937& rng, int64_t n) {
  std::vector<uint8_t> row(detail::row_bytes(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  const auto bb = static_cast<size_t>(detail::geometry(t).block_bytes);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    uint8_t* block = row.data() + static_cast<size_t>(b) * bb;
    const uint16_t d = fp32_to_fp16(scale(rng));
    if (t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0) {
      std::memcpy(block + bb - 2, &d, 2);
    } else if (t == GgmlType::IQ1_M) {
      for (int k = 0; k < 4; ++k) {
        uint8_t& top = block[offsetof(block_iq1_m, scales) + 2 * k + 1];
        top = static_cast<uint8_t>((top & 0x0f) | (((d >> (4 * k)) & 15) << 4));
      }
    } else {
      std::memcpy(block, &d, 2);
    }
  }
  return row;
}

TEST(IqSlice2, ComputedAndWrittenWithQ8KActivations) {
  for (GgmlType t : kSlice2Types) {
    EXPECT_TRUE(can_compute(t)) << ggml_type_name(t);
    EXPECT_TRUE(can_quantize(t)) << ggml_type_name(t);
    EXPECT_EQ(activation_type(t), GgmlType::Q8_K) << ggml_type_name(t);
  }
}

TEST(IqSlice2, EveryIsaEqualsTheReferenceAndTheDequantizedProduct) {
  std::mt19937 rng(272);
  const auto& ref = detail::scalar_kernels();
  for (GgmlType t : kSlice2Types) {
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    for (int64_t nb : {1, 2, 3, 5, 16}) {
      const int64_t n = nb * QK_K;
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<uint8_t> w;
        if (rep == 4) {  // the quantizer's blocks
          const auto wf = random_floats(rng, n);
          w.resize(detail::row_bytes(t, n));
          quantize_row(t, wf.data(), w.data(), n);
        } else {
          w = random_row(t, rng, n);
        }
        const auto x = random_floats(rng, n, rep == 3 ? 40.0f : 1.0f);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        ref.quantize_act[detail::slot(GgmlType::Q8_K)](x.data(), act.data(), n);
        const float want = ref.dot[detail::slot(t)](w.data(), act.data(), n);
        for (Isa isa : available_isas()) {
          const auto& k = detail::kernels_for(isa);
          ASSERT_EQ(k.dot[detail::slot(t)](w.data(), act.data(), n), want) << isa_name(isa) << " nb " << nb;
          ASSERT_EQ(k.dot_id[detail::slot(t)](w.data(), act.data(), n), want) << isa_name(isa) << " nb " << nb;
        }
        const auto wd = testing::dequantized(t, w.data(), n);
        const auto ad = testing::dequantized(GgmlType::Q8_K, act.data(), n);
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += double(wd[i]) * ad[i];
          mag += std::fabs(double(wd[i]) * ad[i]);
        }
        EXPECT_NEAR(want, exact, 1e-5 * mag) << "nb " << nb << " rep " << rep;
      }
    }
  }
}

// N(0, 1) rows come back within each format's resolution (relative rms error bounds a little above what the
// quantizer measured, printed; the ternary formats' d = max|x| rounds most of a Gaussian row to 0, as
// llama-quantize's does - they are made for ternary-trained weights), zero rows as zeros.
TEST(IqSlice2, QuantizerRoundTrip) {
  struct RoundTripCase {
    GgmlType t;
    double max_rel_rms;
  };
  for (const RoundTripCase& c : {RoundTripCase{GgmlType::IQ3_XXS, 0.20}, RoundTripCase{GgmlType::IQ3_S, 0.17}, RoundTripCase{GgmlType::IQ2_XS, 0.33},
                        RoundTripCase{GgmlType::IQ2_S, 0.30}, RoundTripCase{GgmlType::IQ1_M, 0.50},
                        RoundTripCase{GgmlType::TQ1_0, 0.80}, RoundTripCase{GgmlType::TQ2_0, 0.80}, RoundTripCase{GgmlType::IQ1_S, 0.55}}) {
    SCOPED_TRACE(std::string(ggml_type_name(c.t)));
    std::mt19937 rng(11);
    const int64_t n = 4096;
    const auto x = random_floats(rng, n);
    std::vector<uint8_t> q(detail::row_bytes(c.t, n));
    quantize_row(c.t, x.data(), q.data(), n);
    const auto y = testing::dequantized(c.t, q.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      ref += double(x[i]) * x[i];
    }
    std::printf("  %s rel rms error %.4f\n", std::string(ggml_type_name(c.t)).c_str(), std::sqrt(err / ref));
    EXPECT_LT(std::sqrt(err / ref), c.max_rel_rms);
    EXPECT_GT(std::sqrt(err / ref), 0.0);

    const std::vector<float> zeros(512, 0.0f);
    quantize_row(c.t, zeros.data(), q.data(), 512);
    for (float v : testing::dequantized(c.t, q.data(), 512)) ASSERT_EQ(v, 0.0f);
  }
}

// A row whose weights are one grid point's values at a scale the file can hold comes back exactly (signs,
// indices and scales all decoded where the quantizer put them).
TEST(IqSlice2, OnGridValuesRoundTripExactly) {
  for (GgmlType t : kSlice2Types) {
    if (t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0) continue;  // TernaryValuesRoundTripExactly
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    std::mt19937 rng(5);
    // Dequantize random blocks whose scales are all the top code and d a power of two: every value is then
    // a representable grid value, and quantizing the values must give the same values back.
    auto w = random_row(t, rng, QK_K);
    const uint16_t d = fp32_to_fp16(1.0f / 64);
    if (t == GgmlType::IQ1_M) {
      uint16_t sc[4];
      std::memcpy(sc, w.data() + offsetof(block_iq1_m, scales), 8);
      for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(0x0fff | (((d >> (4 * k)) & 15) << 12));
      std::memcpy(w.data() + offsetof(block_iq1_m, scales), sc, 8);
    } else {
      std::memcpy(w.data(), &d, 2);
      const size_t at = t == GgmlType::IQ3_S    ? offsetof(block_iq3_s, scales)
                        : t == GgmlType::IQ2_XS ? offsetof(block_iq2_xs, scales)
                        : t == GgmlType::IQ2_S  ? offsetof(block_iq2_s, scales)
                                                : 0;
      if (t == GgmlType::IQ3_XXS) {
        for (int g = 0; g < 8; ++g) w[2 + QK_K / 4 + 4 * g + 3] |= 0xf0;  // bits 28..31 of each group's word
      } else {
        for (size_t k = at; k < w.size(); ++k) w[k] = 0xff;
      }
    }
    const auto values = testing::dequantized(t, w.data(), QK_K);
    std::vector<uint8_t> q(w.size());
    quantize_row(t, values.data(), q.data(), QK_K);
    EXPECT_EQ(testing::dequantized(t, q.data(), QK_K), values);
  }
}

// TQ1_0 / TQ2_0: -d, 0, +d with d the row's max come back exactly (every trit position of both packings).
TEST(IqSlice2, TernaryValuesRoundTripExactly) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> trit(-1, 1);
  for (GgmlType t : {GgmlType::TQ1_0, GgmlType::TQ2_0}) {
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    std::vector<float> x(512);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.375f * static_cast<float>(i % 256 == 7 ? 1 : trit(rng));
    std::vector<uint8_t> q(detail::row_bytes(t, 512));
    quantize_row(t, x.data(), q.data(), 512);
    EXPECT_EQ(testing::dequantized(t, q.data(), 512), x);
  }
}

}  // namespace
}  // namespace car::tensor

// The quantizers' grid searches take the first of the least errors; the AVX2 search must settle on the same
// index as the scalar scan, ties, NaNs and infinities included.
TEST(FirstMin, Avx2SettlesOnTheScalarScansIndex) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 here";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> level(0, 5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 8 * (1 + trial % 32);
    std::vector<float> err(static_cast<size_t>(n));
    for (float& e : err) {
      const int l = level(rng);  // few distinct values, so ties are common
      e = l == 5 ? (trial % 3 == 0 ? NAN : INFINITY) : static_cast<float>(l);
    }
    if (trial % 7 == 0) std::fill(err.begin(), err.end(), trial % 2 ? INFINITY : NAN);
    EXPECT_EQ(car::tensor::detail::first_min_avx2(err.data(), n), car::tensor::detail::first_min(err.data(), n))
        << "trial " << trial;
  }
  const float one[8] = {3, 2, 1, 1, 2, 3, 1, 0.5f};
  EXPECT_EQ(car::tensor::detail::first_min(one, 8), 7);
  EXPECT_EQ(car::tensor::detail::first_min(one, 6), 2);
}
