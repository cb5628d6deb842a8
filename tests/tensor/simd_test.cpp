// Every SIMD kernel against the scalar reference, for each ISA this CPU has, on fresh random data over many
// shapes (block counts that exercise unrolled loops and their tails, float rows of any length) and misaligned
// buffers. Two checks per case:
//   - exactness of the integer parts: with every scale set to a power of two the float arithmetic is exact,
//     so SIMD and scalar results must be bit-identical;
//   - general data: |simd - scalar| <= tolerance(type) * sum of |terms| (only float summation order differs).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/tensor/silu.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::computable_types;
using testing::random_floats;

/// Relative tolerance of a SIMD dot product against the scalar one, in units of the sum of |terms|.
/// Float formats: the scalar sums in double, SIMD in float lanes (error ~ n_per_lane * 2^-24 worst case);
/// block formats: both sum per-block float products, in different orders.
double simd_tolerance(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: return 2e-6;
    default: return 1e-6;
  }
}

const detail::DotKernels* table_if_supported(Isa isa) {
  if (isa == Isa::avx512 && detect_isa() != Isa::avx512) return nullptr;
  if (isa == Isa::avx2 && detect_isa() == Isa::scalar) return nullptr;
  return &detail::kernels_for(isa);
}

/// Set every fp16 scale field of a row to one power of two (2^e, e in [-2, 1] per row) so that all float
/// products and partial sums are exact (integer multiples of one power of two, far below 2^24 of them).
void make_scales_exact(GgmlType t, uint8_t* row, int64_t n, std::mt19937& rng) {
  const auto g = detail::geometry(t);
  const uint16_t scale = fp32_to_fp16(std::ldexp(1.0f, std::uniform_int_distribution<int>(-2, 1)(rng)));
  auto pow2 = [&] { return scale; };
  for (int64_t b = 0; b < n / g.block_size; ++b) {
    uint8_t* blk = row + b * g.block_bytes;
    auto set = [&](size_t off) {
      const uint16_t h = pow2();
      std::memcpy(blk + off, &h, 2);
    };
    switch (t) {
      case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: set(0); break;
      case GgmlType::IQ4_NL: case GgmlType::IQ4_XS: set(0); break;
      case GgmlType::MXFP4: blk[0] = static_cast<uint8_t>(128 + std::ilogb(fp16_to_fp32(scale))); break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: set(0); set(2); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: set(0); set(2); break;
      case GgmlType::Q2_K: set(offsetof(block_q2_K, d)); set(offsetof(block_q2_K, dmin)); break;
      case GgmlType::Q3_K: set(offsetof(block_q3_K, d)); break;
      case GgmlType::Q6_K: set(offsetof(block_q6_K, d)); break;
      default: break;
    }
  }
}

/// Activation scales to powers of two and levels to [-8, 8] (keeps every sum well inside float's exact range).
void make_act_scales_exact(GgmlType at, uint8_t* act, int64_t n, std::mt19937& rng) {
  const auto g = detail::geometry(at);
  std::uniform_int_distribution<int> level(-8, 8);
  for (int64_t b = 0; b < n / g.block_size; ++b) {
    uint8_t* blk = act + b * g.block_bytes;
    if (at == GgmlType::Q8_K) {
      auto* q = reinterpret_cast<block_q8_K*>(blk);
      q->d = 0.5f;
      for (int j = 0; j < 16; ++j) {
        int sum = 0;
        for (int l = 0; l < 16; ++l) sum += q->qs[16 * j + l] = static_cast<int8_t>(level(rng));
        q->bsums[j] = static_cast<int16_t>(sum);
      }
    } else if (at == GgmlType::Q8_0 || at == GgmlType::Q8_1) {
      int8_t* qs = reinterpret_cast<int8_t*>(blk + (at == GgmlType::Q8_0 ? 2 : 4));
      for (int j = 0; j < 32; ++j) qs[j] = static_cast<int8_t>(level(rng));
      const uint16_t h = fp32_to_fp16(0.25f);
      std::memcpy(blk, &h, 2);
      if (at == GgmlType::Q8_1) {
        const uint16_t s = fp32_to_fp16(-3.0f);
        std::memcpy(blk + 2, &s, 2);
      }
    }
  }
}

