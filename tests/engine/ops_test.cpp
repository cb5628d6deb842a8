// The forward pass's steps against naive double-precision implementations written from the definitions.
#include "core/engine/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/tensor/fp16.h"
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

TEST(RmsNorm, MatchesDoubleDefinition) {
  const int64_t n = 300;
  auto x = randn(n, 1, 3.0f);
  auto w = randn(n, 2);
  std::vector<float> y(n);
  rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-5 * std::fabs(x[i] * inv * w[i]) + 1e-6);
}

TEST(RmsNorm, InPlaceEqualsOutOfPlace) {
  auto x = randn(64, 3);
  auto w = randn(64, 4);
  std::vector<float> y(64);
  rms_norm(x.data(), w.data(), y.data(), 64, 1e-6f);
  rms_norm(x.data(), w.data(), x.data(), 64, 1e-6f);
  EXPECT_EQ(x, y);
}

// Naive RoPE in double: pair (a, b) of dimension pair i rotates by pos * base^(-2i/n_rot) * scale.
std::vector<double> rope_ref(const std::vector<float>& x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                             double base, double freq_scale, model::RopeType type, int64_t pos) {
  std::vector<double> y(x.begin(), x.end());
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double theta = double(pos) * std::pow(base, -2.0 * double(i) / double(n_rot)) * freq_scale;
      const int64_t a = h * head_dim + (type == model::RopeType::norm ? 2 * i : i);
      const int64_t b = h * head_dim + (type == model::RopeType::norm ? 2 * i + 1 : i + n_rot / 2);
      const double x0 = x[a], x1 = x[b];
      y[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      y[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
  return y;
}

void check_rope(model::RopeType type, int64_t head_dim, int64_t n_rot, float freq_scale) {
  const int64_t n_heads = 3;
  RopeParams p;
  p.n_rot = n_rot;
  p.head_dim = head_dim;
  p.freq_base = 10000.0f;
  p.freq_scale = freq_scale;
  p.type = type;
  for (int64_t pos : {0, 1, 7, 100}) {
    auto x = randn(static_cast<size_t>(n_heads * head_dim), uint32_t(10 + pos));
    std::vector<float> cache(static_cast<size_t>(n_rot));
    rope_cache(p, pos, cache.data());
    auto y = x;
    rope_apply(p, cache.data(), y.data(), n_heads);
    auto ref = rope_ref(x, n_heads, head_dim, n_rot, 10000.0, freq_scale, type, pos);
    for (size_t i = 0; i < y.size(); ++i) {
      // theta is advanced by float multiplication as ggml does: relative error ~1e-6 of pos * freq.
      EXPECT_NEAR(y[i], ref[i], 2e-4 * (1 + std::fabs(ref[i]))) << "pos " << pos << " i " << i;
    }
    if (pos == 0) {
      for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], x[i]);
    }
  }
}

TEST(Rope, NormPairsMatchDouble) { check_rope(model::RopeType::norm, 64, 64, 1.0f); }
TEST(Rope, NeoxHalvesMatchDouble) { check_rope(model::RopeType::neox, 64, 64, 1.0f); }
TEST(Rope, PartialRotationLeavesTailAlone) {
  check_rope(model::RopeType::neox, 64, 32, 1.0f);
  check_rope(model::RopeType::norm, 32, 16, 0.5f);
}

TEST(Rope, StylesDiffer) {
  RopeParams a;
  a.n_rot = a.head_dim = 8;
  RopeParams b = a;
  b.type = model::RopeType::neox;
  auto x = randn(8, 5);
  std::vector<float> ca(8), cb(8);
  rope_cache(a, 3, ca.data());
  rope_cache(b, 3, cb.data());
  auto ya = x, yb = x;
  rope_apply(a, ca.data(), ya.data(), 1);
  rope_apply(b, cb.data(), yb.data(), 1);
  EXPECT_NE(ya, yb);
}

TEST(Softmax, SumsToOneAndMatchesDouble) {
  auto x = randn(50, 6, 4.0f);
  auto y = x;
  softmax(y.data(), 50);
  double mx = *std::max_element(x.begin(), x.end()), s = 0;
  for (float v : x) s += std::exp(double(v) - mx);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], std::exp(double(x[i]) - mx) / s, 1e-6);
}

