// matvec / matmul: every output equals the single-row dot product of the same kernel (threads and tiling
// change only which thread computes a row, never its arithmetic), for every type and ISA; for the matrices
// llama.cpp repacks (Q4_K with rows % 8 == 0) that kernel is its gemv order, or its gemm order for the whole
// groups of 4 vectors of a mul_mat batch (testing::product_dot).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/util/thread_pool.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::computable_types;
using testing::IsaScope;
using testing::random_floats;

TEST(Matvec, EqualsRowDotsForEveryTypeThreadCountAndIsa) {
  std::mt19937 rng(21);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (GgmlType t : computable_types()) {
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)));
      const int64_t cols = 512, rows = 300;  // large enough for the threaded path (> 96 KB for most types)
      const auto wf = random_floats(rng, cols * rows);
      const auto w = testing::quantize_rows(t, wf, rows, cols);
      const MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
      const auto x = random_floats(rng, cols);
      std::vector<uint8_t> act(activation_row_bytes(t, cols));
      quantize_activation(t, x.data(), act.data(), cols);
      std::vector<float> y1(rows), y2(rows);
      matvec(view, x.data(), y1.data(), nullptr);
      matvec(view, x.data(), y2.data(), &pool);
      for (int64_t r = 0; r < rows; ++r) {
        const float want = testing::product_dot(view, r, act.data(), 0, 1);
        ASSERT_EQ(y1[r], want) << r;
        ASSERT_EQ(y2[r], want) << r;
      }
    }
  }
}

TEST(Matmul, EqualsMatvecPerVectorWithStrides) {
  std::mt19937 rng(22);
  ThreadPool pool(2);
  for (GgmlType t : computable_types()) {
    SCOPED_TRACE(ggml_type_name(t));
    const int64_t cols = 256, rows = 200;
    const auto wf = random_floats(rng, cols * rows);
    const auto w = testing::quantize_rows(t, wf, rows, cols);
    const MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
    for (int64_t n : {2, 7, 8, 19}) {
      const int64_t ldx = cols + 3, ldy = rows + 5;
      const auto x = random_floats(rng, n * ldx);
      std::vector<float> y(static_cast<size_t>(n * ldy), -1.0f), y1(static_cast<size_t>(n * ldy), -1.0f);
      matmul(view, x.data(), n, ldx, y.data(), ldy, &pool);
      matmul(view, x.data(), n, ldx, y1.data(), ldy, nullptr);
      std::vector<float> col(rows);
      std::vector<uint8_t> act(activation_row_bytes(t, cols));
      for (int64_t i = 0; i < n; ++i) {
        matvec(view, x.data() + i * ldx, col.data(), nullptr);
        quantize_activation(t, x.data() + i * ldx, act.data(), cols);
        // A repacked matrix's whole groups of 4 vectors take llama.cpp's gemm order, the rest matvec's; a
        // batch of 8 or more vectors takes the IQ panel order for the panel types.
        const bool gemm = (detail::repacked(view) && i < detail::gemm_vectors(n)) || (iq_panel_product(view) && n >= 8);
        for (int64_t r = 0; r < rows; ++r) {
          const float want = gemm ? testing::product_dot(view, r, act.data(), i, n) : col[r];
          ASSERT_EQ(y[i * ldy + r], want) << "n=" << n << " i=" << i << " r=" << r;
          ASSERT_EQ(y1[i * ldy + r], want);
        }
        for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -1.0f) << "wrote past the row";
      }
    }
  }
}

// The tile kernels group vectors by eight (a tail by four, padded; the VNNI tiles by 2-4 with exact tails and
// rows by 16), so every vector count from 1 to 17 and a few beyond cover full, padded and mixed groups; odd row
// counts and several block counts per row, in both product orders, each result equal to the dot kernel's (a
// repacked matrix: its order's) bit for bit, on every table (a forced lower ISA takes its own path).
TEST(Matmul, TilesEqualRowDotsForEveryVectorCount) {
  std::mt19937 rng(25);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                       GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      for (int64_t cols : {256, 768, 4864}) {  // 4864: several slabs of blocks (19 K-quant, 152 Q8_0 blocks)
        SCOPED_TRACE(std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)) +
                     " cols=" + std::to_string(cols));
        // Q4_K, Q2_K: a multiple of 8, repacked by llama.cpp; the rest a partial group of 16 rows at the end
        const int64_t rows = t == GgmlType::Q4_K || t == GgmlType::Q2_K ? 40 : 37;
        const auto wf = random_floats(rng, cols * rows);
        const auto w = testing::quantize_rows(t, wf, rows, cols);
        MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
        const int64_t max_n = 33, ldx = cols + 1, ldy = rows + 2;
        // one vector 100x larger, one all zero: extreme activation scales in the same tile
        auto x = random_floats(rng, max_n * ldx);
        for (int64_t c = 0; c < cols; ++c) {
          x[static_cast<size_t>(3 * ldx + c)] *= 100.0f;
          x[static_cast<size_t>(5 * ldx + c)] = 0.0f;
        }
        std::vector<std::vector<uint8_t>> acts(max_n, std::vector<uint8_t>(activation_row_bytes(t, cols)));
        for (int64_t i = 0; i < max_n; ++i) quantize_activation(t, x.data() + i * ldx, acts[i].data(), cols);
        for (ProductOrder order : {ProductOrder::mul_mat, ProductOrder::mul_mat_id}) {
          view.order = order;
          for (int64_t n = 1; n <= max_n; n = n < 17 ? n + 1 : n + 8) {
            std::vector<float> y(static_cast<size_t>(n * ldy), -1.0f),
                y1(static_cast<size_t>(n * ldy), -1.0f);
            matmul(view, x.data(), n, ldx, y.data(), ldy, nullptr);
            matmul(view, x.data(), n, ldx, y1.data(), ldy, &pool);
            for (int64_t i = 0; i < n; ++i) {
              for (int64_t r = 0; r < rows; ++r) {
                const float want = testing::product_dot(view, r, acts[i].data(), i, n);
                ASSERT_EQ(y[i * ldy + r], want) << "n=" << n << " i=" << i << " r=" << r;
                ASSERT_EQ(y1[i * ldy + r], want) << "n=" << n << " i=" << i << " r=" << r;
              }
              for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -1.0f) << "wrote past the row";
            }
          }
        }
      }
    }
  }
}

