// The products of matrices llama.cpp's x86 CPU backend repacks (kernel_table.h repacked(): Q4_K, and Q2_K
// as its AVX-512 build does, with a row count that is a multiple of 8), which it sums in the order of its
// repacked gemv / gemm kernels (Q4_0, IQ4_NL and MXFP4, repacked too, in repacked_nl32_test.cpp):
//   - every table's gemv / gemm kernels (and the AVX-512 multi-row gemv kernel) equal the scalar references
//     bit for bit on general data - the integer sums are exact and the float steps are the same FMAs;
//   - the references compute the dot product (against a double-precision sum of the dequantized terms);
//   - the gemv and gemm orders are distinct from each other and from ggml_vec_dot's (some rows differ);
//   - which matrices count as repacked;
//   - every table's repacked matmul tiles (the AVX-512 VNNI ones of Q4_K and Q2_K: 16 rows a register,
//   vectors
//     in fours) equal
//     the references for every row count (whole and partial groups of 16), vector count 1..64 and both orders
//     (all gemm, all gemv, mixed runs in one call),
//     and a forced-off ISA falls back to a table whose products have the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::random_floats;

constexpr GgmlType kT = GgmlType::Q4_K;  // the type with a repacked tile
// Every repacked type: gemv / gemm kernels and references (issue #27 added Q2_K).
constexpr GgmlType kRepackedTypes[] = {GgmlType::Q4_K, GgmlType::Q2_K};

struct Case {
  std::vector<uint8_t> w;    // nrows rows
  std::vector<uint8_t> act;  // Q8_K
  std::vector<float> wf, xf;
  int64_t cols = 0, nrows = 0;
  size_t rb = 0;
};

Case make_case(std::mt19937& rng, int64_t nb, int64_t nrows, float x_scale, GgmlType t = kT) {
  Case c;
  c.cols = nb * QK_K;
  c.nrows = nrows;
  c.rb = detail::row_bytes(t, c.cols);
  c.wf = random_floats(rng, c.cols * nrows);
  c.w = testing::quantize_rows(t, c.wf, nrows, c.cols);
  c.xf = random_floats(rng, c.cols, x_scale);
  c.act.resize(activation_row_bytes(t, c.cols));
  detail::quantize_act_q8_K(c.xf.data(), c.act.data(), c.cols);
  return c;
}

TEST(Repacked, KernelsOfEveryIsaEqualTheReferencesBitForBit) {
  std::mt19937 rng(31);
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (GgmlType t : kRepackedTypes) {
    for (Isa isa : available_isas()) {
      const detail::DotKernels& k = detail::kernels_for(isa);
      ASSERT_NE(k.dot_gemv[detail::slot(t)], nullptr) << isa_name(isa);
      ASSERT_NE(k.dot_gemm[detail::slot(t)], nullptr) << isa_name(isa);
      for (int64_t nb : {1, 2, 3, 7, 8, 9, 11, 16, 22}) {
        for (float xs : {1.0f, 1e-3f, 300.0f}) {
          // Row counts around the AVX-512 Q4_K gemv kernel's tiles of 8 rows.
          const int64_t nrows = std::array<int64_t, 3>{9, 1, 16}[static_cast<size_t>(nb % 3)];
          const Case c = make_case(rng, nb, nrows, xs, t);
          std::vector<float> multi(static_cast<size_t>(c.nrows), -7.0f);
          const detail::RowsFn rows = k.rows_gemv[detail::slot(t)];
          if (rows != nullptr) rows(c.w.data(), c.rb, c.nrows, c.act.data(), c.cols, multi.data());
          for (int64_t r = 0; r < c.nrows; ++r) {
            const uint8_t* row = c.w.data() + c.rb * static_cast<size_t>(r);
            const float gv = k.dot_gemv[detail::slot(t)](row, c.act.data(), c.cols);
            const float gm = k.dot_gemm[detail::slot(t)](row, c.act.data(), c.cols);
            const float gv_ref = ref.dot_gemv[detail::slot(t)](row, c.act.data(), c.cols);
            const float gm_ref = ref.dot_gemm[detail::slot(t)](row, c.act.data(), c.cols);
            const std::string where = std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)) +
                                      " nb " + std::to_string(nb) + " row " + std::to_string(r) +
                                      " x scale " + std::to_string(xs);
            ASSERT_EQ(std::memcmp(&gv, &gv_ref, sizeof(float)), 0) << where << ": " << gv << " vs " << gv_ref;
            ASSERT_EQ(std::memcmp(&gm, &gm_ref, sizeof(float)), 0) << where << ": " << gm << " vs " << gm_ref;
            if (rows != nullptr) {
              ASSERT_EQ(std::memcmp(&multi[static_cast<size_t>(r)], &gv_ref, sizeof(float)), 0) << where;
            }
          }
        }
      }
    }
  }
}

