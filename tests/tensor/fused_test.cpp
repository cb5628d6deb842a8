// matvec_fused and matmul_fused: every output equals what a separate matvec / matmul of the same task
// returns, bit for bit, for every type, ISA, thread count, mixed weight types over one shared input, distinct
// inputs, the mul_mat_id order, and (matmul_fused) any vector counts, per-vector orders and panel masks, and
// interleaved matrices.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <new>
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

/// One product of a matmul_fused test: a matrix, its input (n x cols, row stride ldx), and its orders.
struct MmCase {
  const MatrixView* w;
  const float* x;
  int64_t n;
  int64_t ldx = 0;  // 0: cols
  const uint8_t* gemm = nullptr;
  const uint8_t* panel = nullptr;
};

/// Run the cases fused (on `pool` and inline) and each by its own matmul / matmul_ordered, and compare every
/// output exactly. Outputs have a row stride of rows + 2, whose two guard elements neither path may write.
void expect_matmul_fused_equals_separate(const std::vector<MmCase>& cases, ThreadPool* pool) {
  const size_t n = cases.size();
  std::vector<std::vector<float>> fused(n), inline_fused(n), separate(n);
  std::vector<MatmulTask> tasks(n), inline_tasks(n);
  for (size_t i = 0; i < n; ++i) {
    const MmCase& c = cases[i];
    const MatrixView& w = *c.w;
    const int64_t ldx = c.ldx != 0 ? c.ldx : w.cols, ldy = w.rows + 2;
    const size_t size = static_cast<size_t>(ldy * std::max<int64_t>(c.n, 1));
    fused[i].assign(size, -7.0f);
    inline_fused[i].assign(size, -7.0f);
    separate[i].assign(size, -7.0f);
    tasks[i] = {w, c.x, c.n, c.ldx, fused[i].data(), ldy, c.gemm, c.panel};
    inline_tasks[i] = {w, c.x, c.n, ldx, inline_fused[i].data(), ldy, c.gemm, c.panel};
    if (c.gemm == nullptr && c.panel == nullptr) {
      matmul(w, c.x, c.n, ldx, separate[i].data(), ldy, nullptr);
    } else if (c.panel == nullptr) {
      matmul_ordered(w, c.x, c.n, ldx, separate[i].data(), ldy, c.gemm, nullptr);
    } else {
      matmul_ordered(w, c.x, c.n, ldx, separate[i].data(), ldy, c.gemm, c.panel, nullptr);
    }
  }
  matmul_fused(tasks.data(), n, pool);
  matmul_fused(inline_tasks.data(), n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < separate[i].size(); ++j) {
      ASSERT_EQ(std::memcmp(&fused[i][j], &separate[i][j], sizeof(float)), 0)
          << "task " << i << " element " << j << ": " << fused[i][j] << " vs " << separate[i][j];
      ASSERT_EQ(std::memcmp(&inline_fused[i][j], &separate[i][j], sizeof(float)), 0)
          << "task " << i << " element " << j << " (inline): " << inline_fused[i][j] << " vs "
          << separate[i][j];
    }
  }
}

TEST(MatmulFused, EveryTypeAndIsaWithAnyVectorCounts) {
  std::mt19937 rng(41);
  ThreadPool pool(2);
  const int64_t cols = 512;
  const auto x = random_floats(rng, 17 * cols);
  const auto x2 = random_floats(rng, 5 * cols);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (GgmlType t : computable_types()) {
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " " + std::string(isa_name(isa)));
      std::vector<Matrix> mats;
      for (int64_t rows : {256, 128, 77, 160, 64, 48}) mats.push_back(random_matrix(rng, t, rows, cols));
      // Q/K/V-like over one input with 3 vectors; the same input with other counts (which must not share
      // the first one's rounding); a strided input; a one-vector product (matvec's kernels); none at all.
      expect_matmul_fused_equals_separate({{&mats[0].view, x.data(), 3},
                                           {&mats[1].view, x.data(), 3},
                                           {&mats[2].view, x.data(), 3},
                                           {&mats[3].view, x.data(), 9},
                                           {&mats[4].view, x.data(), 17},
                                           {&mats[5].view, x2.data(), 2, 2 * cols},
                                           {&mats[1].view, x2.data() + cols, 1},
                                           {&mats[2].view, x2.data(), 0}},
                                          &pool);
    }
  }
}

