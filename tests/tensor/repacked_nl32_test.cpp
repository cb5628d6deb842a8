// Q4_0, IQ4_NL and MXFP4 matrices with a row count that is a multiple of 8, which llama.cpp's x86 CPU backend
// repacks (block_q4_0x8 / block_iq4_nlx8 / block_mxfp4x8) and multiplies with one gemv / gemm template whose
// orders are one: an exact integer per 32-element block, times the scales' product by FMA, in block order
// (kernel_table.h repacked(), dot_*_repacked_ref):
//   - every table's gemv / gemm dot, multi-row gemv and matmul tile equal the reference bit for bit, over row
//     counts (whole and partial groups of 16), vector counts 1..64 and activation scales (zero included);
//   - the reference computes the dot product, in another order than ggml_vec_dot's (some rows differ);
//   - MXFP4's E8M0 scales decode lane-wise as the reference decodes them, the subnormal ones included;
//   - matmul, matmul_ordered and matvec agree, and a forced-off ISA gives the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/avx_vnni.h"
#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::random_floats;

constexpr GgmlType kNl32Types[] = {GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4};

std::string where(GgmlType t, Isa isa) {
  return std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa));
}

void expect_same_bits(float got, float want, const std::string& what) {
  ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << what << ": " << got << " vs " << want;
}

TEST(RepackedNl32, DotAndRowsKernelsOfEveryIsaEqualTheReference) {
  std::mt19937 rng(41);
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (GgmlType t : kNl32Types) {
    const detail::DotFn oracle = ref.dot_gemv[detail::slot(t)];
    ASSERT_NE(oracle, nullptr) << ggml_type_name(t);
    ASSERT_EQ(ref.dot_gemm[detail::slot(t)], oracle) << "one order for gemv and gemm";
    for (Isa isa : available_isas()) {
      const detail::DotKernels& k = detail::kernels_for(isa);
      ASSERT_NE(k.dot_gemv[detail::slot(t)], nullptr) << where(t, isa);
      ASSERT_NE(k.dot_gemm[detail::slot(t)], nullptr) << where(t, isa);
      const detail::RowsFn rows = k.rows_gemv[detail::slot(t)];
      for (int64_t nb : {1, 2, 3, 7, 8, 16, 33}) {
        const int64_t cols = nb * 32, nrows = 19;
        const size_t rb = detail::row_bytes(t, cols);
        const auto w = testing::quantize_rows(t, random_floats(rng, cols * nrows), nrows, cols);
        const auto acts = testing::q8_0_acts(rng, 8, cols, 5);
        const size_t ab = detail::row_bytes(GgmlType::Q8_0, cols);
        for (int64_t v = 0; v < 8; ++v) {
          const uint8_t* act = acts.data() + ab * static_cast<size_t>(v);
          std::vector<float> multi(static_cast<size_t>(nrows) + 1, -7.0f);
          if (rows != nullptr) rows(w.data(), rb, nrows, act, cols, multi.data());
          for (int64_t r = 0; r < nrows; ++r) {
            const uint8_t* row = w.data() + rb * static_cast<size_t>(r);
            const float want = oracle(row, act, cols);
            const std::string what = where(t, isa) + " nb " + std::to_string(nb) + " v " + std::to_string(v) +
                                     " row " + std::to_string(r);
            expect_same_bits(k.dot_gemv[detail::slot(t)](row, act, cols), want, what + " gemv");
            expect_same_bits(k.dot_gemm[detail::slot(t)](row, act, cols), want, what + " gemm");
            if (rows != nullptr) expect_same_bits(multi[static_cast<size_t>(r)], want, what + " rows");
          }
          EXPECT_EQ(multi.back(), -7.0f) << "the rows kernel wrote past its rows";
        }
      }
    }
  }
  if (detect_isa() == Isa::avx512) {
    for (GgmlType t : kNl32Types) {
      EXPECT_NE(detail::kernels_for(Isa::avx512).rows_gemv[detail::slot(t)], nullptr) << ggml_type_name(t);
    }
  }
}

