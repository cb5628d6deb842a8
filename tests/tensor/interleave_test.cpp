// The interleaved Q4_K and Q6_K layouts (kernels.h interleave_rows; issues #29, #25): for each, every product
// over an interleaved matrix
// - matvec, matvec_fused, matmul and matmul_ordered with any vector count and any per-vector orders, the MoE
// order, on one thread and on a pool - equals the same product over the file's layout bit for bit; the layout
// round-trips (deinterleave_rows); which matrices take it; and a table without its kernels (the ISA changed
// after interleaving) computes the same bits from a de-interleaved copy.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/util/thread_pool.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::IsaScope;

/// A 64-byte aligned byte buffer.
struct Aligned {
  explicit Aligned(size_t n) : size(n), p(static_cast<uint8_t*>(::operator new(n, std::align_val_t{64}))) {}
  ~Aligned() { ::operator delete(p, std::align_val_t{64}); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  size_t size;
  uint8_t* p;
};

/// rows x cols of `type` (Q4_K or Q6_K): quantized random rows, or (raw) random quant and scale bytes with
/// finite d (and dmin), so every level, scale and min occurs (Q6_K: scales -128..127, levels 0..63).
std::unique_ptr<Aligned> random_rows(std::mt19937& rng, GgmlType type, int64_t rows, int64_t cols, bool raw) {
  const size_t rb = detail::row_bytes(type, cols);
  auto buf = std::make_unique<Aligned>(rb * static_cast<size_t>(rows));
  if (raw) {
    for (size_t i = 0; i < buf->size; ++i) buf->p[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < rows * cols / QK_K; ++i) {
      if (type == GgmlType::Q4_K) {
        auto* b = reinterpret_cast<block_q4_K*>(buf->p);
        b[i].d = static_cast<uint16_t>(0x2c00 + rng() % 0x1000);     // ~[0.06, 1)
        b[i].dmin = static_cast<uint16_t>(0x2000 + rng() % 0x1000);  // ~[0.008, 0.125)
      } else {
        reinterpret_cast<block_q6_K*>(buf->p)[i].d = static_cast<uint16_t>(0x2000 + rng() % 0x1000);
      }
    }
  } else {
    const auto x = testing::random_floats(rng, rows * cols);
    const auto q = testing::quantize_rows(type, x, rows, cols);
    std::memcpy(buf->p, q.data(), q.size());
  }
  return buf;
}
std::unique_ptr<Aligned> random_q4_K(std::mt19937& rng, int64_t rows, int64_t cols, bool raw) {
  return random_rows(rng, GgmlType::Q4_K, rows, cols, raw);
}

MatrixView view_of(const Aligned& buf, int64_t rows, int64_t cols, GgmlType type = GgmlType::Q4_K) {
  MatrixView w;
  w.type = type;
  w.data = buf.p;
  w.cols = cols;
  w.rows = rows;
  w.row_bytes = detail::row_bytes(type, cols);
  return w;
}

/// The types with an interleaved layout.
constexpr GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q6_K};
const char* name_of(GgmlType t) {
  return t == GgmlType::Q4_K ? "Q4_K" : "Q6_K";
}

/// `plain` interleaved into `buf`, under the AVX-512 table (which has the layout's writer).
MatrixView interleaved(const MatrixView& plain, Aligned& buf) {
  IsaScope isa(Isa::avx512);
  return interleave_rows(plain, buf.p);
}

/// A random `type` matrix (random_rows, raw) in the file's layout and interleaved.
struct BothLayouts {
  BothLayouts(std::mt19937& rng, GgmlType type, int64_t rows, int64_t cols)
      : w(random_rows(rng, type, rows, cols, true)),
        plain(view_of(*w, rows, cols, type)),
        il(w->size),
        v(interleaved(plain, il)) {}
  std::unique_ptr<Aligned> w;
  MatrixView plain;
  Aligned il;
  MatrixView v;
};