TEST(MatmulFused, OrdersPanelsAndExperts) {
  std::mt19937 rng(42);
  ThreadPool pool(3);
  const int64_t cols = 1024;
  const auto x = random_floats(rng, 12 * cols);
  std::vector<uint8_t> gemm(12), panel(12);
  for (size_t i = 0; i < gemm.size(); ++i) {
    gemm[i] = static_cast<uint8_t>(rng() % 2);
    panel[i] = static_cast<uint8_t>(rng() % 2);
  }
  const std::vector<uint8_t> none(12, 0);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(isa_name(isa));
    // llama.cpp repacks Q4_K and Q2_K mul_mat products (per-vector gemm / gemv orders); IQ4_XS and IQ2_XXS
    // take the panel order; the mul_mat_id products (an MoE step's experts) take gemv for every vector.
    std::vector<Matrix> mats;
    mats.push_back(random_matrix(rng, GgmlType::Q4_K, 256, cols));
    mats.push_back(random_matrix(rng, GgmlType::Q2_K, 128, cols));
    mats.push_back(random_matrix(rng, GgmlType::IQ4_XS, 64, cols));
    mats.push_back(random_matrix(rng, GgmlType::IQ2_XXS, 96, cols));
    mats.push_back(random_matrix(rng, GgmlType::Q4_K, 320, cols, ProductOrder::mul_mat_id));
    mats.push_back(random_matrix(rng, GgmlType::Q6_K, 320, cols, ProductOrder::mul_mat_id));
    mats.push_back(random_matrix(rng, GgmlType::Q8_0, 320, cols, ProductOrder::mul_mat_id));
    expect_matmul_fused_equals_separate({{&mats[0].view, x.data(), 12, 0, gemm.data(), panel.data()},
                                         {&mats[1].view, x.data(), 12, 0, gemm.data(), panel.data()},
                                         {&mats[2].view, x.data(), 12, 0, gemm.data(), panel.data()},
                                         {&mats[3].view, x.data(), 12, 0, none.data(), panel.data()},
                                         {&mats[0].view, x.data(), 5, 0, gemm.data()},
                                         {&mats[0].view, x.data() + cols, 1, 0, gemm.data() + 1},
                                         {&mats[4].view, x.data(), 2},
                                         {&mats[5].view, x.data() + 2 * cols, 3},
                                         {&mats[6].view, x.data() + 5 * cols, 1},
                                         {&mats[4].view, x.data() + 6 * cols, 6}},
                                        &pool);
  }
}

TEST(MatmulFused, InterleavedBesideFileLayoutMatrices) {
  if (detect_isa() != Isa::avx512 ||
      !detail::kernels_for(Isa::avx512).interleaved[detail::slot(GgmlType::Q4_K)].usable()) {
    GTEST_SKIP() << "no interleaved kernels on this CPU";
  }
  std::mt19937 rng(43);
  ThreadPool pool(2);
  const int64_t cols = 768;
  std::vector<Matrix> mats;
  mats.push_back(random_matrix(rng, GgmlType::Q4_K, 512, cols));
  mats.push_back(random_matrix(rng, GgmlType::Q4_K, 96, cols, ProductOrder::mul_mat_id));
  mats.push_back(random_matrix(rng, GgmlType::Q6_K, 200, cols));
  std::vector<std::unique_ptr<uint8_t, void (*)(uint8_t*)>> held;
  std::vector<MatrixView> views;
  for (int i = 0; i < 2; ++i) {
    const size_t bytes = mats[static_cast<size_t>(i)].bytes.size();
    held.emplace_back(static_cast<uint8_t*>(::operator new (bytes, std::align_val_t{64})),
                      [](uint8_t* p) { ::operator delete (p, std::align_val_t{64}); });
    views.push_back(interleave_rows(mats[static_cast<size_t>(i)].view, held.back().get()));
    ASSERT_TRUE(views.back().interleaved);
  }
  const auto x = random_floats(rng, 9 * cols);
  std::vector<uint8_t> gemm(9);
  for (auto& g : gemm) g = static_cast<uint8_t>(rng() % 2);
  for (int64_t n : {1, 2, 3, 4, 9}) {
    SCOPED_TRACE(n);
    expect_matmul_fused_equals_separate({{&views[0], x.data(), n},
                                         {&views[1], x.data(), n},
                                         {&mats[2].view, x.data(), n},
                                         {&views[0], x.data(), n, 0, gemm.data()}},
                                        &pool);
  }
}

TEST(MatmulFused, EmptyGroupsAndTasksWithoutVectors) {
  std::mt19937 rng(44);
  ThreadPool pool(2);
  matmul_fused(nullptr, 0, &pool);
  std::vector<Matrix> mats;
  mats.push_back(random_matrix(rng, GgmlType::Q8_0, 1, 32));
  mats.push_back(random_matrix(rng, GgmlType::Q8_0, 0, 32));
  const auto x = random_floats(rng, 2 * 32);
  expect_matmul_fused_equals_separate({{&mats[0].view, x.data(), 2}, {&mats[1].view, x.data(), 2}}, &pool);
  expect_matmul_fused_equals_separate({{&mats[0].view, x.data(), 0}, {&mats[0].view, x.data(), 0}}, &pool);
}

}  // namespace
}  // namespace car::tensor
