// The products of matrices llama.cpp's x86 CPU backend repacks (kernel_table.h repacked(): Q4_K with a row
// count that is a multiple of 8), which it sums in the order of its repacked gemv / gemm kernels:
//   - every table's gemv / gemm kernels (and the AVX-512 multi-row gemv kernel) equal the scalar references
//     bit for bit on general data - the integer sums are exact and the float steps are the same FMAs;
//   - the references compute the dot product (against a double-precision sum of the dequantized terms);
//   - the gemv and gemm orders are distinct from each other and from ggml_vec_dot's (some rows differ);
//   - which matrices count as repacked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

constexpr GgmlType kT = GgmlType::Q4_K;

struct Case {
  std::vector<uint8_t> w;    // nrows rows
  std::vector<uint8_t> act;  // Q8_K
  std::vector<float> wf, xf;
  int64_t cols = 0, nrows = 0;
  size_t rb = 0;
};

Case make_case(std::mt19937& rng, int64_t nb, int64_t nrows, float x_scale) {
  Case c;
  c.cols = nb * QK_K;
  c.nrows = nrows;
  c.rb = detail::row_bytes(kT, c.cols);
  c.wf = random_floats(rng, c.cols * nrows);
  c.w = testing::quantize_rows(kT, c.wf, nrows, c.cols);
  c.xf = random_floats(rng, c.cols, x_scale);
  c.act.resize(activation_row_bytes(kT, c.cols));
  detail::quantize_act_q8_K(c.xf.data(), c.act.data(), c.cols);
  return c;
}

TEST(Repacked, KernelsOfEveryIsaEqualTheReferencesBitForBit) {
  std::mt19937 rng(31);
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (Isa isa : available_isas()) {
    const detail::DotKernels& k = detail::kernels_for(isa);
    ASSERT_NE(k.dot_gemv[detail::slot(kT)], nullptr) << isa_name(isa);
    ASSERT_NE(k.dot_gemm[detail::slot(kT)], nullptr) << isa_name(isa);
    for (int64_t nb : {1, 2, 3, 7, 8, 9, 11, 16, 22}) {
      for (float xs : {1.0f, 1e-3f, 300.0f}) {
        const Case c = make_case(rng, nb, 9, xs);
        std::vector<float> multi(static_cast<size_t>(c.nrows), -7.0f);
        const detail::RowsFn rows = k.rows_gemv[detail::slot(kT)];
        if (rows != nullptr) rows(c.w.data(), c.rb, c.nrows, c.act.data(), c.cols, multi.data());
        for (int64_t r = 0; r < c.nrows; ++r) {
          const uint8_t* row = c.w.data() + c.rb * static_cast<size_t>(r);
          const float gv = k.dot_gemv[detail::slot(kT)](row, c.act.data(), c.cols);
          const float gm = k.dot_gemm[detail::slot(kT)](row, c.act.data(), c.cols);
          const float gv_ref = ref.dot_gemv[detail::slot(kT)](row, c.act.data(), c.cols);
          const float gm_ref = ref.dot_gemm[detail::slot(kT)](row, c.act.data(), c.cols);
          const std::string where = std::string(isa_name(isa)) + " nb " + std::to_string(nb) + " row " +
                                    std::to_string(r) + " x scale " + std::to_string(xs);
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

TEST(Repacked, ReferencesComputeTheDotProductInDistinctOrders) {
  std::mt19937 rng(32);
  const detail::DotKernels& ref = detail::scalar_kernels();
  int gemv_vs_gemm = 0, gemv_vs_vec_dot = 0;
  for (int64_t nb : {1, 4}) {
    const Case c = make_case(rng, nb, 64, 1.0f);
    std::vector<float> wd(static_cast<size_t>(c.cols)), xd(static_cast<size_t>(c.cols));
    dequantize_row(GgmlType::Q8_K, c.act.data(), xd.data(), c.cols);
    for (int64_t r = 0; r < c.nrows; ++r) {
      const uint8_t* row = c.w.data() + c.rb * static_cast<size_t>(r);
      dequantize_row(kT, row, wd.data(), c.cols);
      double exact = 0.0, mag = 0.0;
      for (int64_t i = 0; i < c.cols; ++i) {
        exact += static_cast<double>(wd[i]) * xd[i];
        mag += std::fabs(static_cast<double>(wd[i]) * xd[i]);
      }
      const float gv = ref.dot_gemv[detail::slot(kT)](row, c.act.data(), c.cols);
      const float gm = ref.dot_gemm[detail::slot(kT)](row, c.act.data(), c.cols);
      const float vd = ref.dot[detail::slot(kT)](row, c.act.data(), c.cols);
      EXPECT_NEAR(gv, exact, 1e-5 * mag) << r;
      EXPECT_NEAR(gm, exact, 1e-5 * mag) << r;
      gemv_vs_gemm += gv != gm;
      gemv_vs_vec_dot += gv != vd;
    }
  }
  // Three orders of one float computation: on 128 random rows some results must differ in the last bits.
  EXPECT_GT(gemv_vs_gemm, 0);
  EXPECT_GT(gemv_vs_vec_dot, 0);
}

TEST(Repacked, OnlyQ4KMatricesWithRowsAMultipleOf8) {
  MatrixView w;
  w.type = GgmlType::Q4_K;
  for (int64_t rows : {8, 16, 256, 512}) {
    w.rows = rows;
    EXPECT_TRUE(detail::repacked(w)) << rows;
  }
  for (int64_t rows : {1, 4, 12, 300}) {
    w.rows = rows;
    EXPECT_FALSE(detail::repacked(w)) << rows;
  }
  w.rows = 256;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32}) {
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
