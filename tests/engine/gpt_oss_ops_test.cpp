// gpt-oss's steps (issue #27) against definitions written here in double precision, and the attention sink
// in every kernel table against the scalar kernel bit for bit:
//   - attend_head with a sink: every ISA's kernel equals attend_head_scalar exactly (odd dk / dv: the SIMD
//     tails), the result is softmax([scores, sink]) . [V, 0] within fp16's accumulation error, kNoSink
//     changes nothing, a huge sink silences the head;
//   - swiglu_oai: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1), the clamps included;
//   - select_experts with softmax_topk gating: the top k of the raw logits, weights softmax over those k;
//   - YaRN rope: factor 1 is plain RoPE (to rounding); with factor 32 the pairs below the correction range
//     keep the unscaled angle, those above it take freq_scale * angle, and both carry the magnitude
//     attn_factor * (1 + 0.1 ln 32).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <random>
#include <vector>

#include "core/engine/ops.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"

namespace car::engine {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_half(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = tensor::fp32_to_fp16(x[i]);
  return h;
}

std::vector<tensor::Isa> isas() {
  std::vector<tensor::Isa> out = {tensor::Isa::scalar};
  if (tensor::detect_isa() != tensor::Isa::scalar) out.push_back(tensor::Isa::avx2);
  if (tensor::detect_isa() == tensor::Isa::avx512) out.push_back(tensor::Isa::avx512);
  return out;
}

TEST(AttentionSink, EveryTableEqualsScalarBitForBit) {
  for (tensor::Isa isa : isas()) {
    SCOPED_TRACE(std::string(tensor::isa_name(isa)));
    const tensor::detail::DotKernels& k = tensor::detail::kernels_for(isa);
    uint32_t seed = 10;
    for (const auto& [n_kv, dk, dv] : {std::array<int64_t, 3>{1, 64, 64}, {9, 64, 64}, {33, 72, 72}, {7, 12, 20}}) {
      const auto q = randn(static_cast<size_t>(dk), seed++, 1.5f);
      const auto kh = to_half(randn(static_cast<size_t>(n_kv * dk), seed++, 1.5f));
      const auto vh = to_half(randn(static_cast<size_t>(n_kv * dv), seed++));
      std::vector<uint16_t> q16(static_cast<size_t>(dk)), acc(static_cast<size_t>(dv));
      // Below, near and above the scores (a sink above the maximum takes the rescaling branch).
      for (float sink : {-30.0f, -1.0f, 0.0f, 0.7f, 4.0f, 25.0f}) {
        std::vector<float> a(static_cast<size_t>(dv)), b(static_cast<size_t>(dv));
        k.attend(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, a.data(), q16.data(), acc.data(), sink);
        tensor::attend_head_scalar(q.data(), kh.data(), vh.data(), n_kv, dk, dv, 0.125f, b.data(), q16.data(),
                                   acc.data(), sink);
        for (int64_t d = 0; d < dv; ++d) {
          ASSERT_EQ(a[static_cast<size_t>(d)], b[static_cast<size_t>(d)]) << n_kv << " " << dk << " " << dv
                                                                          << " sink " << sink << " d " << d;
        }
      }
    }
  }
}

TEST(AttentionSink, MatchesSoftmaxWithAnExtraLogit) {
  const int64_t n_kv = 17, dk = 64, dv = 64;
  const float scale = 0.125f;
  const auto q = randn(dk, 1, 1.5f);
  const auto kh = to_half(randn(static_cast<size_t>(n_kv * dk), 2, 1.5f));
  const auto vh = to_half(randn(static_cast<size_t>(n_kv * dv), 3));
  std::vector<uint16_t> q16(dk), acc(dv);
  std::vector<double> s(static_cast<size_t>(n_kv));
  for (int64_t j = 0; j < n_kv; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < dk; ++d) {
      dot += double(tensor::fp16_to_fp32(tensor::fp32_to_fp16(q[static_cast<size_t>(d)]))) *
             tensor::fp16_to_fp32(kh[static_cast<size_t>(j * dk + d)]);
    }
    s[static_cast<size_t>(j)] = dot * scale;
  }
  for (float sink : {-2.0f, 0.5f, 3.0f}) {
    double mx = sink;
    for (double v : s) mx = std::max(mx, v);
    double z = std::exp(double(sink) - mx);
    for (double v : s) z += std::exp(v - mx);
    std::vector<float> out(dv);
    tensor::attend_head(q.data(), kh.data(), vh.data(), n_kv, dk, dv, scale, out.data(), q16.data(), acc.data(),
                        sink);
    for (int64_t d = 0; d < dv; ++d) {
      double want = 0;
      for (int64_t j = 0; j < n_kv; ++j) {
        want += std::exp(s[static_cast<size_t>(j)] - mx) / z * tensor::fp16_to_fp32(vh[static_cast<size_t>(j * dv + d)]);
      }
      EXPECT_NEAR(out[static_cast<size_t>(d)], want, 3e-3) << "sink " << sink << " d " << d;  // fp16 accumulator
    }
  }
  // kNoSink is the plain head; a sink far above every score leaves almost nothing of the values.
  std::vector<float> plain(dv), none(dv), loud(dv);
  tensor::attend_head(q.data(), kh.data(), vh.data(), n_kv, dk, dv, scale, plain.data(), q16.data(), acc.data());
  tensor::attend_head(q.data(), kh.data(), vh.data(), n_kv, dk, dv, scale, none.data(), q16.data(), acc.data(),
                      tensor::kNoSink);
  tensor::attend_head(q.data(), kh.data(), vh.data(), n_kv, dk, dv, scale, loud.data(), q16.data(), acc.data(),
                      60.0f);
  for (int64_t d = 0; d < dv; ++d) {
    EXPECT_EQ(plain[static_cast<size_t>(d)], none[static_cast<size_t>(d)]);
    EXPECT_LT(std::fabs(loud[static_cast<size_t>(d)]), 1e-15f);
  }
}

