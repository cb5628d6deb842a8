// llama.cpp's IQ panel order (core/tensor/iq_panel.h) for the eight grid-based IQ types:
//   - the panel's decode (integers times one float factor) is each type's dequantizer bit for bit;
//   - the reference is the dequantized product to float precision;
//   - every ISA's panel kernel equals the reference bit for bit, threaded or not, and matmul takes the
//     panel for 8 or more vectors and the dot order below; matmul_ordered takes it per vector as marked;
//   - products that are not panel products (expert matrices, row counts not a multiple of 8, other types)
//     never take it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_panel.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/util/thread_pool.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::available_isas;
using testing::IsaScope;
using testing::random_floats;

constexpr GgmlType kPanelTypes[] = {GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS,
                                    GgmlType::IQ3_S,   GgmlType::IQ1_S,  GgmlType::IQ1_M, GgmlType::IQ4_XS};

/// Random bytes (every grid index, sign, scale and delta) with a sane fp16 super-block scale; every fourth row
/// from the quantizer instead.
std::vector<uint8_t> random_rows(GgmlType t, std::mt19937& rng, int64_t rows, int64_t n) {
  const size_t rb = detail::row_bytes(t, n);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  const auto bb = static_cast<size_t>(detail::geometry(t).block_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + rb * static_cast<size_t>(r);
    if (r % 4 == 3) {
      const auto x = random_floats(rng, n);
      quantize_row(t, x.data(), row, n);
      continue;
    }
    for (int64_t b = 0; b < n / QK_K; ++b) {
      uint8_t* block = row + static_cast<size_t>(b) * bb;
      const uint16_t d = fp32_to_fp16(scale(rng));
      if (t == GgmlType::IQ1_M) {
        for (int k = 0; k < 4; ++k) {
          uint8_t& top = block[offsetof(block_iq1_m, scales) + 2 * k + 1];
          top = static_cast<uint8_t>((top & 0x0f) | (((d >> (4 * k)) & 15) << 4));
        }
      } else {
        std::memcpy(block, &d, 2);
      }
    }
  }
  return w;
}

TEST(IqPanel, TheEightTypesAndNoOthers) {
  for (GgmlType t : kPanelTypes) EXPECT_TRUE(detail::iq_panel_type(t)) << ggml_type_name(t);
  for (GgmlType t : {GgmlType::F32, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4,
                     GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::Q2_K}) {
    EXPECT_FALSE(detail::iq_panel_type(t)) << ggml_type_name(t);
  }
  MatrixView w{GgmlType::IQ4_XS, nullptr, 256, 16, detail::row_bytes(GgmlType::IQ4_XS, 256)};
  EXPECT_TRUE(iq_panel_product(w));
  w.rows = 12;  // not a multiple of 8
  EXPECT_FALSE(iq_panel_product(w));
  w.rows = 16;
  w.order = ProductOrder::mul_mat_id;  // an expert's matrix
  EXPECT_FALSE(iq_panel_product(w));
}

// dfac * iscale * q is the dequantized weight bit for bit (llama.cpp's GGML_IQP_VERIFY), for every type.
TEST(IqPanel, DecodeIsTheDequantizer) {
  std::mt19937 rng(2712);
  for (GgmlType t : kPanelTypes) {
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    const int64_t n = 64 * QK_K;
    const auto w = random_rows(t, rng, 1, n);
    const auto ref = testing::dequantized(t, w.data(), n);
    const auto bb = static_cast<size_t>(detail::geometry(t).block_bytes);
    detail::PanelBlock pb;
    for (int64_t b = 0; b < n / QK_K; ++b) {
      detail::iq_panel_decode(t, w.data() + static_cast<size_t>(b) * bb, pb);
      int32_t wsum = 0;
      for (int j = 0; j < QK_K; ++j) {
        const float scale = pb.dfac * static_cast<float>(pb.iscale[j / detail::kIqPanelSub]);
        ASSERT_EQ(scale * static_cast<float>(pb.q[j]), ref[static_cast<size_t>(b * QK_K + j)])
            << "block " << b << " weight " << j;
        wsum += pb.iscale[j / detail::kIqPanelSub] * pb.q[j];
      }
      ASSERT_EQ(pb.wsum, wsum);
    }
  }
}