/// Weight rows with random bit patterns in the quant fields (every level occurs, not only what a quantizer
/// produces), scales as a quantizer leaves them.
std::vector<uint8_t> random_weight_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const auto wf = random_floats(rng, n);
  std::vector<uint8_t> row(detail::row_bytes(t, n));
  quantize_row(t, wf.data(), row.data(), n);
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) return row;
  // Re-randomize everything except the fp16 scale fields, kept from the quantizer.
  std::vector<uint8_t> keep = row;
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  make_scales_exact(t, row.data(), n, rng);  // place sane scales...
  const auto g = detail::geometry(t);
  for (int64_t b = 0; b < n / g.block_size; ++b) {  // ...then restore the quantizer's real scale values
    uint8_t* blk = row.data() + b * g.block_bytes;
    const uint8_t* src = keep.data() + b * g.block_bytes;
    switch (t) {
      case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: std::memcpy(blk, src, 2); break;
      case GgmlType::IQ4_NL: case GgmlType::IQ4_XS: std::memcpy(blk, src, 2); break;
      case GgmlType::MXFP4: blk[0] = src[0]; break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
        std::memcpy(blk, src, 4);
        break;
      case GgmlType::Q2_K: std::memcpy(blk + offsetof(block_q2_K, d), src + offsetof(block_q2_K, d), 4); break;
      case GgmlType::Q3_K: std::memcpy(blk + offsetof(block_q3_K, d), src + offsetof(block_q3_K, d), 2); break;
      case GgmlType::Q6_K: std::memcpy(blk + offsetof(block_q6_K, d), src + offsetof(block_q6_K, d), 2); break;
      default: break;
    }
  }
  if (t == GgmlType::Q8_0) {
    // Q8_0 levels come from roundf(x * 127 / amax): never -128.
    for (int64_t b = 0; b < n / 32; ++b) {
      for (int j = 0; j < 32; ++j) {
        auto& q = row[static_cast<size_t>(b * 34 + 2 + j)];
        if (q == 0x80) q = 0x81;
      }
    }
  }
  return row;
}

std::vector<int64_t> shapes(GgmlType t) {
  const int64_t bs = testing::block_size(t);
  if (bs == 1) return {1, 3, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 100, 255, 256, 1000, 4096, 4099};
  std::vector<int64_t> out;
  for (int64_t nb : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 64}) out.push_back(nb * bs);
  return out;
}

class SimdVsScalar : public ::testing::TestWithParam<Isa> {};

TEST_P(SimdVsScalar, IntegerPartsAreExact) {
  const detail::DotKernels* simd = table_if_supported(GetParam());
  if (simd == nullptr) GTEST_SKIP() << "CPU lacks " << isa_name(GetParam());
  const auto& ref = detail::scalar_kernels();
  std::mt19937 rng(100);
  for (GgmlType t : computable_types()) {
    if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) continue;  // no integer part
    SCOPED_TRACE(ggml_type_name(t));
    const GgmlType at = activation_type(t);
    for (int64_t n : shapes(t)) {
      for (int rep = 0; rep < 3; ++rep) {
        auto w = random_weight_row(t, n, rng);
        make_scales_exact(t, w.data(), n, rng);
        const auto x = random_floats(rng, n);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        ref.quantize_act[detail::slot(at)](x.data(), act.data(), n);
        make_act_scales_exact(at, act.data(), n, rng);
        const float want = ref.dot[detail::slot(t)](w.data(), act.data(), n);
        const float got = simd->dot[detail::slot(t)](w.data(), act.data(), n);
        ASSERT_EQ(got, want) << "n=" << n << " rep=" << rep;
        ASSERT_EQ(simd->dot_id[detail::slot(t)](w.data(), act.data(), n), want) << "mul_mat_id n=" << n;
      }
    }
  }
}

