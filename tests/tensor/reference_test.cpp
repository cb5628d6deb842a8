// The scalar reference kernels: block layouts, quantize -> dequantize error bounds, activation rounding as
// llama.cpp does it, and dot products against double-precision sums of the dequantized rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using testing::computable_types;
using testing::dequantized;
using testing::random_floats;

// The kernels' block geometry and row size against the GGUF type table in core/gguf, which states every
// type's block size and bytes on its own (the block structs' sizeof and the QK constants are static_assert'ed
// against the same table in kernels.cpp): a kernel type missing from geometry() or a wrong row formula fails
// here.
TEST(Blocks, GeometryAndRowBytesMatchGgufTypeTable) {
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::F32, GgmlType::F16, GgmlType::BF16,
                     GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
    SCOPED_TRACE(ggml_type_name(t));
    const GgmlTypeTraits& table = ggml_traits(t);
    const auto g = detail::geometry(t);
    EXPECT_EQ(g.block_size, static_cast<int64_t>(table.block_size));
    EXPECT_EQ(g.block_bytes, static_cast<int64_t>(table.bytes_per_block));
    for (int64_t blocks : {1, 3, 16}) {
      const int64_t n = blocks * static_cast<int64_t>(table.block_size);
      EXPECT_EQ(detail::row_bytes(t, n), ggml_row_bytes(t, static_cast<uint64_t>(n)).value()) << n;
    }
  }
}

TEST(Dequantize, HandBuiltBlocks) {
  block_q4_0 b{};
  b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(GgmlType::Q4_0, &b, y, 32);
  EXPECT_EQ(y[0], -4.0f);    // (0 - 8) * 0.5
  EXPECT_EQ(y[15], 3.5f);    // (15 - 8) * 0.5
  EXPECT_EQ(y[16], 3.5f);    // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -4.0f);

  block_q5_0 c{};
  c.d = fp32_to_fp16(1.0f);
  const uint32_t qh = 0x80000001u;  // fifth bit of element 0 and element 31
  std::memcpy(c.qh, &qh, 4);
  dequantize_row(GgmlType::Q5_0, &c, y, 32);
  EXPECT_EQ(y[0], 0.0f);     // 16 - 16
  EXPECT_EQ(y[1], -16.0f);
  EXPECT_EQ(y[31], 0.0f);

  block_q6_K k{};
  k.d = fp32_to_fp16(0.25f);
  for (int j = 0; j < 16; ++j) k.scales[j] = static_cast<int8_t>(j - 8);
  k.ql[0] = 0x21;           // element 0: low 4 bits 1; element 64: low 4 bits 2
  k.qh[0] = 0x03 | (1 << 4);  // element 0: high bits 3; element 64: high bits 1
  std::vector<float> out(256);
  dequantize_row(GgmlType::Q6_K, &k, out.data(), 256);
  EXPECT_EQ(out[0], 0.25f * -8 * ((1 | (3 << 4)) - 32));
  EXPECT_EQ(out[64], 0.25f * (4 - 8) * ((2 | (1 << 4)) - 32));
  EXPECT_EQ(out[1], 0.25f * -8 * -32);
}

// Bound on RMS(x - dequant(quant(x))) / RMS(x) for N(0, 1) data: the formats' expected resolution with a
// margin (measured: see the test output of QuantizeDequantize.ErrorWithinFormatBound).
double rel_rms_bound(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0.0;
    case GgmlType::F16: return 5e-4;
    case GgmlType::BF16: return 4e-3;
    case GgmlType::Q8_0: return 0.01;
    case GgmlType::Q5_0: return 0.05;
    case GgmlType::Q5_1: return 0.045;
    case GgmlType::Q4_0: return 0.11;
    case GgmlType::Q4_1: return 0.095;
    case GgmlType::Q6_K: return 0.03;
    case GgmlType::Q5_K: return 0.05;
    case GgmlType::Q4_K: return 0.10;
    case GgmlType::Q3_K: return 0.25;
    case GgmlType::Q2_K: return 0.45;
    case GgmlType::IQ4_NL: return 0.11;
    case GgmlType::IQ4_XS: return 0.11;
    case GgmlType::MXFP4: return 0.25;
    default: return 0.0;
  }
}