bool has_interleaved_kernels() {
  for (GgmlType t : kTypes) {
    if (!detail::kernels_for(Isa::avx512).interleaved[detail::slot(t)].usable()) return false;
  }
  return detect_isa() == Isa::avx512;
}

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const char* what) {
  ASSERT_EQ(want.size(), got.size());
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0 && ++bad <= 3) {
      ADD_FAILURE() << what << ": element " << i << " " << got[i] << ", file layout " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(InterleaveTest, RoundTripsAndKeepsTheBytesOfEachGroup) {
  if (!has_interleaved_kernels()) GTEST_SKIP() << "no AVX-512 interleaved kernels on this CPU";
  IsaScope isa(Isa::avx512);
  std::mt19937 rng(7);
  for (GgmlType type : kTypes) {
    for (int64_t cols : {256, 2816}) {
      SCOPED_TRACE(name_of(type));
      const int64_t rows = 48;
      auto w = random_rows(rng, type, rows, cols, true);
      const MatrixView plain = view_of(*w, rows, cols, type);
      ASSERT_TRUE(can_interleave(plain));
      Aligned il(w->size);
      const MatrixView v = interleave_rows(plain, il.p);
      EXPECT_TRUE(v.interleaved);
      EXPECT_EQ(v.data, il.p);
      EXPECT_NE(std::memcmp(il.p, w->p, w->size), 0);  // it moved the bytes
      std::vector<uint8_t> back(w->size);
      deinterleave_rows(v, back.data());
      EXPECT_EQ(std::memcmp(back.data(), w->p, w->size), 0) << cols;
    }
  }
}

TEST(InterleaveTest, WhichMatricesTakeIt) {
  if (!has_interleaved_kernels()) GTEST_SKIP() << "no AVX-512 interleaved kernels on this CPU";
  std::mt19937 rng(8);
  auto w = random_q4_K(rng, 40, 256, false);
  IsaScope isa(Isa::avx512);
  EXPECT_TRUE(can_interleave(view_of(*w, 32, 256)));
  EXPECT_FALSE(can_interleave(view_of(*w, 40, 256)));  // not whole groups of 16 (llama.cpp repacks it: 8 | 40)
  EXPECT_FALSE(can_interleave(view_of(*w, 24, 256)));
  MatrixView moe = view_of(*w, 32, 256);
  moe.order = ProductOrder::mul_mat_id;
  EXPECT_TRUE(can_interleave(moe));
  MatrixView sgemm = view_of(*w, 32, 256);
  sgemm.order = ProductOrder::sgemm;  // llama.cpp did not repack it
  EXPECT_FALSE(can_interleave(sgemm));
  MatrixView padded = view_of(*w, 16, 256);
  padded.row_bytes += 144;
  EXPECT_FALSE(can_interleave(padded));
  MatrixView q4_0 = view_of(*w, 32, 256);
  q4_0.type = GgmlType::Q4_0;
  q4_0.row_bytes = detail::row_bytes(GgmlType::Q4_0, 256);
  EXPECT_FALSE(can_interleave(q4_0));
  {
    IsaScope scalar(Isa::scalar);
    EXPECT_FALSE(can_interleave(view_of(*w, 32, 256)));
  }
  {
    IsaScope avx2(Isa::avx2);
    EXPECT_FALSE(can_interleave(view_of(*w, 32, 256)));
  }
  // Q6_K: one order, which every product order keeps (no other kernel for mul_mat_id or sgemm).
  auto w6 = random_rows(rng, GgmlType::Q6_K, 40, 256, false);
  EXPECT_TRUE(can_interleave(view_of(*w6, 32, 256, GgmlType::Q6_K)));
  EXPECT_FALSE(can_interleave(view_of(*w6, 40, 256, GgmlType::Q6_K)));
  MatrixView moe6 = view_of(*w6, 16, 256, GgmlType::Q6_K);
  moe6.order = ProductOrder::mul_mat_id;
  EXPECT_TRUE(can_interleave(moe6));
  moe6.order = ProductOrder::sgemm;
  EXPECT_TRUE(can_interleave(moe6));
  MatrixView padded6 = view_of(*w6, 16, 256, GgmlType::Q6_K);
  padded6.row_bytes += 210;
  EXPECT_FALSE(can_interleave(padded6));
  {
    IsaScope avx2(Isa::avx2);
    EXPECT_FALSE(can_interleave(view_of(*w6, 32, 256, GgmlType::Q6_K)));
  }
}

/// Every product of `v` (interleaved) against the same product of `plain`, for vector counts 1..17 under the
/// mul_mat rule, per-vector order masks, and the mul_mat_id order.
void check_products(const MatrixView& plain, const MatrixView& v, ThreadPool* pool, std::mt19937& rng,
                    const char* label) {
  const int64_t cols = plain.cols, rows = plain.rows;
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 13, 17}) {
    const auto x = testing::random_floats(rng, n * cols);
    std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size());
    matmul(plain, x.data(), n, cols, want.data(), rows, pool);
    matmul(v, x.data(), n, cols, got.data(), rows, pool);
    expect_same_bits(want, got, (std::string(label) + " matmul n=" + std::to_string(n)).c_str());
    // Per-vector orders: all gemv, alternating runs, random.
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<uint8_t> gemm(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        gemm[static_cast<size_t>(i)] = mode == 0 ? 0 : mode == 1 ? static_cast<uint8_t>((i / 2) % 2) : rng() % 2;
      }
      matmul_ordered(plain, x.data(), n, cols, want.data(), rows, gemm.data(), pool);
      matmul_ordered(v, x.data(), n, cols, got.data(), rows, gemm.data(), pool);
      expect_same_bits(want, got,
                       (std::string(label) + " ordered n=" + std::to_string(n) + " mode " + std::to_string(mode)).c_str());
    }
    // MoE experts' order: every vector gemv.
    MatrixView pid = plain, vid = v;
    pid.order = vid.order = ProductOrder::mul_mat_id;
    matmul(pid, x.data(), n, cols, want.data(), rows, pool);
    matmul(vid, x.data(), n, cols, got.data(), rows, pool);
    expect_same_bits(want, got, (std::string(label) + " mul_mat_id n=" + std::to_string(n)).c_str());
  }
  // matvec and a fused group mixing interleaved and plain matrices.
  const auto x = testing::random_floats(rng, cols);
  std::vector<float> want(static_cast<size_t>(rows)), got(want.size()), got2(want.size());
  matvec(plain, x.data(), want.data(), pool);
  matvec(v, x.data(), got.data(), pool);
  expect_same_bits(want, got, (std::string(label) + " matvec").c_str());
  const MatvecTask tasks[] = {{v, x.data(), got.data()}, {plain, x.data(), got2.data()}};
  std::fill(got.begin(), got.end(), 0.0f);
  matvec_fused(tasks, 2, pool);
  expect_same_bits(want, got, (std::string(label) + " fused (interleaved)").c_str());
  expect_same_bits(want, got2, (std::string(label) + " fused (plain)").c_str());
}