// Two or three vectors of a repacked product (an expert's rows in a batched decode step) take the matvec
// kernel per vector over sub-chunks of rows that stay in cache: the one-row kernels' bits, over matrices
// of several sub-chunks, in every order mix, threaded or not.
TEST(Matmul, FewRepackedVectorsGiveTheOneRowKernelsBitsAcrossSubChunks) {
  std::mt19937 rng(31);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(std::string(isa_name(isa)));
    const GgmlType t = GgmlType::Q4_K;
    const int64_t cols = 512, rows = 8 * 70;  // 560 rows of 288 bytes: three 64 KiB sub-chunks
    const auto wf = random_floats(rng, cols * rows);
    const auto w = testing::quantize_rows(t, wf, rows, cols);
    MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
    ASSERT_TRUE(detail::repacked(view));
    const int64_t ldx = cols, ldy = rows + 3;
    const auto x = random_floats(rng, 3 * ldx);
    std::vector<std::vector<uint8_t>> acts(3, std::vector<uint8_t>(activation_row_bytes(t, cols)));
    for (int64_t i = 0; i < 3; ++i) quantize_activation(t, x.data() + i * ldx, acts[i].data(), cols);
    const detail::DotKernels& k = detail::kernels_for(current_isa());
    for (ProductOrder order : {ProductOrder::mul_mat, ProductOrder::mul_mat_id}) {
      view.order = order;
      for (int64_t n : {2, 3}) {
        for (unsigned mask = 0; mask < (1u << n); ++mask) {
          std::vector<uint8_t> gemm(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) gemm[static_cast<size_t>(i)] = (mask >> i) & 1u;
          std::vector<float> y(static_cast<size_t>(n * ldy), -1.0f), y1(y);
          matmul_ordered(view, x.data(), n, ldx, y.data(), ldy, gemm.data(), nullptr);
          matmul_ordered(view, x.data(), n, ldx, y1.data(), ldy, gemm.data(), &pool);
          for (int64_t i = 0; i < n; ++i) {
            const bool g = order == ProductOrder::mul_mat && gemm[static_cast<size_t>(i)] != 0;
            for (int64_t r = 0; r < rows; ++r) {
              const uint8_t* row = view.data + static_cast<size_t>(r) * view.row_bytes;
              const float want = (g ? k.dot_gemm : k.dot_gemv)[detail::slot(t)](row, acts[i].data(), cols);
              ASSERT_EQ(y[i * ldy + r], want) << "n=" << n << " mask=" << mask << " i=" << i << " r=" << r;
              ASSERT_EQ(y1[i * ldy + r], want) << "n=" << n << " mask=" << mask << " i=" << i << " r=" << r;
            }
            for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -1.0f) << "wrote past the rows";
          }
        }
      }
    }
  }
}