TEST(QuantizeDequantize, ErrorWithinFormatBound) {
  std::mt19937 rng(42);
  const int64_t n = 8192;
  const auto x = random_floats(rng, n);
  for (GgmlType t : computable_types()) {
    SCOPED_TRACE(ggml_type_name(t));
    std::vector<uint8_t> q(detail::row_bytes(t, n));
    quantize_row(t, x.data(), q.data(), n);
    const auto y = dequantized(t, q.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      ref += double(x[i]) * x[i];
    }
    const double rel = std::sqrt(err / ref);
    std::printf("  %-5s rel rms error %.5f (bound %.5f)\n", std::string(ggml_type_name(t)).c_str(), rel,
                rel_rms_bound(t));
    EXPECT_LE(rel, rel_rms_bound(t));
    if (t != GgmlType::F32) {
      EXPECT_GT(rel, 0.0) << "a lossy format reproduced random data exactly";
    }
  }
}

TEST(QuantizeDequantize, ZeroAndConstantRows) {
  for (GgmlType t : computable_types()) {
    SCOPED_TRACE(ggml_type_name(t));
    const int64_t n = 512;
    std::vector<float> zeros(n, 0.0f);
    std::vector<uint8_t> q(detail::row_bytes(t, n));
    quantize_row(t, zeros.data(), q.data(), n);
    for (float v : dequantized(t, q.data(), n)) ASSERT_EQ(v, 0.0f);
    std::vector<float> ones(n, -0.75f);
    quantize_row(t, ones.data(), q.data(), n);
    for (float v : dequantized(t, q.data(), n)) ASSERT_NEAR(v, -0.75f, 0.75f * rel_rms_bound(t) + 1e-6);
  }
}

// Half a step of the stored (fp16) scale, plus the scale's own fp16 rounding (2^-11 relative) times 127
// levels: ggml's reference quantizer divides by the unrounded scale.
TEST(QuantizeDequantize, Q8_0ElementErrorAtMostHalfStep) {
  std::mt19937 rng(3);
  const auto x = random_floats(rng, 1024, 3.0f);
  std::vector<block_q8_0> q(1024 / 32);
  quantize_row(GgmlType::Q8_0, x.data(), q.data(), 1024);
  const auto y = dequantized(GgmlType::Q8_0, q.data(), 1024);
  for (int b = 0; b < 32; ++b) {
    const float d = fp16_to_fp32(q[b].d);
    for (int j = 0; j < 32; ++j) ASSERT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), (0.5f + 127.0f / 2048.0f) * d * 1.001f + 1e-6f);
  }
}

TEST(ActivationRounding, Q8_0IsRoundHalfEvenWithFp16Scale) {
  // amax 127 makes the multiplier exactly 1, so x = k + 0.5 is a tie.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -0.5f;
  x[5] = 1.4f;
  block_q8_0 b;
  detail::quantize_act_q8_0(x.data(), &b, 32);
  EXPECT_EQ(fp16_to_fp32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], 4);
  EXPECT_EQ(b.qs[3], -2);
  EXPECT_EQ(b.qs[4], 0);
  EXPECT_EQ(b.qs[5], 1);
  // The weight quantizer (ggml's quantize_row_q8_0_ref) rounds half away from zero instead.
  block_q8_0 w;
  quantize_row(GgmlType::Q8_0, x.data(), &w, 32);
  EXPECT_EQ(w.qs[1], 3);
  EXPECT_EQ(w.qs[3], -3);
}

TEST(ActivationRounding, Q8_1SumUsesUnroundedScale) {
  std::mt19937 rng(5);
  const auto x = random_floats(rng, 64);
  block_q8_1 b[2];
  detail::quantize_act_q8_1(x.data(), b, 64);
  block_q8_0 c[2];
  detail::quantize_act_q8_0(x.data(), c, 64);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i].d, c[i].d);
    EXPECT_EQ(0, std::memcmp(b[i].qs, c[i].qs, 32));
    float amax = 0;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(x[i * 32 + j]));
      sum += b[i].qs[j];
    }
    EXPECT_EQ(b[i].s, fp32_to_fp16(amax / 127.f * static_cast<float>(sum)));
  }
}