// The reference against the dequantized product in double precision.
TEST(IqPanel, ReferenceIsTheProduct) {
  std::mt19937 rng(27);
  for (GgmlType t : kPanelTypes) {
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    for (int64_t nb : {1, 3, 8}) {
      const int64_t n = nb * QK_K;
      const auto w = random_rows(t, rng, 4, n);
      const size_t rb = detail::row_bytes(t, n);
      for (int64_t r = 0; r < 4; ++r) {
        const auto x = random_floats(rng, n, r == 2 ? 30.0f : 1.0f);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        quantize_activation(t, x.data(), act.data(), n);
        const float got = dot_row_panel(t, w.data() + rb * static_cast<size_t>(r), act.data(), n);
        const auto wd = testing::dequantized(t, w.data() + rb * static_cast<size_t>(r), n);
        const auto ad = testing::dequantized(GgmlType::Q8_K, act.data(), n);
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += double(wd[static_cast<size_t>(i)]) * ad[static_cast<size_t>(i)];
          mag += std::fabs(double(wd[static_cast<size_t>(i)]) * ad[static_cast<size_t>(i)]);
        }
        EXPECT_NEAR(got, exact, 1e-5 * mag) << "nb " << nb << " row " << r;
      }
    }
  }
}

// matmul: 8 or more vectors in the panel order, fewer in the dot order; matmul_ordered per vector as marked;
// every ISA, with and without threads, bit for bit.
TEST(IqPanel, MatmulTakesThePanelAsLlamaCppDoes) {
  std::mt19937 rng(8);
  ThreadPool pool(3);
  for (GgmlType t : kPanelTypes) {
    SCOPED_TRACE(std::string(ggml_type_name(t)));
    const int64_t rows = 40;
    const int64_t n = 2 * QK_K;
    const size_t rb = detail::row_bytes(t, n);
    const auto w = random_rows(t, rng, rows, n);
    const MatrixView view{t, w.data(), n, rows, rb};
    for (int64_t nvec : {1, 5, 7, 8, 13}) {
      const auto x = random_floats(rng, n * nvec);
      std::vector<uint8_t> acts(activation_row_bytes(t, n) * static_cast<size_t>(nvec));
      for (int64_t i = 0; i < nvec; ++i) {
        quantize_activation(t, x.data() + i * n, acts.data() + activation_row_bytes(t, n) * static_cast<size_t>(i), n);
      }
      // Marks: alternate vectors panel.
      std::vector<uint8_t> gemm(static_cast<size_t>(nvec), 0);
      std::vector<uint8_t> mark(static_cast<size_t>(nvec));
      for (int64_t i = 0; i < nvec; ++i) mark[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 2 == 0);
      auto want = [&](int64_t i, int64_t r, bool panel) {
        const uint8_t* row = w.data() + rb * static_cast<size_t>(r);
        const uint8_t* act = acts.data() + activation_row_bytes(t, n) * static_cast<size_t>(i);
        return panel ? dot_row_panel(t, row, act, n) : detail::scalar_kernels().dot[detail::slot(t)](row, act, n);
      };
      for (Isa isa : available_isas()) {
        IsaScope scope(isa);
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> y(static_cast<size_t>(nvec * rows), -1.0f);
          matmul(view, x.data(), nvec, n, y.data(), rows, p);
          std::vector<float> ym(static_cast<size_t>(nvec * rows), -1.0f);
          matmul_ordered(view, x.data(), nvec, n, ym.data(), rows, gemm.data(), mark.data(), p);
          for (int64_t i = 0; i < nvec; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(y[static_cast<size_t>(i * rows + r)], want(i, r, nvec >= 8))
                  << isa_name(isa) << " nvec " << nvec << " vector " << i << " row " << r;
              ASSERT_EQ(ym[static_cast<size_t>(i * rows + r)], want(i, r, i % 2 == 0))
                  << isa_name(isa) << " marked, nvec " << nvec << " vector " << i << " row " << r;
            }
          }
        }
      }
    }
  }
}

// Expert matrices (mul_mat_id) and row counts not a multiple of 8 keep the dot order in any batch.
TEST(IqPanel, OtherProductsKeepTheDotOrder) {
  std::mt19937 rng(9);
  const GgmlType t = GgmlType::IQ4_XS;
  const int64_t n = QK_K;
  const size_t rb = detail::row_bytes(t, n);
  for (int64_t rows : {12, 16}) {
    const auto w = random_rows(t, rng, rows, n);
    MatrixView view{t, w.data(), n, rows, rb};
    if (rows == 16) view.order = ProductOrder::mul_mat_id;
    const int64_t nvec = 9;
    const auto x = random_floats(rng, n * nvec);
    std::vector<float> y(static_cast<size_t>(nvec * rows));
    matmul(view, x.data(), nvec, n, y.data(), rows, nullptr);
    std::vector<uint8_t> act(activation_row_bytes(t, n));
    for (int64_t i = 0; i < nvec; ++i) {
      quantize_activation(t, x.data() + i * n, act.data(), n);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(y[static_cast<size_t>(i * rows + r)], dot_row(t, w.data() + rb * static_cast<size_t>(r), act.data(), n, view.order))
            << "rows " << rows << " vector " << i << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace car::tensor
