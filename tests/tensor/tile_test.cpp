// The matmul tiles (DotKernels::tile: Q8_0, Q4_1, Q5_0, Q5_1, Q2_K and Q4_K in the vec_dot order, Q3_K, Q5_K,
// Q6_K) called directly, as matmul's chunks call them: every (row, vector) result equals the same table's dot
// kernel bit for bit, for every row count (whole and partial groups of 16: the VNNI tiles pack rows 16 to a
// register), every vector count 1..64 (the tiles switch kernels by count and run vectors in groups with odd
// tails), several block counts (one block, a few, more than one slab), extreme activation scales side by
// side, and extreme weights (Q8_0 bytes of -128 and 127, which the VNNI tile's +128 offset must carry
// exactly). Nothing is written past the rows or the last vector.
#include <gtest/gtest.h>

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

constexpr int64_t kMaxRows = 48, kMaxVec = 64;

/// Overwrite some Q8_0 quants with the extremes a file may hold (the reference quantizer never writes -128).
void add_extreme_q8_0(std::vector<uint8_t>& w, std::mt19937& rng) {
  auto* b = reinterpret_cast<block_q8_0*>(w.data());
  const size_t nb = w.size() / sizeof(block_q8_0);
  for (size_t i = 0; i < nb; i += 3) {
    for (int j = 0; j < QK8_0; ++j) {
      if (rng() % 4 == 0) b[i].qs[j] = static_cast<int8_t>(rng() % 2 == 0 ? -128 : 127);
    }
  }
}

}  // namespace

// The AVX-512 table's Q5_K tile is two kernels split by vector count (matmul_avx512.cpp tile_q5_K); the VNNI
// one (matmul_k_vnni.cpp) is also called directly below so that it meets every count too.
namespace detail::avx512 {
void tile_q5_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
}  // namespace detail::avx512

namespace {

TEST(Tiles, EqualTheDotKernelForEveryRowAndVectorCount) {
  std::mt19937 rng(41);
  int tiles = 0;
  for (Isa isa : available_isas()) {
    const detail::DotKernels& k = detail::kernels_for(isa);
    for (int entry = 0; entry < 10; ++entry) {
      constexpr GgmlType kTileTypes[] = {GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                     GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                     GgmlType::Q6_K, GgmlType::Q5_K};
      const GgmlType t = kTileTypes[entry];
      // entry 9: the VNNI Q5_K kernel alone, on the AVX-512 level
      const bool direct = entry == 9;
      if (direct && isa != Isa::avx512) continue;
      const detail::TileFn tile = direct ? detail::avx512::tile_q5_K_vnni : k.tile[detail::slot(t)];
      if (tile == nullptr) continue;
      ++tiles;
      const detail::DotFn dot = k.dot[detail::slot(t)];
      const bool k_quant = testing::block_size(t) == QK_K;
      for (int64_t nb : k_quant ? std::vector<int64_t>{1, 3, 9} : std::vector<int64_t>{1, 7, 70}) {
        const int64_t cols = nb * testing::block_size(t);
        const size_t rb = detail::row_bytes(t, cols);
        const auto wf = random_floats(rng, cols * kMaxRows);
        auto w = testing::quantize_rows(t, wf, kMaxRows, cols);
        if (t == GgmlType::Q8_0) add_extreme_q8_0(w, rng);
        const size_t ab = activation_row_bytes(t, cols);
        std::vector<uint8_t> acts(ab * kMaxVec);
        for (int64_t v = 0; v < kMaxVec; ++v) {
          const float scale = v == 5 ? 0.0f : v == 6 ? 1000.0f : v == 7 ? 1e-4f : 1.0f;
          const auto xf = random_floats(rng, cols, scale);
          quantize_activation(t, xf.data(), acts.data() + ab * static_cast<size_t>(v), cols);
        }
        std::vector<float> want(static_cast<size_t>(kMaxVec * kMaxRows));
        for (int64_t v = 0; v < kMaxVec; ++v) {
          for (int64_t r = 0; r < kMaxRows; ++r) {
            want[static_cast<size_t>(v * kMaxRows + r)] =
                dot(w.data() + rb * static_cast<size_t>(r), acts.data() + ab * static_cast<size_t>(v), cols);
          }
        }
        for (int64_t nrows : {1, 5, 15, 16, 17, 33, 48}) {
          const int64_t ldy = nrows + 3;
          for (int64_t nvec = 1; nvec <= kMaxVec; ++nvec) {
            std::vector<float> y(static_cast<size_t>(nvec * ldy + 3), -7.0f);
            tile(w.data(), rb, nrows, acts.data(), ab, nvec, cols, y.data(), ldy);
            for (int64_t v = 0; v < nvec; ++v) {
              for (int64_t r = 0; r < ldy; ++r) {
                const float got = y[static_cast<size_t>(v * ldy + r)];
                const float exp = r < nrows ? want[static_cast<size_t>(v * kMaxRows + r)] : -7.0f;
                ASSERT_EQ(std::memcmp(&got, &exp, sizeof(float)), 0)
                    << isa_name(isa) << " " << ggml_type_name(t) << " nb " << nb << " nrows " << nrows
                    << " nvec " << nvec << " v " << v << " r " << r << ": " << got << " vs " << exp;
              }
            }
            ASSERT_EQ(y.back(), -7.0f) << "wrote past the last vector";
          }
        }
      }
    }
  }
  if (detect_isa() == Isa::avx512) {
    EXPECT_GE(tiles, 10) << "the AVX-512 table lacks one of the nine tiles";
  }
}

}  // namespace
}  // namespace car::tensor