TEST(ActivationRounding, Q8_KUsesSignedExtremeAndBsums) {
  std::vector<float> x(256, 0.0f);
  x[7] = -127.0f;  // the signed extreme: multiplier -127 / -127 = 1
  x[8] = 2.5f;
  x[9] = 3.5f;
  x[100] = 126.6f;
  block_q8_K b;
  detail::quantize_act_q8_K(x.data(), &b, 256);
  EXPECT_EQ(b.d, 1.0f);
  EXPECT_EQ(b.qs[7], -127);
  EXPECT_EQ(b.qs[8], 2);
  EXPECT_EQ(b.qs[9], 4);
  EXPECT_EQ(b.qs[100], 127);
  EXPECT_EQ(b.bsums[0], -127 + 2 + 4);
  EXPECT_EQ(b.bsums[6], 127);
  // Positive extreme: multiplier -127/m flips the sign, scale -m/127 flips it back.
  std::mt19937 rng(9);
  auto y = random_floats(rng, 512);
  y[3] = 10.0f;
  block_q8_K c[2];
  detail::quantize_act_q8_K(y.data(), c, 512);
  EXPECT_EQ(c[0].qs[3], -127);
  EXPECT_EQ(c[0].d, 1 / (-127.f / 10.0f));
  const auto back = dequantized(GgmlType::Q8_K, c, 512);
  for (int i = 0; i < 512; ++i) ASSERT_NEAR(back[i], y[i], std::fabs(c[i / 256].d) * 0.5f + 1e-6f);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += c[i].qs[16 * j + l];
      ASSERT_EQ(c[i].bsums[j], s);
    }
  }
}

TEST(ActivationRounding, Fp16AndBf16) {
  const std::vector<float> x = {1.0f, 1.0f / 3.0f, -1e-6f, 70000.0f};
  uint16_t h[4], b[4];
  quantize_activation(GgmlType::F16, x.data(), h, 4);
  quantize_activation(GgmlType::BF16, x.data(), b, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h[i], fp32_to_fp16(x[i]));
    EXPECT_EQ(b[i], fp32_to_bf16(x[i]));
  }
  EXPECT_EQ(activation_type(GgmlType::Q4_1), GgmlType::Q8_1);
  EXPECT_EQ(activation_type(GgmlType::Q5_0), GgmlType::Q8_0);
  EXPECT_EQ(activation_type(GgmlType::Q3_K), GgmlType::Q8_K);
  EXPECT_EQ(activation_type(GgmlType::F32), GgmlType::F32);
}

/// Double-precision oracle: sum over elements of dequant(w) * dequant(act), and the sum of |terms|
/// (the scale of the float rounding error). Q8_1 activations contribute their stored sum s for the min term.
struct Oracle {
  double value = 0;
  double magnitude = 0;
};

Oracle oracle_dot(GgmlType t, const void* w, const void* act, int64_t n) {
  Oracle o;
  const auto wf = dequantized(t, w, n);
  const GgmlType at = activation_type(t);
  if (at == GgmlType::Q8_1) {
    // value = sum_b (d_w * d_a * sum q_w q_a + m_w * s_a): the format's own definition of the product.
    const auto* a = static_cast<const block_q8_1*>(act);
    const auto* wb = static_cast<const uint8_t*>(w);
    const size_t bb = detail::geometry(t).block_bytes;
    for (int64_t b = 0; b < n / 32; ++b) {
      const auto* blk = wb + b * bb;
      uint16_t dh, mh;
      std::memcpy(&dh, blk, 2);
      std::memcpy(&mh, blk + 2, 2);
      const double dw = fp16_to_fp32(dh), mw = fp16_to_fp32(mh), da = fp16_to_fp32(a[b].d);
      double s = 0, mag = 0;
      for (int j = 0; j < 32; ++j) {
        const double qw = (wf[b * 32 + j] - mw) / dw;  // the integer level (exact up to float rounding)
        const double level = dw != 0 ? std::nearbyint(qw) : 0;
        s += level * a[b].qs[j];
        mag += std::fabs(level * a[b].qs[j]);
      }
      o.value += dw * da * s + mw * fp16_to_fp32(a[b].s);
      o.magnitude += std::fabs(dw * da) * mag + std::fabs(mw * fp16_to_fp32(a[b].s));
    }
    return o;
  }
  const auto af = dequantized(at, act, n);
  for (int64_t i = 0; i < n; ++i) {
    o.value += double(wf[i]) * af[i];
    o.magnitude += std::fabs(double(wf[i]) * af[i]);
  }
  return o;
}