TEST_P(SimdVsScalar, GeneralDataWithinTolerance) {
  const detail::DotKernels* simd = table_if_supported(GetParam());
  if (simd == nullptr) GTEST_SKIP() << "CPU lacks " << isa_name(GetParam());
  const auto& ref = detail::scalar_kernels();
  std::mt19937 rng(200);
  for (GgmlType t : computable_types()) {
    SCOPED_TRACE(ggml_type_name(t));
    const GgmlType at = activation_type(t);
    for (int64_t n : shapes(t)) {
      for (int misalign = 0; misalign < 3; ++misalign) {
        const auto w = random_weight_row(t, n, rng);
        // Copy into buffers 4 / 8 / 12 bytes past a 64-byte boundary: the SIMD kernels must not assume vector
        // alignment (the fields' natural alignment, which GGUF rows always have, is kept).
        std::vector<uint8_t> wbuf(w.size() + 128), abuf(activation_row_bytes(t, n) + 128);
        auto* wbase = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(wbuf.data()) + 63) & ~uintptr_t{63});
        auto* abase = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(abuf.data()) + 63) & ~uintptr_t{63});
        uint8_t* wp = wbase + 4 * misalign + 4;
        uint8_t* ap = abase + 4 * ((misalign + 1) % 3) + 4;
        std::memcpy(wp, w.data(), w.size());
        const auto x = random_floats(rng, n, misalign == 2 ? 50.0f : 1.0f);
        if (at == GgmlType::F32) {
          std::memcpy(ap, x.data(), x.size() * sizeof(float));
        } else {
          ref.quantize_act[detail::slot(at)](x.data(), ap, n);
        }
        const float want = ref.dot[detail::slot(t)](wp, ap, n);
        const float got = simd->dot[detail::slot(t)](wp, ap, n);
        // Scale of the rounding error: sum of |w_i a_i| over the dequantized rows.
        std::vector<float> wd(static_cast<size_t>(n)), ad(static_cast<size_t>(n));
        dequantize_row(t, wp, wd.data(), n);
        dequantize_row(at, ap, ad.data(), n);
        double mag = 0;
        for (int64_t i = 0; i < n; ++i) mag += std::fabs(double(wd[i]) * ad[i]);
        if (at == GgmlType::Q8_1) {
          for (int64_t b = 0; b < n / 32; ++b) {
            uint16_t mh, sh;
            std::memcpy(&mh, wp + b * detail::geometry(t).block_bytes + 2, 2);
            std::memcpy(&sh, ap + b * 36 + 2, 2);
            mag += 2 * std::fabs(double(fp16_to_fp32(mh)) * fp16_to_fp32(sh));
          }
        }
        ASSERT_NEAR(got, want, simd_tolerance(t) * mag + 1e-30) << "n=" << n << " misalign=" << misalign;
        const float got_id = simd->dot_id[detail::slot(t)](wp, ap, n);  // the mul_mat_id summation order
        ASSERT_NEAR(got_id, want, simd_tolerance(t) * mag + 1e-30) << "mul_mat_id n=" << n;
      }
    }
  }
}

TEST_P(SimdVsScalar, ZeroActivationGivesZero) {
  const detail::DotKernels* simd = table_if_supported(GetParam());
  if (simd == nullptr) GTEST_SKIP() << "CPU lacks " << isa_name(GetParam());
  std::mt19937 rng(300);
  for (GgmlType t : computable_types()) {
    if (activation_type(t) == GgmlType::Q8_1) continue;  // the min term uses the activation's sum, also 0
    const int64_t n = 4 * testing::block_size(t) * (testing::block_size(t) == 1 ? 64 : 1);
    const auto w = random_weight_row(t, n, rng);
    const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
    std::vector<uint8_t> act(activation_row_bytes(t, n) + 4);
    quantize_activation(t, zeros.data(), act.data(), n);
    EXPECT_EQ(simd->dot[detail::slot(t)](w.data(), act.data(), n), 0.0f) << ggml_type_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, SimdVsScalar, ::testing::Values(Isa::avx2, Isa::avx512),
                         [](const auto& param_info) { return std::string(isa_name(param_info.param)); });

}  // namespace
}  // namespace car::tensor