TEST(InterleaveTest, EveryProductEqualsTheFileLayoutsBitForBit) {
  if (!has_interleaved_kernels()) GTEST_SKIP() << "no AVX-512 interleaved kernels on this CPU";
  IsaScope isa(Isa::avx512);
  std::mt19937 rng(9);
  ThreadPool pool(2);
  struct Shape {
    int64_t rows, cols;
  };
  // one group; several; a row of 11 super-blocks (an MoE expert's); enough rows for the pool's chunks
  for (GgmlType type : kTypes) {
    for (const Shape s : {Shape{16, 256}, Shape{48, 512}, Shape{32, 2816}, Shape{512, 1024}}) {
      for (bool raw : {false, true}) {
        auto w = random_rows(rng, type, s.rows, s.cols, raw);
        const MatrixView plain = view_of(*w, s.rows, s.cols, type);
        Aligned il(w->size);
        const MatrixView v = interleave_rows(plain, il.p, &pool);
        ASSERT_TRUE(v.interleaved);
        const std::string label = std::string(name_of(type)) + " " + std::to_string(s.rows) + "x" +
                                  std::to_string(s.cols) + (raw ? " raw" : "");
        check_products(plain, v, nullptr, rng, (label + " 1 thread").c_str());
        check_products(plain, v, &pool, rng, (label + " pool").c_str());
      }
    }
  }
}