TEST(Swiglu, MatchesDefinition) {
  auto g = randn(40, 7, 3.0f);
  auto u = randn(40, 8);
  std::vector<float> o(40);
  swiglu(g.data(), u.data(), o.data(), 40);
  for (size_t i = 0; i < 40; ++i) {
    const double silu = double(g[i]) / (1.0 + std::exp(-double(g[i])));
    EXPECT_NEAR(o[i], silu * u[i], 1e-5 * (1 + std::fabs(silu * u[i])));
  }
}

// ggml's GELU (GGML_GELU_FP16): the tanh approximation of the input rounded to fp16, itself rounded to
// fp16; 0 at and below -10, the identity at and above 10.
TEST(Geglu, IsGgmlsFp16TableGelu) {
  auto g = randn(200, 9, 3.0f);
  g.push_back(-10.0f);
  g.push_back(-12.5f);
  g.push_back(10.0f);
  g.push_back(11.25f);
  g.push_back(0.0f);
  auto u = randn(g.size(), 10);
  std::vector<float> o(g.size());
  geglu(g.data(), u.data(), o.data(), static_cast<int64_t>(g.size()));
  int rounded_differently = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const float x = g[i];
    float want;
    if (x <= -10.0f) {
      want = 0.0f;
    } else if (x >= 10.0f) {
      want = x * u[i];
    } else {
      const double f = tensor::fp16_to_fp32(tensor::fp32_to_fp16(x));
      const double exact = 0.5 * f * (1.0 + std::tanh(0.7978845608028654 * f * (1.0 + 0.044715 * f * f)));
      const float table = tensor::fp16_to_fp32(tensor::fp32_to_fp16(static_cast<float>(exact)));
      // The float evaluation may land on the other side of an fp16 rounding boundary: one fp16 step at most.
      EXPECT_NEAR(gelu_ggml(x), table, std::fabs(table) * 1e-3 + 1e-7) << x;
      want = gelu_ggml(x) * u[i];
      // The table's value is a function of x's fp16 rounding.
      EXPECT_EQ(gelu_ggml(x), gelu_ggml(tensor::fp16_to_fp32(tensor::fp32_to_fp16(x)))) << x;
      const double plain = 0.5 * double(x) * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
      if (static_cast<float>(plain) != gelu_ggml(x)) ++rounded_differently;
    }
    EXPECT_EQ(o[i], want) << "x = " << x;
  }
  EXPECT_GT(rounded_differently, 100);  // the fp16 table is not the float formula
  EXPECT_EQ(gelu_ggml(1.0f), tensor::fp16_to_fp32(tensor::fp32_to_fp16(0.8411920070648193f)));
}

TEST(Softcap, IsCapTimesTanhOfXOverCap) {
  std::vector<float> x{-100.0f, -3.0f, 0.0f, 0.5f, 29.0f, 1000.0f};
  std::vector<float> y = x;
  softcap(y.data(), 30.0f, static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], 30.0 * std::tanh(double(x[i]) / 30.0), 1e-5) << x[i];
    EXPECT_LE(std::fabs(y[i]), 30.0f);
  }
  EXPECT_EQ(y[2], 0.0f);
}