namespace car::tensor {
namespace {

class SimdActivation : public ::testing::TestWithParam<Isa> {};

TEST_P(SimdActivation, RoundingIsBitIdenticalToScalar) {
  const detail::DotKernels* simd = table_if_supported(GetParam());
  if (simd == nullptr) GTEST_SKIP() << "CPU lacks " << isa_name(GetParam());
  const auto& ref = detail::scalar_kernels();
  std::mt19937 rng(400);
  for (GgmlType at : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16}) {
    SCOPED_TRACE(ggml_type_name(at));
    for (int64_t nb : {1, 2, 5}) {
      const int64_t n = nb * 256;
      for (int rep = 0; rep < 6; ++rep) {
        auto x = random_floats(rng, n, rep == 5 ? 1e-3f : 1.0f);
        if (rep == 1) {
          for (auto& v : x) v = std::round(v * 8) / 2;  // many exact ties after scaling
        }
        if (rep == 2) std::fill(x.begin(), x.begin() + 256, 0.0f);  // all-zero blocks
        if (rep == 3) {  // +m and -m both present: the first one decides Q8_K's sign
          x[5] = 7.0f;
          x[9] = -7.0f;
        }
        if (rep == 4) x[0] = -9.0f;
        if (rep == 5 && (at == GgmlType::F16 || at == GgmlType::BF16)) {
          // The edges of the 16-bit formats (the engine writes its KV cache through this conversion):
          // fp16 subnormals and the tie below the smallest, the largest finite and the overflow edge,
          // infinities and NaN, signed zero.
          const float edge[] = {0x1p-25f, 0x1.8p-25f, 0x1p-24f,  0x1.4p-24f, 6.0e-5f, -3.0e-7f, 65504.0f,
                                65519.0f, 65520.0f,   -1.0e6f,   std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                                -0.0f,    0x1.002p0f, 0x1.006p0f};
          std::copy(std::begin(edge), std::end(edge), x.begin() + 3);
        }
        const size_t bytes = detail::row_bytes(at, n);
        std::vector<uint8_t> a(bytes, 0x55), b(bytes, 0xaa);
        ref.quantize_act[detail::slot(at)](x.data(), a.data(), n);
        simd->quantize_act[detail::slot(at)](x.data(), b.data(), n);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), bytes)) << "nb=" << nb << " rep=" << rep;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, SimdActivation, ::testing::Values(Isa::avx2, Isa::avx512),
                         [](const auto& param_info) { return std::string(isa_name(param_info.param)); });

}  // namespace
}  // namespace car::tensor