// matmul_ordered: each vector of a repacked mul_mat product takes the order it is given - the rows of
// several sequences in one batch, each computed as in its own batch - in runs of any length; other types
// and the mul_mat_id order (gemv for every vector) ignore the mask.
TEST(Matmul, OrderedTakesEachVectorsGivenOrder) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q2_K, GgmlType::Q8_0, GgmlType::Q6_K}) {
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)));
      const int64_t cols = 512, rows = 48;
      const auto wf = random_floats(rng, cols * rows);
      const auto w = testing::quantize_rows(t, wf, rows, cols);
      MatrixView view{t, w.data(), cols, rows, detail::row_bytes(t, cols)};
      const int64_t n = 23, ldx = cols, ldy = rows;
      const auto x = random_floats(rng, n * ldx);
      std::vector<std::vector<uint8_t>> acts(n, std::vector<uint8_t>(activation_row_bytes(t, cols)));
      for (int64_t i = 0; i < n; ++i) quantize_activation(t, x.data() + i * ldx, acts[i].data(), cols);
      for (ProductOrder order : {ProductOrder::mul_mat, ProductOrder::mul_mat_id}) {
        view.order = order;
        for (int trial = 0; trial < 4; ++trial) {
          std::vector<uint8_t> gemm(static_cast<size_t>(n));
          for (auto& g : gemm) g = static_cast<uint8_t>(rng() % 2);
          if (trial == 0) std::fill(gemm.begin(), gemm.end(), uint8_t{0});
          std::vector<float> y(static_cast<size_t>(n * ldy)), y1(static_cast<size_t>(n * ldy));
          matmul_ordered(view, x.data(), n, ldx, y.data(), ldy, gemm.data(), nullptr);
          matmul_ordered(view, x.data(), n, ldx, y1.data(), ldy, gemm.data(), &pool);
          const detail::DotKernels& k = detail::kernels_for(current_isa());
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              const uint8_t* row = view.data + static_cast<size_t>(r) * view.row_bytes;
              float want;
              if (detail::repacked(view)) {  // mul_mat_id: every vector in the gemv order
                const bool g = order == ProductOrder::mul_mat && gemm[static_cast<size_t>(i)] != 0;
                want = (g ? k.dot_gemm : k.dot_gemv)[detail::slot(t)](row, acts[i].data(), cols);
              } else {
                want = dot_row(t, row, acts[i].data(), cols, order);
              }
              ASSERT_EQ(y[i * ldy + r], want) << "i=" << i << " r=" << r;
              ASSERT_EQ(y1[i * ldy + r], want) << "i=" << i << " r=" << r;
            }
          }
        }
      }
      // A vector in the gemv order equals matvec's result for it.
      view.order = ProductOrder::mul_mat;
      std::vector<uint8_t> none(static_cast<size_t>(n), 0);
      std::vector<float> y(static_cast<size_t>(n * ldy)), col(static_cast<size_t>(rows));
      matmul_ordered(view, x.data(), n, ldx, y.data(), ldy, none.data(), &pool);
      for (int64_t i = 0; i < n; ++i) {
        matvec(view, x.data() + i * ldx, col.data(), nullptr);
        for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(y[i * ldy + r], col[static_cast<size_t>(r)]);
      }
    }
  }
}

TEST(Matvec, MulMatIdOrderUsesTheSecondKernel) {
  std::mt19937 rng(24);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_K}) {
    SCOPED_TRACE(ggml_type_name(t));
    const int64_t rows = 64;
    const int64_t c = t == GgmlType::Q4_K ? 256 : 320;  // 320: not a multiple of 64, exercises leftovers
    const auto wf = random_floats(rng, c * rows);
    const auto w = testing::quantize_rows(t, wf, rows, c);
    MatrixView view{t, w.data(), c, rows, detail::row_bytes(t, c)};
    view.order = ProductOrder::mul_mat_id;
    const auto x = random_floats(rng, c);
    std::vector<uint8_t> act(activation_row_bytes(t, c));
    quantize_activation(t, x.data(), act.data(), c);
    std::vector<float> y(rows);
    matvec(view, x.data(), y.data(), &pool);
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(y[r], testing::product_dot(view, r, act.data(), 0, 1)) << r;
  }
}

TEST(Matvec, RowStrideLargerThanRow) {
  std::mt19937 rng(23);
  const GgmlType t = GgmlType::Q4_K;
  const int64_t cols = 512, rows = 16;
  const size_t rb = detail::row_bytes(t, cols), stride = rb + 64;
  const auto wf = random_floats(rng, cols * rows);
  std::vector<uint8_t> w(stride * rows, 0xee);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, wf.data() + r * cols, w.data() + r * stride, cols);
  const MatrixView view{t, w.data(), cols, rows, stride};
  const auto x = random_floats(rng, cols);
  std::vector<float> y(rows);
  matvec(view, x.data(), y.data(), nullptr);
  std::vector<uint8_t> act(activation_row_bytes(t, cols));
  quantize_activation(t, x.data(), act.data(), cols);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(y[r], testing::product_dot(view, r, act.data(), 0, 1));
}

// MoE expert products (ProductOrder::mul_mat_id) of the quantized formats sum as mul_mat does, so they get the
// same tile and multi-row kernels: every table's dot_id is its dot for those formats (an AVX-512 table that
// kept the AVX2 kernel in dot_id ran every expert product row by row, with the same bits).
TEST(Matmul, ExpertProductsOfQuantizedFormatsUseTheTiles) {
  for (Isa isa : available_isas()) {
    const detail::DotKernels& k = detail::kernels_for(isa);
    for (GgmlType t : computable_types()) {
      if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) continue;
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)));
      EXPECT_EQ(k.dot_id[detail::slot(t)], k.dot[detail::slot(t)]);
      EXPECT_EQ(detail::tile_for(k, t, ProductOrder::mul_mat_id), detail::tile_for(k, t, ProductOrder::mul_mat));
      EXPECT_EQ(detail::rows_for(k, t, ProductOrder::mul_mat_id), detail::rows_for(k, t, ProductOrder::mul_mat));
    }
  }
}

}  // namespace
}  // namespace car::tensor