// gemma2's soft-capped head: in double, cap * tanh(dot(K, Q16) * scale / cap) per score, then an exact
// softmax over the same fp16 V; and with a cap far above every score it is attend_head_scalar's result.
TEST(AttentionSoftcap, CapsTheScoresInsideTheSoftmax) {
  const int64_t n_kv = 37, dk = 64, dv = 64;
  auto q = randn(static_cast<size_t>(dk), 30, 2.0f);
  auto kf = randn(static_cast<size_t>(n_kv * dk), 31);
  auto vf = randn(static_cast<size_t>(n_kv * dv), 32);
  std::vector<uint16_t> k(kf.size()), v(vf.size()), q16(static_cast<size_t>(dk)), acc(static_cast<size_t>(dv));
  to_fp16(kf.data(), k.data(), static_cast<int64_t>(k.size()));
  to_fp16(vf.data(), v.data(), static_cast<int64_t>(v.size()));
  const float scale = 0.125f, cap = 2.0f;
  std::vector<float> out(static_cast<size_t>(dv));
  attend_head_softcap(q.data(), k.data(), v.data(), n_kv, dk, dv, scale, cap, out.data(), q16.data(), acc.data());
  std::vector<double> w(static_cast<size_t>(n_kv));
  double mx = -1e300, uncapped_max = 0;
  for (int64_t j = 0; j < n_kv; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < dk; ++d) {
      dot += double(tensor::fp16_to_fp32(k[static_cast<size_t>(j * dk + d)])) *
             tensor::fp16_to_fp32(tensor::fp32_to_fp16(q[static_cast<size_t>(d)]));
    }
    uncapped_max = std::max(uncapped_max, std::fabs(dot * scale));
    w[static_cast<size_t>(j)] = cap * std::tanh(dot * scale / cap);
    mx = std::max(mx, w[static_cast<size_t>(j)]);
  }
  EXPECT_GT(uncapped_max, 2.0 * cap);  // the cap bites
  double sum = 0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  for (int64_t d = 0; d < dv; ++d) {
    double want = 0;
    for (int64_t j = 0; j < n_kv; ++j) want += w[static_cast<size_t>(j)] * tensor::fp16_to_fp32(v[static_cast<size_t>(j * dv + d)]);
    EXPECT_NEAR(out[static_cast<size_t>(d)], want / sum, 2e-3) << d;
  }
  std::vector<float> capped_wide(static_cast<size_t>(dv)), plain(static_cast<size_t>(dv));
  attend_head_softcap(q.data(), k.data(), v.data(), n_kv, dk, dv, scale, 1e6f, capped_wide.data(), q16.data(), acc.data());
  attend_head_scalar(q.data(), k.data(), v.data(), n_kv, dk, dv, scale, plain.data(), q16.data(), acc.data());
  for (int64_t d = 0; d < dv; ++d) EXPECT_NEAR(capped_wide[static_cast<size_t>(d)], plain[static_cast<size_t>(d)], 1e-3);
}

// Exact attention in double over the same fp16 K/V: the fp16 accumulator costs ~1e-3 relative at most.
void check_attention(int64_t n_kv, int64_t dk, int64_t dv, bool use_simd) {
  auto q = randn(static_cast<size_t>(dk), 20, 1.5f);
  auto kf = randn(static_cast<size_t>(n_kv * dk), 21);
  auto vf = randn(static_cast<size_t>(n_kv * dv), 22);
  std::vector<uint16_t> k(kf.size()), v(vf.size());
  to_fp16(kf.data(), k.data(), int64_t(k.size()));
  to_fp16(vf.data(), v.data(), int64_t(v.size()));
  const float scale = 1.0f / std::sqrt(float(dk));
  std::vector<float> out(static_cast<size_t>(dv));
  std::vector<uint16_t> q16(static_cast<size_t>(dk)), acc16(static_cast<size_t>(dv));
  if (use_simd) {
    attend_head(q.data(), k.data(), v.data(), n_kv, dk, dv, scale, out.data(), q16.data(), acc16.data());
  } else {
    attend_head_scalar(q.data(), k.data(), v.data(), n_kv, dk, dv, scale, out.data(), q16.data(), acc16.data());
  }
  std::vector<double> s(static_cast<size_t>(n_kv));
  double mx = -1e300;
  for (int64_t j = 0; j < n_kv; ++j) {
    double d = 0;
    for (int64_t c = 0; c < dk; ++c) d += double(q[c]) * tensor::fp16_to_fp32(k[static_cast<size_t>(j * dk + c)]);
    s[static_cast<size_t>(j)] = d * scale;
    mx = std::max(mx, s[static_cast<size_t>(j)]);
  }
  double z = 0;
  for (double& e : s) z += (e = std::exp(e - mx));
  for (int64_t c = 0; c < dv; ++c) {
    double o = 0;
    for (int64_t j = 0; j < n_kv; ++j) o += s[static_cast<size_t>(j)] / z * tensor::fp16_to_fp32(v[static_cast<size_t>(j * dv + c)]);
    EXPECT_NEAR(out[static_cast<size_t>(c)], o, 4e-3) << "n_kv " << n_kv << " c " << c;
  }
}

TEST(Attention, MatchesExactSoftmaxScalar) {
  for (int64_t n_kv : {1, 2, 17, 100}) check_attention(n_kv, 64, 64, false);
  check_attention(9, 8, 8, false);
}

TEST(Attention, MatchesExactSoftmaxDispatched) {
  for (int64_t n_kv : {1, 5, 64}) check_attention(n_kv, 64, 64, true);
  check_attention(9, 8, 8, true);
  check_attention(7, 12, 20, true);  // tails not a multiple of 8
}