namespace car::tensor {
namespace {

// The AVX-512 kernels of these formats reproduce the arithmetic of ggml's AVX2 kernels (which llama.cpp's
// AVX-512 build runs for them), as do this project's AVX2 kernels: the two must agree bit for bit on any data.
TEST(SimdMirror, Avx512EqualsAvx2BitForBitOnLlamaCppPaths) {
  const detail::DotKernels* v512 = table_if_supported(Isa::avx512);
  if (v512 == nullptr) GTEST_SKIP() << "CPU lacks avx512";
  const detail::DotKernels* v2 = table_if_supported(Isa::avx2);
  const auto& ref = detail::scalar_kernels();
  std::mt19937 rng(500);
  for (GgmlType t :
       {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(ggml_type_name(t));
    const GgmlType at = activation_type(t);
    for (int64_t n : shapes(t)) {
      for (int rep = 0; rep < 3; ++rep) {
        const auto w = random_weight_row(t, n, rng);
        const auto x = random_floats(rng, n, rep == 2 ? 30.0f : 1.0f);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        ref.quantize_act[detail::slot(at)](x.data(), act.data(), n);
        const float a = v2->dot[detail::slot(t)](w.data(), act.data(), n);
        const float b = v512->dot[detail::slot(t)](w.data(), act.data(), n);
        ASSERT_EQ(a, b) << "n=" << n << " rep=" << rep;
      }
    }
  }
}

// Q6_K: the SIMD kernels sum in ggml's x86 ggml_vec_dot_q6_K_q8_K order (the -32 offset of the levels taken
// off each lane once per block as 32 * sum(bsums * scales) - the split of the exact integer sum over the 8
// lanes decides the float rounding), spelled out by dot_q6_K_q8_K_x86_ref; the reference computes the
// product.
TEST(SimdMirror, Q6KFollowsGgmlX86LaneOrder) {
  const auto& ref = detail::scalar_kernels();
  std::mt19937 rng(700);
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    const detail::DotKernels* k = table_if_supported(isa);
    if (k == nullptr) continue;
    SCOPED_TRACE(isa_name(isa));
    for (int64_t n : shapes(GgmlType::Q6_K)) {
      for (int rep = 0; rep < 3; ++rep) {
        const auto w = random_weight_row(GgmlType::Q6_K, n, rng);
        const auto x = random_floats(rng, n, rep == 2 ? 30.0f : 1.0f);
        std::vector<uint8_t> act(activation_row_bytes(GgmlType::Q6_K, n));
        ref.quantize_act[detail::slot(GgmlType::Q8_K)](x.data(), act.data(), n);
        const float want = detail::dot_q6_K_q8_K_x86_ref(w.data(), act.data(), n);
        ASSERT_EQ(k->dot[detail::slot(GgmlType::Q6_K)](w.data(), act.data(), n), want)
            << "n=" << n << " rep=" << rep;
        std::vector<float> wd(static_cast<size_t>(n)), xd(static_cast<size_t>(n));
        dequantize_row(GgmlType::Q6_K, w.data(), wd.data(), n);
        dequantize_row(GgmlType::Q8_K, act.data(), xd.data(), n);
        double exact = 0.0, mag = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          exact += static_cast<double>(wd[i]) * xd[i];
          mag += std::fabs(static_cast<double>(wd[i]) * xd[i]);
        }
        EXPECT_NEAR(want, exact, 1e-6 * mag) << "n=" << n << " rep=" << rep;
      }
    }
  }
}

}  // namespace
}  // namespace car::tensor

namespace car::tensor {
namespace {

// The float formats' two llama.cpp summation orders, spelled out on data where the order is visible:
// mul_mat is one 16-lane accumulator reduced at the end; mul_mat_id four accumulators over 64-element steps.
TEST(SimdMirror, FloatOrdersFollowTinyBlasAndVecDot) {
  const detail::DotKernels* v512 = table_if_supported(Isa::avx512);
  if (v512 == nullptr) GTEST_SKIP() << "CPU lacks avx512";
  std::mt19937 rng(600);
  for (int64_t n : {64, 128, 1024}) {
    const auto x = random_floats(rng, n, 10.0f);
    const auto y = random_floats(rng, n, 10.0f);
    float lanes[16] = {};
    for (int64_t i = 0; i < n; ++i) lanes[i % 16] = std::fma(x[i], y[i], lanes[i % 16]);
    // _mm512_reduce_add_ps: halves, then quarters, then pairs.
    float r8[8], r4[4];
    for (int i = 0; i < 8; ++i) r8[i] = lanes[i + 8] + lanes[i];
    for (int i = 0; i < 4; ++i) r4[i] = r8[i + 4] + r8[i];
    const float mul_mat = (r4[2] + r4[0]) + (r4[3] + r4[1]);
    EXPECT_EQ(v512->dot[detail::slot(GgmlType::F32)](x.data(), y.data(), n), mul_mat) << n;

    float acc[4][16] = {};
    for (int64_t i = 0; i < n; ++i) acc[(i / 16) % 4][i % 16] = std::fma(x[i], y[i], acc[(i / 16) % 4][i % 16]);
    float l[16];
    for (int i = 0; i < 16; ++i) l[i] = (acc[0][i] + acc[2][i]) + (acc[1][i] + acc[3][i]);
    for (int i = 0; i < 8; ++i) r8[i] = l[i + 8] + l[i];
    for (int i = 0; i < 4; ++i) r4[i] = r8[i + 4] + r8[i];
    const float mul_mat_id = (r4[2] + r4[0]) + (r4[3] + r4[1]);
    EXPECT_EQ(v512->dot_id[detail::slot(GgmlType::F32)](x.data(), y.data(), n), mul_mat_id) << n;
  }
}

}  // namespace
}  // namespace car::tensor

