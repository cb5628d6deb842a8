// The multi-row matvec kernels (DotKernels::rows): for every ISA table and type that has one, each output
// equals the table's dot kernel on that row bit for bit, for row counts that leave every remainder of the
// kernels' row groups, several block counts, rows further apart than their bytes, and buffers that are not
// 64-byte (or even 8-byte) aligned - though still aligned for the blocks' own fields (2 bytes for the weight
// blocks' fp16 scales, 4 for Q8_K's float scale), as any buffer the engine hands the kernels is.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::computable_types;
using testing::random_floats;

constexpr size_t kW = 2;  // weight buffer offset
constexpr size_t kA = 4;  // activation buffer offset

TEST(RowsKernels, EqualDotBitForBit) {
  std::mt19937 rng(7);
  int checked = 0;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa == Isa::avx512 && detect_isa() != Isa::avx512) continue;
    if (isa == Isa::avx2 && detect_isa() == Isa::scalar) continue;
    const detail::DotKernels& k = detail::kernels_for(isa);
    for (GgmlType t : computable_types()) {
      const detail::RowsFn rows = detail::rows_for(k, t, ProductOrder::mul_mat);
      if (rows == nullptr) continue;
      const detail::DotFn dot = detail::dot_for(k, t, ProductOrder::mul_mat);
      const int64_t bs = testing::block_size(t);
      for (int64_t nb : {1, 2, 3, 8, 17}) {
        const int64_t cols = nb * bs;
        for (size_t pad : {size_t{0}, size_t{6}}) {
          const size_t stride = detail::row_bytes(t, cols) + pad;
          for (int64_t nrows : {1, 2, 3, 4, 5, 7, 9}) {
            // Weights 2 bytes and activations 4 bytes off a 64-byte boundary; the padding between rows is garbage.
            std::vector<uint8_t> w(stride * static_cast<size_t>(nrows) + kW, 0xa5);
            for (int64_t r = 0; r < nrows; ++r) {
              const auto wf = random_floats(rng, cols);
              quantize_row(t, wf.data(), w.data() + kW + stride * static_cast<size_t>(r), cols);
            }
            const auto x = random_floats(rng, cols);
            std::vector<uint8_t> act(activation_row_bytes(t, cols) + kA);
            k.quantize_act[static_cast<int>(activation_type(t))](x.data(), act.data() + kA, cols);
            std::vector<float> y(static_cast<size_t>(nrows) + 1, -7.0f);
            rows(w.data() + kW, stride, nrows, act.data() + kA, cols, y.data());
            for (int64_t r = 0; r < nrows; ++r) {
              const float want = dot(w.data() + kW + stride * static_cast<size_t>(r), act.data() + kA, cols);
              ASSERT_EQ(std::memcmp(&y[static_cast<size_t>(r)], &want, sizeof(float)), 0)
                  << isa_name(isa) << " " << ggml_type_name(t) << " nb " << nb << " nrows " << nrows
                  << " row " << r << ": " << y[static_cast<size_t>(r)] << " vs " << want;
            }
            ASSERT_EQ(y[static_cast<size_t>(nrows)], -7.0f) << "wrote past the last row";
            ++checked;
          }
        }
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no table has a rows kernel on this CPU";
}

}  // namespace
}  // namespace car::tensor