// The interleaved few-vector kernels, called directly: matmul hands them at most 3 vectors (one pass), so
// check_products never reaches their later passes; here every count 1..9 (Q4_K: passes of 3, 2 + 2, 3 + 2,
// ...; Q6_K: of 4 and a tail) and an output stride, each (row, vector) against the scalar reference of the
// type's order on the file's layout (Q4_K: the gemv order; Q6_K: dot_q6_K's).
TEST(InterleaveTest, TheFewVectorKernelGivesEveryPassTheReferenceBits) {
  if (!has_interleaved_kernels()) GTEST_SKIP() << "no AVX-512 interleaved kernels on this CPU";
  for (GgmlType type : kTypes) {
    SCOPED_TRACE(name_of(type));
    const detail::TileFn few = detail::kernels_for(Isa::avx512).interleaved[detail::slot(type)].rows_few;
    ASSERT_NE(few, nullptr);
    const detail::DotFn ref = type == GgmlType::Q4_K ? detail::scalar_kernels().dot_gemv[detail::slot(type)]
                                                     : detail::dot_q6_K_q8_K_x86_ref;
    std::mt19937 rng(11);
    const int64_t rows = 32, cols = 768;
    const BothLayouts m(rng, type, rows, cols);
    const MatrixView &plain = m.plain, &v = m.v;
    ASSERT_TRUE(v.interleaved);
    const size_t ab = detail::row_bytes(GgmlType::Q8_K, cols);
    for (int64_t nvec = 1; nvec <= 9; ++nvec) {
      std::vector<uint8_t> acts(ab * static_cast<size_t>(nvec));
      for (int64_t i = 0; i < nvec; ++i) {
        const auto x = testing::random_floats(rng, cols);
        detail::quantize_act_q8_K(x.data(), acts.data() + ab * static_cast<size_t>(i), cols);
      }
      const int64_t ldy = rows + 5;
      std::vector<float> y(static_cast<size_t>(ldy * nvec), -7.0f);
      few(v.data, v.row_bytes, rows, acts.data(), ab, nvec, cols, y.data(), ldy);
      for (int64_t i = 0; i < nvec; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          const float want = ref(plain.data + plain.row_bytes * static_cast<size_t>(r),
                                 acts.data() + ab * static_cast<size_t>(i), cols);
          const float got = y[static_cast<size_t>(i * ldy + r)];
          ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
              << "nvec " << nvec << " vector " << i << " row " << r << ": " << got << " vs " << want;
        }
        for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[static_cast<size_t>(i * ldy + r)], -7.0f);
      }
    }
  }
}

TEST(InterleaveTest, ATableWithoutTheKernelsComputesTheSameBitsFromACopy) {
  if (!has_interleaved_kernels()) GTEST_SKIP() << "no AVX-512 interleaved kernels on this CPU";
  std::mt19937 rng(10);
  ThreadPool pool(2);
  for (GgmlType type : kTypes) {
    const BothLayouts m(rng, type, 64, 512);
    const MatrixView &plain = m.plain, &v = m.v;
    ASSERT_TRUE(v.interleaved);
    for (Isa isa : {Isa::scalar, Isa::avx2}) {
      IsaScope scope(isa);
      check_products(plain, v, &pool, rng,
                     (std::string(name_of(type)) + (isa == Isa::scalar ? " scalar" : " avx2")).c_str());
    }
  }
}

}  // namespace
}  // namespace car::tensor