namespace car::tensor {
namespace {

// The attention head is a table kernel like the products: every ISA's table has one, and each equals the
// scalar kernel bit for bit (odd dk / dv exercise the SIMD kernel's tails); attend_head runs the selected
// one.
TEST(SimdMirror, AttentionOfEveryTableEqualsScalarBitForBit) {
  std::mt19937 rng(800);
  const Isa saved = current_isa();
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const detail::DotKernels& k = detail::kernels_for(isa);
    ASSERT_NE(k.attend, nullptr);
    set_isa(isa);
    // (256: gemma's heads; 576 / 512: an MLA head's; 1040: past the AVX-512 kernel's Q buffer, its AVX2 fallback)
    for (const auto& [n_kv, dk, dv] : {std::array<int64_t, 3>{1, 64, 64}, {33, 72, 72}, {7, 12, 20}, {50, 128, 64},
                                       {21, 256, 256}, {9, 576, 512}, {3, 1040, 24}}) {
      const auto q = random_floats(rng, dk, 2.0f);
      const auto kf = random_floats(rng, n_kv * dk, 2.0f);
      const auto vf = random_floats(rng, n_kv * dv, 2.0f);
      std::vector<uint16_t> kh(kf.size()), vh(vf.size()), q16(static_cast<size_t>(dk)),
          acc(static_cast<size_t>(dv));
      for (size_t i = 0; i < kf.size(); ++i) kh[i] = fp32_to_fp16(kf[i]);
      for (size_t i = 0; i < vf.size(); ++i) vh[i] = fp32_to_fp16(vf[i]);
      std::vector<float> a(static_cast<size_t>(dv)), b(static_cast<size_t>(dv)), c(static_cast<size_t>(dv));
      k.attend(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, a.data(), q16.data(), acc.data(), kNoSink);
      attend_head(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, b.data(), q16.data(), acc.data());
      attend_head_scalar(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, c.data(), q16.data(),
                         acc.data());
      for (int64_t d = 0; d < dv; ++d) {
        ASSERT_EQ(a[static_cast<size_t>(d)], c[static_cast<size_t>(d)])
            << n_kv << " " << dk << " " << dv << " " << d;
        ASSERT_EQ(b[static_cast<size_t>(d)], c[static_cast<size_t>(d)])
            << n_kv << " " << dk << " " << dv << " " << d;
      }
      // An attention sink (gpt-oss) below and above every score: the sum gains a term, or the values rescale.
      for (const float sink : {-3.0f, 40.0f}) {
        k.attend(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, a.data(), q16.data(), acc.data(), sink);
        attend_head_scalar(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, c.data(), q16.data(),
                           acc.data(), sink);
        for (int64_t d = 0; d < dv; ++d) {
          ASSERT_EQ(a[static_cast<size_t>(d)], c[static_cast<size_t>(d)])
              << n_kv << " " << dk << " " << dv << " " << d << " sink " << sink;
        }
      }
    }
  }
  set_isa(saved);
}

// Keys whose scores rise with the position make every key a new maximum, so the softmax sum is rescaled at
// every step (sum * ms + vs with ms < 1): the step a compiler left to itself fuses into one FMA, which the
// scalar kernel and llama.cpp round twice (the SIMD files are compiled with -ffp-contract=off; issue #27).
TEST(SimdMirror, AttentionRescalingAtEveryKeyEqualsScalarBitForBit) {
  std::mt19937 rng(801);
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const detail::DotKernels& k = detail::kernels_for(isa);
    for (const int64_t dk : {64, 288}) {
      const int64_t n_kv = 96, dv = 64;
      const auto q = random_floats(rng, dk, 1.0f);
      std::vector<uint16_t> kh(static_cast<size_t>(n_kv * dk)), vh(static_cast<size_t>(n_kv * dv));
      for (int64_t i = 0; i < n_kv; ++i) {
        const float f = 0.05f * static_cast<float>(i + 1) + 0.01f * random_floats(rng, 1, 1.0f)[0];
        for (int64_t d = 0; d < dk; ++d) kh[static_cast<size_t>(i * dk + d)] = fp32_to_fp16(f * q[static_cast<size_t>(d)]);
      }
      const auto vf = random_floats(rng, n_kv * dv, 2.0f);
      for (size_t i = 0; i < vf.size(); ++i) vh[i] = fp32_to_fp16(vf[i]);
      std::vector<uint16_t> q16(static_cast<size_t>(dk)), acc(static_cast<size_t>(dv));
      std::vector<float> a(static_cast<size_t>(dv)), c(static_cast<size_t>(dv));
      k.attend(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.3f, a.data(), q16.data(), acc.data(), kNoSink);
      attend_head_scalar(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.3f, c.data(), q16.data(), acc.data());
      for (int64_t d = 0; d < dv; ++d) ASSERT_EQ(a[static_cast<size_t>(d)], c[static_cast<size_t>(d)]) << dk << " " << d;
    }
  }
}

