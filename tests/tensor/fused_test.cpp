// matvec_fused: every output equals what a separate matvec of the same task returns, bit for bit, for every
// type, ISA, thread count, mixed weight types over one shared input, distinct inputs, and the mul_mat_id
// order.
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

/// A quantized random matrix that owns its bytes.
struct Matrix {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

Matrix random_matrix(std::mt19937& rng, GgmlType t, int64_t rows, int64_t cols,
                     ProductOrder order = ProductOrder::mul_mat) {
  Matrix m;
  m.bytes = testing::quantize_rows(t, random_floats(rng, rows * cols), rows, cols);
  m.view = MatrixView{t, m.bytes.data(), cols, rows, detail::row_bytes(t, cols), order};
  return m;
}

/// Run the tasks fused (with and without a pool) and one by one, and compare every output exactly. Outputs
/// get one guard element past the end that neither path may write.
void expect_fused_equals_separate(const std::vector<Matrix>& mats, const std::vector<const float*>& xs,
                                  ThreadPool* pool) {
  const size_t n = mats.size();
  std::vector<std::vector<float>> fused(n), inline_fused(n), separate(n);
  std::vector<MatvecTask> tasks(n), inline_tasks(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t rows = static_cast<size_t>(mats[i].view.rows);
    fused[i].assign(rows + 1, -7.0f);
    inline_fused[i].assign(rows + 1, -7.0f);
    separate[i].assign(rows, 0.0f);
    tasks[i] = {mats[i].view, xs[i], fused[i].data()};
    inline_tasks[i] = {mats[i].view, xs[i], inline_fused[i].data()};
    matvec(mats[i].view, xs[i], separate[i].data(), nullptr);
  }
  matvec_fused(tasks.data(), n, pool);
  matvec_fused(inline_tasks.data(), n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const size_t rows = separate[i].size();
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_EQ(fused[i][r], separate[i][r]) << "task " << i << " row " << r;
      ASSERT_EQ(inline_fused[i][r], separate[i][r]) << "task " << i << " row " << r;
    }
    ASSERT_EQ(fused[i][rows], -7.0f) << "task " << i << " wrote past its output";
    ASSERT_EQ(inline_fused[i][rows], -7.0f) << "task " << i << " wrote past its output";
  }
}

TEST(MatvecFused, SharedInputEqualsSeparateMatvecsForEveryTypeAndIsa) {
  std::mt19937 rng(31);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (GgmlType t : computable_types()) {
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)));
      const int64_t cols = 512;
      // Q/K/V-like: three heights over one input, large enough in total for the threaded path.
      std::vector<Matrix> mats;
      for (int64_t rows : {256, 128, 77}) mats.push_back(random_matrix(rng, t, rows, cols));
      const auto x = random_floats(rng, cols);
      expect_fused_equals_separate(mats, {x.data(), x.data(), x.data()}, &pool);
    }
  }
}

TEST(MatvecFused, MixedTypesAndDistinctInputs) {
  std::mt19937 rng(32);
  ThreadPool pool(3);
  const int64_t cols = 1024;
  // One input shared by weights of different activation types (Q8_K, Q8_0, F32, F16), a second input shared
  // by two K-quants, and a third used once: each rounding must go to the right tasks.
  std::vector<Matrix> mats;
  mats.push_back(random_matrix(rng, GgmlType::Q4_K, 300, cols));
  mats.push_back(random_matrix(rng, GgmlType::Q8_0, 200, cols));
  mats.push_back(random_matrix(rng, GgmlType::F32, 40, cols));
  mats.push_back(random_matrix(rng, GgmlType::Q6_K, 150, cols));
  mats.push_back(random_matrix(rng, GgmlType::F16, 64, cols));
  mats.push_back(random_matrix(rng, GgmlType::Q4_K, 180, cols));
  mats.push_back(random_matrix(rng, GgmlType::Q6_K, 90, cols));
  mats.push_back(random_matrix(rng, GgmlType::Q5_0, 33, cols));
  const auto x0 = random_floats(rng, cols);
  const auto x1 = random_floats(rng, cols);
  const auto x2 = random_floats(rng, cols);
  const std::vector<const float*> xs = {x0.data(), x0.data(), x0.data(), x0.data(),
                                        x0.data(), x1.data(), x1.data(), x2.data()};
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    expect_fused_equals_separate(mats, xs, &pool);
  }
}

TEST(MatvecFused, ExpertsInMulMatIdOrderWithDifferentWidths) {
  // An MoE decode step: two experts' gate and up (rows ff, cols embd) over one input, then their downs
  // (rows embd, cols ff) over two inputs, in ProductOrder::mul_mat_id (float formats sum differently there).
  std::mt19937 rng(33);
  ThreadPool pool(2);
  const int64_t embd = 256, ff = 512;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K}) {
    SCOPED_TRACE(ggml_type_name(t));
    std::vector<Matrix> up;
    for (int e = 0; e < 4; ++e) up.push_back(random_matrix(rng, t, ff, embd, ProductOrder::mul_mat_id));
    const auto x = random_floats(rng, embd);
    expect_fused_equals_separate(up, {x.data(), x.data(), x.data(), x.data()}, &pool);
    std::vector<Matrix> down;
    for (int e = 0; e < 2; ++e) down.push_back(random_matrix(rng, t, embd, ff, ProductOrder::mul_mat_id));
    const auto h0 = random_floats(rng, ff);
    const auto h1 = random_floats(rng, ff);
    expect_fused_equals_separate(down, {h0.data(), h1.data()}, &pool);
  }
}

TEST(MatvecFused, EmptyAndTinyGroups) {
  std::mt19937 rng(34);
  ThreadPool pool(2);
  matvec_fused(nullptr, 0, &pool);
  std::vector<Matrix> mats;
  mats.push_back(random_matrix(rng, GgmlType::Q8_0, 1, 32));
  mats.push_back(random_matrix(rng, GgmlType::Q8_0, 0, 32));
  const auto x = random_floats(rng, 32);
  expect_fused_equals_separate(mats, {x.data(), x.data()}, &pool);
}

}  // namespace
}  // namespace car::tensor