TEST(ReferenceDot, MatchesDoublePrecisionOfDequantizedRows) {
  std::mt19937 rng(11);
  const auto& scalar = detail::scalar_kernels();
  for (GgmlType t : computable_types()) {
    SCOPED_TRACE(ggml_type_name(t));
    for (int64_t n : {256, 512, 4096}) {
      for (int rep = 0; rep < 4; ++rep) {
        const auto wf = random_floats(rng, n);
        const auto xf = random_floats(rng, n, rep == 3 ? 100.0f : 1.0f);
        std::vector<uint8_t> w(detail::row_bytes(t, n));
        quantize_row(t, wf.data(), w.data(), n);
        std::vector<uint8_t> act(activation_row_bytes(t, n));
        const GgmlType at = activation_type(t);
        if (at == GgmlType::F32) {
          std::memcpy(act.data(), xf.data(), act.size());
        } else {
          scalar.quantize_act[detail::slot(at)](xf.data(), act.data(), n);
        }
        const float got = scalar.dot[detail::slot(t)](w.data(), act.data(), n);
        const Oracle want = oracle_dot(t, w.data(), act.data(), n);
        // Float accumulation over n/32 blocks: a few ulps of the magnitude.
        EXPECT_NEAR(got, want.value, 2e-6 * want.magnitude + 1e-30) << "n=" << n << " rep=" << rep;
      }
    }
  }
}

TEST(ReferenceDot, RoundedProductApproximatesFloatProduct) {
  // End to end: the rounded product stays within the formats' resolution of the exact float product.
  std::mt19937 rng(12);
  const int64_t n = 2048;
  const auto wf = random_floats(rng, n);
  const auto xf = random_floats(rng, n);
  for (GgmlType t : computable_types()) {
    SCOPED_TRACE(ggml_type_name(t));
    std::vector<uint8_t> w(detail::row_bytes(t, n));
    quantize_row(t, wf.data(), w.data(), n);
    const auto wd = dequantized(t, w.data(), n);
    std::vector<uint8_t> act(activation_row_bytes(t, n));
    quantize_activation(t, xf.data(), act.data(), n);
    const float got = dot_row(t, w.data(), act.data(), n);
    double exact = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact += double(wd[i]) * xf[i];
      norm += double(wd[i]) * wd[i];
    }
    // |w . (x - round(x))| <= |w| |x - round(x)|; 8-bit rounding of N(0,1) data is ~1% of |x|.
    const double xerr = (t == GgmlType::F32) ? 1e-6 : (t == GgmlType::F16 ? 1e-3 : 0.02);
    EXPECT_NEAR(got, exact, xerr * std::sqrt(norm) * std::sqrt(double(n)) + 1e-4);
  }
}

TEST(Kernels, CapabilitiesAndIsaNames) {
  for (GgmlType t : computable_types()) EXPECT_TRUE(can_compute(t)) << ggml_type_name(t);
  EXPECT_FALSE(can_compute(GgmlType::I8));
  EXPECT_FALSE(can_compute(GgmlType::Q8_K));
  EXPECT_TRUE(can_quantize(GgmlType::Q8_K));
  Isa isa;
  EXPECT_TRUE(parse_isa("avx2", &isa));
  EXPECT_EQ(isa, Isa::avx2);
  EXPECT_FALSE(parse_isa("sse9", &isa));
  EXPECT_EQ(isa_name(Isa::avx512), "avx512");
  const Isa before = current_isa();
  set_isa(Isa::scalar);
  EXPECT_EQ(current_isa(), Isa::scalar);
  set_isa(Isa::avx512);
  EXPECT_EQ(current_isa(), detect_isa() == Isa::avx512 ? Isa::avx512 : detect_isa());
  set_isa(before);
}

}  // namespace
}  // namespace car::tensor