// attend_group (the heads of one KV group together; AVX-512: two heads at a time, their accumulators in
// registers) gives each head attend_head_scalar's bits: register shapes (dk 64 / 128 / 256, dv 64 / 128) and
// the per-head fallback (other shapes), odd and even groups, no keys, one key, rising scores (a rescale at
// every key), and sinks below and above every score.
TEST(SimdMirror, AttentionGroupEqualsScalarPerHeadBitForBit) {
  std::mt19937 rng(803);
  const Isa saved = current_isa();
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    for (const auto& [n_kv, dk, dv] : {std::array<int64_t, 3>{0, 64, 64},
                                       {1, 64, 64},
                                       {77, 64, 64},
                                       {40, 128, 128},
                                       {19, 256, 64},
                                       {33, 128, 64},
                                       {12, 72, 72},
                                       {9, 64, 80},
                                       {5, 320, 128}}) {
      for (const int64_t g : {1, 2, 3, 4, 7}) {
        for (const bool rising : {false, true}) {
          const auto q = random_floats(rng, g * dk, 2.0f);
          std::vector<uint16_t> kh(static_cast<size_t>(n_kv * dk)), vh(static_cast<size_t>(n_kv * dv));
          for (int64_t i = 0; i < n_kv; ++i) {
            const auto kr = random_floats(rng, dk, 2.0f);
            const float f = 0.05f * static_cast<float>(i + 1);
            for (int64_t d = 0; d < dk; ++d) {
              const float x = rising ? f * q[static_cast<size_t>(d)] : kr[static_cast<size_t>(d)];
              kh[static_cast<size_t>(i * dk + d)] = fp32_to_fp16(x);
            }
          }
          const auto vf = random_floats(rng, n_kv * dv, 2.0f);
          for (size_t i = 0; i < vf.size(); ++i) vh[i] = fp32_to_fp16(vf[i]);
          std::vector<float> sinks(static_cast<size_t>(g));
          for (int64_t h = 0; h < g; ++h) sinks[static_cast<size_t>(h)] = h % 2 == 0 ? -3.0f : 40.0f;
          for (const bool with_sinks : {false, true}) {
            std::vector<uint16_t> q16(static_cast<size_t>(dk)), acc(static_cast<size_t>(dv));
            std::vector<float> got(static_cast<size_t>(g * dv), -1.0f), want(static_cast<size_t>(dv));
            attend_group(q.data(), g, kh.data(), vh.data(), n_kv, dk, dv, 0.125f, got.data(),
                         with_sinks ? sinks.data() : nullptr, q16.data(), acc.data());
            for (int64_t h = 0; h < g; ++h) {
              attend_head_scalar(q.data() + h * dk, kh.data(), vh.data(), n_kv, dk, dv, 0.125f, want.data(),
                                 q16.data(), acc.data(),
                                 with_sinks ? sinks[static_cast<size_t>(h)] : kNoSink);
              for (int64_t d = 0; d < dv; ++d) {
                ASSERT_EQ(got[static_cast<size_t>(h * dv + d)], want[static_cast<size_t>(d)])
                    << n_kv << " " << dk << " " << dv << " g " << g << " head " << h << " d " << d
                    << " rising " << rising << " sinks " << with_sinks;
              }
            }
          }
        }
      }
    }
  }
  set_isa(saved);
}