TEST(RepackedNl32, TilesEqualTheReferenceForEveryRowAndVectorCount) {
  std::mt19937 rng(42);
  const detail::DotKernels& ref = detail::scalar_kernels();
  constexpr int64_t kMaxRows = 48, kMaxVec = 64;
  int tables = 0;
  for (GgmlType t : kNl32Types) {
    for (Isa isa : available_isas()) {
      const detail::RepackedTileFn tile = detail::kernels_for(isa).tile_repacked[detail::slot(t)];
      if (tile == nullptr) continue;
      ++tables;
      for (int64_t nb : {1, 5, 12}) {
        const int64_t cols = nb * 32;
        const size_t rb = detail::row_bytes(t, cols), ab = detail::row_bytes(GgmlType::Q8_0, cols);
        const auto w = testing::quantize_rows(t, random_floats(rng, cols * kMaxRows), kMaxRows, cols);
        const auto acts = testing::q8_0_acts(rng, kMaxVec, cols, 5);
        std::vector<float> want(static_cast<size_t>(kMaxVec * kMaxRows));
        for (int64_t v = 0; v < kMaxVec; ++v) {
          for (int64_t r = 0; r < kMaxRows; ++r) {
            want[static_cast<size_t>(v * kMaxRows + r)] = ref.dot_gemv[detail::slot(t)](
                w.data() + rb * static_cast<size_t>(r), acts.data() + ab * static_cast<size_t>(v), cols);
          }
        }
        std::vector<uint8_t> mixed(kMaxVec);
        for (auto& m : mixed) m = static_cast<uint8_t>(rng() % 2);
        for (const uint8_t* mask : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(mixed.data())}) {
          for (int64_t nrows : {1, 5, 8, 15, 16, 17, 24, 33, 48}) {
            const int64_t ldy = nrows + 3;
            for (int64_t nvec = 1; nvec <= kMaxVec; ++nvec) {
              std::vector<float> y(static_cast<size_t>(nvec * ldy + 3), -7.0f);
              tile(w.data(), rb, nrows, acts.data(), ab, nvec, cols, y.data(), ldy, mask);
              for (int64_t v = 0; v < nvec; ++v) {
                for (int64_t r = 0; r < ldy; ++r) {
                  const float exp = r < nrows ? want[static_cast<size_t>(v * kMaxRows + r)] : -7.0f;
                  const float got = y[static_cast<size_t>(v * ldy + r)];
                  // The message only for a mismatch: built for each of the ~10^7 comparisons it was most of
                  // this test's time (a minute under the sanitizers).
                  if (std::memcmp(&got, &exp, sizeof(float)) == 0) continue;
                  expect_same_bits(got, exp,
                                   where(t, isa) + " nb " + std::to_string(nb) + " nrows " + std::to_string(nrows) +
                                       " nvec " + std::to_string(nvec) + " v " + std::to_string(v) + " r " +
                                       std::to_string(r));
                  if (::testing::Test::HasFatalFailure()) return;
                }
              }
              ASSERT_EQ(y.back(), -7.0f) << "wrote past the last vector";
            }
          }
        }
      }
    }
  }
  if (detect_isa() == Isa::avx512) {
    // Each type's tile at the AVX-512 level, and at the AVX2 level too where that level is AVX-VNNI's table.
    EXPECT_EQ(tables, detail::avx_vnni_kernels() != nullptr ? 6 : 3) << "a table lacks a repacked tile";
  }
}

TEST(RepackedNl32, TheReferenceComputesTheDotProductInAnotherOrderThanVecDot) {
  std::mt19937 rng(43);
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (GgmlType t : kNl32Types) {
    int differs = 0;
    for (Isa isa : available_isas()) {
      const detail::DotKernels& k = detail::kernels_for(isa);
      const int64_t cols = 8 * 32, nrows = 64;
      const size_t rb = detail::row_bytes(t, cols);
      const auto w = testing::quantize_rows(t, random_floats(rng, cols * nrows), nrows, cols);
      const auto acts = testing::q8_0_acts(rng, 1, cols, 5);
      std::vector<float> wd(static_cast<size_t>(cols)), xd(static_cast<size_t>(cols));
      dequantize_row(GgmlType::Q8_0, acts.data(), xd.data(), cols);
      for (int64_t r = 0; r < nrows; ++r) {
        const uint8_t* row = w.data() + rb * static_cast<size_t>(r);
        dequantize_row(t, row, wd.data(), cols);
        double exact = 0.0, mag = 0.0;
        for (int64_t i = 0; i < cols; ++i) {
          exact += static_cast<double>(wd[i]) * xd[i];
          mag += std::fabs(static_cast<double>(wd[i]) * xd[i]);
        }
        const float got = ref.dot_gemv[detail::slot(t)](row, acts.data(), cols);
        EXPECT_NEAR(got, exact, 1e-5 * mag) << ggml_type_name(t) << " " << r;
        differs += got != k.dot[detail::slot(t)](row, acts.data(), cols);
      }
    }
    // Two orders of one float computation: on 64 random rows per table some results differ in the last bits.
    EXPECT_GT(differs, 0) << ggml_type_name(t);
  }
}

