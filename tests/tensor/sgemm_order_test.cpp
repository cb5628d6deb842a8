// ProductOrder::sgemm (kernels.h): llamafile's tinyBLAS_Q0_AVX order, which ggml's mul_mat runs on a
// non-repacked quantized product of a batch of 2 or more vectors. For IQ4_NL it differs from
// ggml_vec_dot_iq4_nl_q8_0's (one 8-lane accumulator over the blocks, where vec_dot pairs them into two and
// takes an odd last block as one exact integer):
//   - every table's sgemm dot equals the scalar reference bit for bit, over block counts and activation
//     scales (zero included), and matvec / matvec_fused / matmul of a view in that order give those bits, for
//     any row count (a view in the sgemm order is never repacked);
//   - the reference computes the dot product, in another order than vec_dot's (some rows differ);
//   - the order changes nothing for the types whose tinyBLAS order is vec_dot's (Q8_0, Q4_0, Q5_0).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::random_floats;

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

TEST(SgemmOrder, Iq4NlDotOfEveryIsaEqualsTheReference) {
  std::mt19937 rng(61);
  const detail::DotFn oracle = detail::scalar_kernels().dot_sgemm[detail::slot(GgmlType::IQ4_NL)];
  ASSERT_NE(oracle, nullptr);
  for (Isa isa : available_isas()) {
    const detail::DotKernels& k = detail::kernels_for(isa);
    const detail::DotFn dot = k.dot_sgemm[detail::slot(GgmlType::IQ4_NL)];
    ASSERT_NE(dot, nullptr) << isa_name(isa);
    for (int64_t nb : {1, 2, 3, 4, 7, 8, 33}) {
      const int64_t cols = nb * 32, nrows = 24;
      const size_t rb = detail::row_bytes(GgmlType::IQ4_NL, cols);
      const auto w = testing::quantize_rows(GgmlType::IQ4_NL, random_floats(rng, cols * nrows), nrows, cols);
      const auto acts = testing::q8_0_acts(rng, 4, cols, 1);
      const size_t ab = detail::row_bytes(GgmlType::Q8_0, cols);
      for (int64_t v = 0; v < 4; ++v) {
        for (int64_t r = 0; r < nrows; ++r) {
          const uint8_t* row = w.data() + rb * static_cast<size_t>(r);
          const uint8_t* act = acts.data() + ab * static_cast<size_t>(v);
          const float want = oracle(row, act, cols), got = dot(row, act, cols);
          ASSERT_TRUE(same_bits(got, want)) << isa_name(isa) << " nb " << nb << " v " << v << " row " << r << ": "
                                            << got << " vs " << want;
        }
      }
    }
  }
}

TEST(SgemmOrder, TheIq4NlReferenceIsTheDotProductInAnotherOrderThanVecDot) {
  std::mt19937 rng(62);
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (int64_t nb : {1, 2, 5}) {  // one block: 8 rounded lane products against one exact integer
    const int64_t cols = nb * 32, nrows = 256;
    const size_t rb = detail::row_bytes(GgmlType::IQ4_NL, cols);
    const auto w = testing::quantize_rows(GgmlType::IQ4_NL, random_floats(rng, cols * nrows), nrows, cols);
    const auto act = testing::q8_0_acts(rng, 1, cols, 1);
    std::vector<float> wd(static_cast<size_t>(cols)), xd(static_cast<size_t>(cols));
    dequantize_row(GgmlType::Q8_0, act.data(), xd.data(), cols);
    int differs = 0;
    for (int64_t r = 0; r < nrows; ++r) {
      const uint8_t* row = w.data() + rb * static_cast<size_t>(r);
      dequantize_row(GgmlType::IQ4_NL, row, wd.data(), cols);
      double exact = 0.0, mag = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        exact += static_cast<double>(wd[i]) * xd[i];
        mag += std::fabs(static_cast<double>(wd[i]) * xd[i]);
      }
      const float got = ref.dot_sgemm[detail::slot(GgmlType::IQ4_NL)](row, act.data(), cols);
      EXPECT_NEAR(got, exact, 1e-5 * mag) << "nb " << nb << " row " << r;
      differs += !same_bits(got, ref.dot[detail::slot(GgmlType::IQ4_NL)](row, act.data(), cols));
    }
    EXPECT_GT(differs, 0) << "nb " << nb << ": two orders of one float computation differ on some of 256 rows";
  }
}

// Through the public products: each result of a view in the sgemm order is the table's sgemm dot of its row,
// also for a row count llama.cpp would repack as a 2-D weight (16); other types ignore the order.
TEST(SgemmOrder, ProductsOfAViewInTheOrderGiveItsDotForAnyRowCount) {
  std::mt19937 rng(63);
  for (Isa isa : available_isas()) {
    const testing::IsaScope scope(isa);
    const detail::DotKernels& k = detail::kernels_for(isa);
    for (GgmlType t : {GgmlType::IQ4_NL, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0}) {
      for (int64_t nrows : {7, 16, 37}) {
        const int64_t cols = 96;
        const auto xs = random_floats(rng, cols * 3);
        const auto bytes = testing::quantize_rows(t, random_floats(rng, cols * nrows), nrows, cols);
        MatrixView w{t, bytes.data(), cols, nrows, detail::row_bytes(t, cols), ProductOrder::sgemm};
        const std::string what = std::string(isa_name(isa)) + " " + std::string(ggml_type_name(t)) + " rows " +
                                 std::to_string(nrows);
        std::vector<float> mv(static_cast<size_t>(nrows)), fused(static_cast<size_t>(nrows)),
            mm(static_cast<size_t>(3 * nrows));
        matvec(w, xs.data(), mv.data(), nullptr);
        MatvecTask task{w, xs.data(), fused.data()};
        matvec_fused(&task, 1, nullptr);
        matmul(w, xs.data(), 3, cols, mm.data(), nrows, nullptr);
        std::vector<uint8_t> act(detail::row_bytes(GgmlType::Q8_0, cols));
        for (int64_t v = 0; v < 3; ++v) {
          detail::quantize_act_q8_0(xs.data() + v * cols, act.data(), cols);
          for (int64_t r = 0; r < nrows; ++r) {
            const uint8_t* row = bytes.data() + w.row_bytes * static_cast<size_t>(r);
            const float want = detail::dot_for(k, t, ProductOrder::sgemm)(row, act.data(), cols);
            if (t != GgmlType::IQ4_NL) {
              ASSERT_TRUE(same_bits(want, k.dot[detail::slot(t)](row, act.data(), cols))) << what;
            }
            ASSERT_TRUE(same_bits(mm[static_cast<size_t>(v * nrows + r)], want)) << what << " matmul v " << v;
            if (v == 0) {
              ASSERT_TRUE(same_bits(mv[static_cast<size_t>(r)], want)) << what << " matvec row " << r;
              ASSERT_TRUE(same_bits(fused[static_cast<size_t>(r)], want)) << what << " matvec_fused row " << r;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace car::tensor