// SwiGLU (llama.cpp's AVX-512 silu, silu.h) in every table equals the scalar kernel bit for bit, over values
// from the tiny to past exp's range, the signed zeros, infinities and NaN, and lengths with SIMD tails.
TEST(SimdMirror, SwigluOfEveryTableEqualsScalarBitForBit) {
  std::mt19937 rng(802);
  std::vector<float> g, u;
  for (const float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 88.0f, -88.0f, 100.0f, -100.0f, 130.0f,
                        -130.0f, 140.0f, -140.0f, 1e6f, -1e6f, INFINITY, -INFINITY, NAN}) {
    g.push_back(x);
  }
  for (const float v : random_floats(rng, 4000, 30.0f)) g.push_back(v);
  for (const float v : random_floats(rng, 1000, 0.01f)) g.push_back(v);
  u = random_floats(rng, static_cast<int64_t>(g.size()), 3.0f);
  std::vector<float> want(g.size());
  detail::swiglu_scalar(g.data(), u.data(), want.data(), static_cast<int64_t>(g.size()));
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const detail::DotKernels& k = detail::kernels_for(isa);
    ASSERT_NE(k.swiglu, nullptr);
    for (const size_t n : {g.size(), size_t{7}, size_t{13}}) {
      std::vector<float> got(n);
      k.swiglu(g.data(), u.data(), got.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << i << ": " << g[i] << " -> " << got[i] << " vs " << want[i];
      }
    }
  }
}

// exp_ggml is llama.cpp's AVX-512 polynomial: exact at 0, within a few ulp of the C library's expf over the
// range it serves, 0 / inf past |n| > 192, and NaN through.
TEST(SimdMirror, GgmlExpIsAnExpWithinAFewUlp) {
  EXPECT_EQ(detail::exp_ggml(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_ggml(-200.0f), 0.0f);
  EXPECT_EQ(detail::exp_ggml(200.0f), INFINITY);
  EXPECT_TRUE(std::isnan(detail::exp_ggml(NAN)));
  for (float x = -80.0f; x < 80.0f; x += 0.37f) {
    const float want = std::exp(x), got = detail::exp_ggml(x);
    EXPECT_LE(std::fabs(got - want), 4.0f * (std::nextafter(want, INFINITY) - want)) << x;
  }
}

}  // namespace
}  // namespace car::tensor