TEST(SwigluOai, ClampsAndMatchesTheDefinition) {
  const std::vector<float> g = {-12.0f, -3.0f, -0.5f, 0.0f, 0.3f, 2.0f, 6.9f, 7.0f, 7.5f, 40.0f};
  const std::vector<float> u = {3.0f, -9.0f, 0.25f, 5.0f, -7.5f, 6.9f, 8.0f, -1.0f, 100.0f, -100.0f};
  std::vector<float> out(g.size());
  swiglu_oai(g.data(), u.data(), out.data(), static_cast<int64_t>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = std::min<double>(g[i], 7.0);
    const double y = std::clamp<double>(u[i], -7.0, 7.0);
    const double want = x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
    EXPECT_NEAR(out[i], want, 1e-5 * std::max(1.0, std::fabs(want))) << i;
  }
  // Gates above the limit act as the limit; ups beyond +-limit as +-limit.
  std::vector<float> a(1), b(1);
  const float g1[] = {40.0f}, g2[] = {7.0f}, u1[] = {100.0f}, u2[] = {7.0f};
  swiglu_oai(g1, u1, a.data(), 1);
  swiglu_oai(g2, u2, b.data(), 1);
  EXPECT_EQ(a[0], b[0]);
  // In place (out aliases gate).
  std::vector<float> gi = g;
  swiglu_oai(gi.data(), u.data(), gi.data(), static_cast<int64_t>(gi.size()));
  EXPECT_EQ(gi, out);
}

TEST(SelectExperts, SoftmaxTopkTakesTheLargestLogitsThenSoftmaxesThem) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f, 2.5f, -4.0f, 1.0f, 2.9f};
  std::vector<float> probs(logits.size());
  int32_t ids[3];
  float w[3];
  select_experts(logits.data(), 8, 3, /*normalize=*/true, probs.data(), ids, w, model::ExpertGating::softmax_topk);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 7);
  EXPECT_EQ(ids[2], 4);
  const double z = std::exp(3.0) + std::exp(2.9) + std::exp(2.5);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[1], std::exp(2.9) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(2.5) / z, 1e-6);
  // The softmax gating over the same logits picks the same experts with other (smaller) weights.
  int32_t ids2[3];
  float w2[3];
  select_experts(logits.data(), 8, 3, false, probs.data(), ids2, w2);
  EXPECT_EQ(ids2[0], 1);
  EXPECT_LT(w2[0], w[0]);
}

TEST(RopeYarn, FactorOneIsPlainRopeAndTheRampSplitsThePairs) {
  RopeParams plain;
  plain.n_rot = 64;
  plain.head_dim = 64;
  plain.freq_base = 150000.0f;
  plain.type = model::RopeType::neox;
  RopeParams one = plain;
  one.yarn.ext_factor = 1.0f;  // yarn with factor 1: interpolated == extrapolated, magnitude 1
  one.yarn.n_ctx_orig = 4096;
  std::vector<float> a(64), b(64);
  for (int64_t pos : {0, 1, 7, 100, 3000}) {
    rope_cache(plain, pos, a.data());
    rope_cache(one, pos, b.data());
    // The ramp's mix of two equal angles, t (1 - r) + t r, may round to a neighbour of t.
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-6) << pos << " " << i;
  }
  // Factor 32 from 4096 (gpt-oss): correction dims floor(8.09) = 8 and ceil(17.4) = 18.
  RopeParams y = plain;
  y.freq_scale = 1.0f / 32.0f;
  y.yarn.ext_factor = 1.0f;
  y.yarn.n_ctx_orig = 4096;
  y.yarn.attn_factor = 1.0f;
  const double mscale = 1.0 + 0.1 * std::log(32.0);
  const int64_t pos = 37;
  rope_cache(y, pos, b.data());
  for (int64_t i = 0; i < 32; ++i) {
    const double theta = pos * std::pow(150000.0, -2.0 * double(i) / 64.0);
    double t = theta;
    if (i > 8 && i < 18) continue;  // on the ramp: a mix of the two
    if (i >= 18) t = theta / 32.0;
    EXPECT_NEAR(b[static_cast<size_t>(2 * i)], std::cos(t) * mscale, 2e-5) << i;
    EXPECT_NEAR(b[static_cast<size_t>(2 * i + 1)], std::sin(t) * mscale, 2e-5) << i;
  }
  // Halfway up the ramp (pair 13: ramp 1 - 5/10 = 0.5) the angle is the mean of the two.
  const double theta13 = pos * std::pow(150000.0, -26.0 / 64.0);
  const double t13 = theta13 / 32.0 * 0.5 + theta13 * 0.5;
  EXPECT_NEAR(b[26], std::cos(t13) * mscale, 2e-5);
  EXPECT_NEAR(b[27], std::sin(t13) * mscale, 2e-5);
}

}  // namespace
}  // namespace car::engine