TEST(Attention, SimdEqualsScalar) {
  if (tensor::detect_isa() == tensor::Isa::scalar) GTEST_SKIP() << "no SIMD on this CPU";
  const tensor::Isa saved = tensor::current_isa();
  tensor::set_isa(tensor::detect_isa());
  const int64_t n_kv = 33, dk = 72, dv = 72;
  auto q = randn(static_cast<size_t>(dk), 30);
  auto kf = randn(static_cast<size_t>(n_kv * dk), 31);
  auto vf = randn(static_cast<size_t>(n_kv * dv), 32);
  std::vector<uint16_t> k(kf.size()), v(vf.size()), q16(static_cast<size_t>(dk)), acc(static_cast<size_t>(dv));
  to_fp16(kf.data(), k.data(), int64_t(k.size()));
  to_fp16(vf.data(), v.data(), int64_t(v.size()));
  std::vector<float> a(static_cast<size_t>(dv)), b(static_cast<size_t>(dv));
  attend_head(q.data(), k.data(), v.data(), n_kv, dk, dv, 0.125f, a.data(), q16.data(), acc.data());
  attend_head_scalar(q.data(), k.data(), v.data(), n_kv, dk, dv, 0.125f, b.data(), q16.data(), acc.data());
  for (int64_t c = 0; c < dv; ++c) EXPECT_EQ(a[static_cast<size_t>(c)], b[static_cast<size_t>(c)]);
  tensor::set_isa(saved);
}

TEST(Attention, SinglePositionReturnsItsValue) {
  std::vector<float> q = randn(16, 40), kf = randn(16, 41), vf = randn(16, 42);
  std::vector<uint16_t> k(16), v(16), q16(16), acc(16);
  to_fp16(kf.data(), k.data(), 16);
  to_fp16(vf.data(), v.data(), 16);
  std::vector<float> out(16);
  attend_head(q.data(), k.data(), v.data(), 1, 16, 16, 0.25f, out.data(), q16.data(), acc.data());
  for (int c = 0; c < 16; ++c) EXPECT_EQ(out[static_cast<size_t>(c)], tensor::fp16_to_fp32(v[static_cast<size_t>(c)]));
}

TEST(SelectExperts, TopKOfSoftmaxRenormalized) {
  const float logits[6] = {0.1f, 2.0f, -1.0f, 1.5f, 1.9f, 0.0f};
  float probs[6];
  int32_t ids[2];
  float w[2];
  select_experts(logits, 6, 2, true, probs, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 4);
  const double e1 = std::exp(2.0), e4 = std::exp(1.9);
  EXPECT_NEAR(w[0], e1 / (e1 + e4), 1e-6);
  EXPECT_NEAR(w[1], e4 / (e1 + e4), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
}

TEST(SelectExperts, WithoutNormalizationKeepsSoftmaxProbabilities) {
  const float logits[4] = {1.0f, 3.0f, 2.0f, 0.0f};
  float probs[4];
  int32_t ids[3];
  float w[3];
  select_experts(logits, 4, 3, false, probs, ids, w);
  double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 0);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(1.0) / z, 1e-6);
}

TEST(SelectExperts, TiesGoToLowerId) {
  const float logits[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  float probs[4];
  int32_t ids[2];
  float w[2];
  select_experts(logits, 4, 2, true, probs, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
}

}  // namespace
}  // namespace car::engine

namespace car::engine {
namespace {

TEST(DotF16Ggml, CloseToExactAndOrderSensitiveOnlyInRounding) {
  for (int64_t n : {8, 64, 72, 128, 200}) {
    auto a = randn(static_cast<size_t>(n), 50);
    auto b = randn(static_cast<size_t>(n), 51);
    std::vector<uint16_t> ah(a.size()), bh(b.size());
    to_fp16(a.data(), ah.data(), n);
    to_fp16(b.data(), bh.data(), n);
    double exact = 0;
    for (int64_t i = 0; i < n; ++i) exact += double(tensor::fp16_to_fp32(ah[size_t(i)])) * tensor::fp16_to_fp32(bh[size_t(i)]);
    EXPECT_NEAR(dot_f16_ggml(ah.data(), bh.data(), n), exact, 1e-5 * (1 + std::fabs(exact))) << n;
  }
}

}  // namespace
}  // namespace car::engine