// Every E8M0 exponent a block can carry, the subnormal halves (0, 1) and the largest normal ones included,
// decoded lane-wise by the tile and the rows kernel as the reference decodes it.
TEST(RepackedNl32, EveryMxfp4ScaleDecodesAsTheReferenceDecodesIt) {
  std::mt19937 rng(44);
  const detail::DotKernels& ref = detail::scalar_kernels();
  const int64_t cols = 32, nrows = 256;  // one block per row, row r with exponent r
  std::vector<block_mxfp4> w(static_cast<size_t>(nrows));
  for (int64_t r = 0; r < nrows; ++r) {
    w[static_cast<size_t>(r)].e = static_cast<uint8_t>(r);
    for (auto& q : w[static_cast<size_t>(r)].qs) q = static_cast<uint8_t>(rng());
  }
  const auto acts = testing::q8_0_acts(rng, 4, cols, 5);
  const size_t ab = detail::row_bytes(GgmlType::Q8_0, cols);
  const auto* bytes = reinterpret_cast<const uint8_t*>(w.data());
  for (Isa isa : available_isas()) {
    const detail::DotKernels& k = detail::kernels_for(isa);
    const detail::RepackedTileFn tile = k.tile_repacked[detail::slot(GgmlType::MXFP4)];
    if (tile == nullptr) continue;
    std::vector<float> y(static_cast<size_t>(4 * nrows));
    tile(bytes, sizeof(block_mxfp4), nrows, acts.data(), ab, 4, cols, y.data(), nrows, nullptr);
    for (int64_t v = 0; v < 4; ++v) {
      for (int64_t r = 0; r < nrows; ++r) {
        const float want = ref.dot_gemv[detail::slot(GgmlType::MXFP4)](bytes + r * sizeof(block_mxfp4),
                                                                       acts.data() + ab * v, cols);
        expect_same_bits(y[static_cast<size_t>(v * nrows + r)], want,
                         std::string(isa_name(isa)) + " exponent " + std::to_string(r) + " v " + std::to_string(v));
      }
    }
  }
}

// Through the public entry points: a batch's rows equal matvec's (the same order), matmul equals
// matmul_ordered whatever the mask, every ISA gives the same bits, and a matrix whose row count is not a
// multiple of 8 keeps ggml_vec_dot's order.
TEST(RepackedNl32, ProductsAgreeAcrossEntryPointsAndIsas) {
  std::mt19937 rng(45);
  for (GgmlType t : kNl32Types) {
    const int64_t cols = 6 * 32, rows = 40, n = 11;
    const auto w = testing::quantize_rows(t, random_floats(rng, cols * rows), rows, cols);
    const MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
    const auto x = random_floats(rng, n * cols);
    std::vector<std::vector<float>> by_isa;
    for (Isa isa : available_isas()) {
      testing::IsaScope scope(isa);
      std::vector<float> y(static_cast<size_t>(n * rows)), yo(static_cast<size_t>(n * rows)),
          col(static_cast<size_t>(rows));
      matmul(view, x.data(), n, cols, y.data(), rows, nullptr);
      std::vector<uint8_t> mask(static_cast<size_t>(n));
      for (auto& m : mask) m = static_cast<uint8_t>(rng() % 2);
      matmul_ordered(view, x.data(), n, cols, yo.data(), rows, mask.data(), nullptr);
      ASSERT_EQ(std::memcmp(y.data(), yo.data(), sizeof(float) * y.size()), 0) << where(t, isa);
      for (int64_t i = 0; i < n; ++i) {
        matvec(view, x.data() + i * cols, col.data(), nullptr);
        ASSERT_EQ(std::memcmp(y.data() + i * rows, col.data(), sizeof(float) * rows), 0) << where(t, isa) << " " << i;
      }
      by_isa.push_back(std::move(y));
    }
    for (size_t j = 1; j < by_isa.size(); ++j) {
      EXPECT_EQ(std::memcmp(by_isa[j].data(), by_isa[0].data(), sizeof(float) * by_isa[0].size()), 0)
          << where(t, available_isas()[j]);
    }
    // 36 rows: not repacked, so ggml_vec_dot's order (the dot kernel of the table)
    const MatrixView odd{t, w.data(), cols, 36, detail::row_bytes(t, cols)};
    ASSERT_FALSE(detail::repacked(odd));
    std::vector<float> y(36);
    matvec(odd, x.data(), y.data(), nullptr);
    std::vector<uint8_t> act(detail::row_bytes(GgmlType::Q8_0, cols));
    detail::quantize_act_q8_0(x.data(), act.data(), cols);
    for (int64_t r = 0; r < 36; ++r) {
      expect_same_bits(y[static_cast<size_t>(r)], dot_row(t, w.data() + r * view.row_bytes, act.data(), cols),
                       std::string(ggml_type_name(t)) + " unrepacked row " + std::to_string(r));
    }
  }
}

}  // namespace
}  // namespace car::tensor