// The few-vector gemv kernel (DotKernels::rows_gemv_few: 2-3 vectors share each block's unpacking) gives every
// (row, vector) the gemv reference's bits, for 1..5 vectors (passes of 3, 2 and 1), partial groups of 4 blocks
// and the output stride.
TEST(Repacked, FewVectorGemvKernelEqualsTheGemvReferencePerVector) {
  std::mt19937 rng(35);
  const detail::DotKernels& ref = detail::scalar_kernels();
  int checked = 0;
  for (GgmlType t : kRepackedTypes) {
    for (Isa isa : available_isas()) {
      const detail::TileFn few = detail::kernels_for(isa).rows_gemv_few[detail::slot(t)];
      if (few == nullptr) continue;
      for (int64_t nb : {1, 2, 3, 4, 5, 7, 8, 11, 22}) {
        for (int64_t nvec = 1; nvec <= 5; ++nvec) {
          const int64_t nrows = 1 + static_cast<int64_t>(rng() % 12);
          const Case c = make_case(rng, nb, nrows, 1.0f, t);
          const size_t ab = c.act.size();
          std::vector<uint8_t> acts(ab * static_cast<size_t>(nvec));
          for (int64_t i = 0; i < nvec; ++i) {
            const std::vector<float> x = random_floats(rng, c.cols, i == 2 ? 300.0f : 1.0f);
            detail::quantize_act_q8_K(x.data(), acts.data() + ab * static_cast<size_t>(i), c.cols);
          }
          const int64_t ldy = nrows + 3;
          std::vector<float> y(static_cast<size_t>(ldy * nvec), -7.0f);
          few(c.w.data(), c.rb, nrows, acts.data(), ab, nvec, c.cols, y.data(), ldy);
          for (int64_t i = 0; i < nvec; ++i) {
            for (int64_t r = 0; r < nrows; ++r) {
              const float want = ref.dot_gemv[detail::slot(t)](c.w.data() + c.rb * static_cast<size_t>(r),
                                                               acts.data() + ab * static_cast<size_t>(i), c.cols);
              const float got = y[static_cast<size_t>(i * ldy + r)];
              ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
                  << ggml_type_name(t) << " " << isa_name(isa) << " nb " << nb << " nvec " << nvec << " vector " << i
                  << " row " << r << ": " << got << " vs " << want;
            }
            for (int64_t r = nrows; r < ldy; ++r) ASSERT_EQ(y[static_cast<size_t>(i * ldy + r)], -7.0f);
          }
          ++checked;
        }
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no ISA here has a few-vector gemv kernel (AVX-512 Q4_K)";
}

TEST(Repacked, ReferencesComputeTheDotProductInDistinctOrders) {
  std::mt19937 rng(32);
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (GgmlType t : kRepackedTypes) {
    int gemv_vs_gemm = 0, gemv_vs_vec_dot = 0;
    for (int64_t nb : {1, 4}) {
      const Case c = make_case(rng, nb, 64, 1.0f, t);
      std::vector<float> wd(static_cast<size_t>(c.cols)), xd(static_cast<size_t>(c.cols));
      dequantize_row(GgmlType::Q8_K, c.act.data(), xd.data(), c.cols);
      for (int64_t r = 0; r < c.nrows; ++r) {
        const uint8_t* row = c.w.data() + c.rb * static_cast<size_t>(r);
        dequantize_row(t, row, wd.data(), c.cols);
        double exact = 0.0, mag = 0.0;
        for (int64_t i = 0; i < c.cols; ++i) {
          exact += static_cast<double>(wd[i]) * xd[i];
          mag += std::fabs(static_cast<double>(wd[i]) * xd[i]);
        }
        const float gv = ref.dot_gemv[detail::slot(t)](row, c.act.data(), c.cols);
        const float gm = ref.dot_gemm[detail::slot(t)](row, c.act.data(), c.cols);
        const float vd = ref.dot[detail::slot(t)](row, c.act.data(), c.cols);
        EXPECT_NEAR(gv, exact, 1e-5 * mag) << ggml_type_name(t) << " " << r;
        EXPECT_NEAR(gm, exact, 1e-5 * mag) << ggml_type_name(t) << " " << r;
        gemv_vs_gemm += gv != gm;
        gemv_vs_vec_dot += gv != vd;
      }
    }
    // Three orders of one float computation: on 128 random rows some results must differ in the last bits.
    EXPECT_GT(gemv_vs_gemm, 0) << ggml_type_name(t);
    EXPECT_GT(gemv_vs_vec_dot, 0) << ggml_type_name(t);
  }
}

// The tile sees any chunk of rows (matmul's chunks are whole groups of 16, but the last is short and callers
// may pass any count) and any vector count; rows past nrows and columns past the product are not written.
TEST(Repacked, TilesEqualTheReferencesForEveryRowAndVectorCount) {
  std::mt19937 rng(33);
  const detail::DotKernels& ref = detail::scalar_kernels();
  constexpr int64_t kMaxRows = 48, kMaxVec = 64;
  int tables = 0;
  for (Isa isa : available_isas()) {
    const detail::DotKernels& k = detail::kernels_for(isa);
    for (GgmlType t : kRepackedTypes) {
      const detail::RepackedTileFn tile = k.tile_repacked[detail::slot(t)];
      if (tile == nullptr) continue;
      ++tables;
      for (int64_t nb : {1, 3, 9}) {
        const int64_t cols = nb * QK_K;
        const size_t rb = detail::row_bytes(t, cols);
        const auto wf = random_floats(rng, cols * kMaxRows);
        const auto w = testing::quantize_rows(t, wf, kMaxRows, cols);
        const size_t ab = activation_row_bytes(t, cols);
        std::vector<uint8_t> acts(ab * kMaxVec);
        for (int64_t v = 0; v < kMaxVec; ++v) {
          // extreme activation scales side by side: one vector all zero, one 1000x, one 1e-4x
          const float scale = v == 5 ? 0.0f : v == 6 ? 1000.0f : v == 7 ? 1e-4f : 1.0f;
          const auto xf = random_floats(rng, cols, scale);
          detail::quantize_act_q8_K(xf.data(), acts.data() + ab * static_cast<size_t>(v), cols);
        }
        // want[order][v][r]: 0 gemv, 1 gemm
        std::vector<float> want[2];
        for (int o = 0; o < 2; ++o) {
          want[o].resize(static_cast<size_t>(kMaxVec * kMaxRows));
          const detail::DotFn oracle = o == 1 ? ref.dot_gemm[detail::slot(t)] : ref.dot_gemv[detail::slot(t)];
          for (int64_t v = 0; v < kMaxVec; ++v) {
            for (int64_t r = 0; r < kMaxRows; ++r) {
              want[o][static_cast<size_t>(v * kMaxRows + r)] = oracle(
                  w.data() + rb * static_cast<size_t>(r), acts.data() + ab * static_cast<size_t>(v), cols);
            }
          }
        }
        // orders: every vector gemm, every vector gemv (a null mask), and a batch of mixed runs
        std::vector<uint8_t> mixed(kMaxVec);
        for (auto& m : mixed) m = static_cast<uint8_t>(rng() % 3 == 0 ? 0 : 1);
        const std::vector<uint8_t> all_gemm(kMaxVec, 1);
        const uint8_t* const masks[] = {all_gemm.data(), nullptr, mixed.data()};
        for (const uint8_t* mask : masks) {
          const char* what = mask == nullptr ? "gemv" : mask == all_gemm.data() ? "gemm" : "mixed";
          for (int64_t nrows : {1, 5, 8, 15, 16, 17, 24, 33, 48}) {
            const int64_t ldy = nrows + 3;
            for (int64_t nvec = 1; nvec <= kMaxVec; ++nvec) {
              std::vector<float> y(static_cast<size_t>(nvec * ldy + 3), -7.0f);
              tile(w.data(), rb, nrows, acts.data(), ab, nvec, cols, y.data(), ldy, mask);
              for (int64_t v = 0; v < nvec; ++v) {
                const int o = mask != nullptr && mask[v] != 0 ? 1 : 0;
                for (int64_t r = 0; r < ldy; ++r) {
                  const float got = y[static_cast<size_t>(v * ldy + r)];
                  const float exp = r < nrows ? want[o][static_cast<size_t>(v * kMaxRows + r)] : -7.0f;
                  ASSERT_EQ(std::memcmp(&got, &exp, sizeof(float)), 0)
                      << isa_name(isa) << " " << ggml_type_name(t) << " " << what << " nb " << nb << " nrows "
                      << nrows << " nvec " << nvec << " v " << v << " r " << r << ": " << got << " vs "
                      << exp;
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
    EXPECT_GE(tables, 2) << "the AVX-512 table lacks the repacked Q4_K or Q2_K tile";
  }
}

// The prompt tile in the gemv order is decode's product: a batch's gemv rows equal matvec's bits. And an ISA
// forced below AVX-512 (CAR_INFERENCE_ISA=avx2/scalar: no VNNI tile) still gives the same bits in both
// orders.
TEST(Repacked, ForcedOffIsaFallsBackWithTheSameBits) {
  std::mt19937 rng(34);
  const int64_t cols = 4 * QK_K, rows = 40, n = 13;  // 12 gemm vectors, 1 gemv; a short group of 8 rows
  for (GgmlType t : kRepackedTypes) {
    const auto wf = random_floats(rng, cols * rows);
    const auto w = testing::quantize_rows(t, wf, rows, cols);
    const MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
    const auto x = random_floats(rng, n * cols);
    std::vector<std::vector<float>> by_isa;
    for (Isa isa : available_isas()) {
      testing::IsaScope scope(isa);
      ASSERT_EQ(current_isa(), isa);
      std::vector<float> y(static_cast<size_t>(n * rows)), col(static_cast<size_t>(rows));
      matmul(view, x.data(), n, cols, y.data(), rows, nullptr);
      std::vector<uint8_t> none(static_cast<size_t>(n), 0);
      std::vector<float> yv(static_cast<size_t>(n * rows));
      matmul_ordered(view, x.data(), n, cols, yv.data(), rows, none.data(), nullptr);
      for (int64_t i = 0; i < n; ++i) {
        matvec(view, x.data() + i * cols, col.data(), nullptr);
        ASSERT_EQ(std::memcmp(yv.data() + i * rows, col.data(), sizeof(float) * rows), 0)
            << ggml_type_name(t) << " " << isa_name(isa) << " " << i;
      }
      by_isa.push_back(std::move(y));
    }
    for (size_t j = 1; j < by_isa.size(); ++j) {
      EXPECT_EQ(std::memcmp(by_isa[j].data(), by_isa[0].data(), sizeof(float) * by_isa[0].size()), 0)
          << ggml_type_name(t) << " " << isa_name(available_isas()[j]);
    }
  }
}

TEST(Repacked, OnlyTheTypesLlamaCppRepacksWithRowsAMultipleOf8) {
  MatrixView w;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q2_K, GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4}) {
    w.type = t;
    for (int64_t rows : {8, 16, 256, 512}) {
      w.rows = rows;
      EXPECT_TRUE(detail::repacked(w)) << ggml_type_name(t) << " " << rows;
    }
    for (int64_t rows : {1, 4, 12, 300}) {
      w.rows = rows;
      EXPECT_FALSE(detail::repacked(w)) << ggml_type_name(t) << " " << rows;
    }
  }
  w.rows = 256;
  for (GgmlType t :
       {GgmlType::Q3_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::IQ4_XS, GgmlType::F32}) {
    w.type = t;
    EXPECT_FALSE(detail::repacked(w)) << ggml_type_name(t);
  }
  EXPECT_EQ(detail::gemm_vectors(1), 0);
  EXPECT_EQ(detail::gemm_vectors(4), 4);
  EXPECT_EQ(detail::gemm_vectors(7), 4);
  EXPECT_EQ(detail::gemm_vectors(13), 12);
}

}  // namespace
}  // namespace car::tensor
