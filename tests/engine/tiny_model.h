// Test helper: writes small random GGUF models of each supported architecture (GgufWriter + quantize_row),
// with a byte-level SPM vocabulary so the tokenizer can load them, and a naive double-precision reference
// forward pass over the dequantized weights (exact attention, no activation rounding, no fp16 cache).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "core/tensor/kernels.h"
#include "tests/spm_vocab.h"

namespace car::testing {

struct TinySpec {
  std::string arch = "llama";  // llama | qwen3 | qwen3moe
  int64_t n_embd = 64;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 16;
  int64_t n_ff = 96;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_vocab = 300;  // >= 259: <unk> <s> </s> + 256 byte tokens (+ a few words)
  int64_t n_ctx = 128;
  float rope_base = 10000.0f;
  GgmlType matrix_type = GgmlType::F32;  // attention / FFN / expert matrices
  GgmlType embd_type = GgmlType::F32;
  bool tied = false;
  uint32_t seed = 1;
  std::string skip_tensor;  // leave this tensor out (for load-error tests)
};

/// Dequantized weights kept beside the file, for the reference forward.
struct TinyWeights {
  std::map<std::string, std::vector<float>> t;  // name -> row-major data as the file holds it (after quantization)
};

inline std::vector<uint8_t> tiny_encode(GgmlType type, const std::vector<float>& v, int64_t cols) {
  const uint64_t rb = *ggml_row_bytes(type, static_cast<uint64_t>(cols));
  const int64_t rows = static_cast<int64_t>(v.size()) / cols;
  std::vector<uint8_t> out(static_cast<size_t>(rb) * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    if (type == GgmlType::F32) {
      std::memcpy(out.data() + r * rb, v.data() + r * cols, static_cast<size_t>(cols) * 4);
    } else {
      tensor::quantize_row(type, v.data() + r * cols, out.data() + r * rb, cols);
    }
  }
  return out;
}

/// Write the model to `path`; returns the weights as stored (dequantized).
inline TinyWeights write_tiny_model(const std::string& path, const TinySpec& s) {
  using gguf::Value;
  gguf::GgufWriter w;
  const std::string a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", "tiny-" + a);
  w.set_u32(a + ".context_length", static_cast<uint32_t>(s.n_ctx));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + ".block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff));
  if (s.n_expert > 0 && a == "qwen3moe") w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(s.head_dim));
  w.set_f32(a + ".rope.freq_base", s.rope_base);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  if (s.n_expert > 0) {
    w.set_u32(a + ".expert_count", static_cast<uint32_t>(s.n_expert));
    w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  }
  // SPM vocabulary: <unk> <s> </s>, the 256 byte tokens <0xXX>, then words.
  std::vector<VocabToken> tokens = spm_byte_fallback_tokens();
  const char* words[] = {"\xE2\x96\x81", "a", "b", "c", "\xE2\x96\x81" "a", "\xE2\x96\x81" "b", "ab", "ba", "e", "t"};
  int wi = 0;
  while (static_cast<int64_t>(tokens.size()) < s.n_vocab) {
    std::string t = wi < 10 ? words[wi] : "w" + std::to_string(wi);
    tokens.push_back({std::move(t), -static_cast<float>(wi + 1), kTokNormal});
    ++wi;
  }
  w.set_string("tokenizer.ggml.model", "llama");
  set_vocab_tokens(w, tokens);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);

  TinyWeights tw;
  std::mt19937 rng(s.seed);
  auto add = [&](const std::string& name, GgmlType type, std::vector<uint64_t> shape, float mean, float sd) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, sd);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    auto bytes = tiny_encode(type, v, static_cast<int64_t>(shape[0]));
    // Keep what the file holds: dequantize back.
    std::vector<float> back(n);
    const uint64_t rb = *ggml_row_bytes(type, shape[0]);
    for (uint64_t r = 0; r < n / shape[0]; ++r) {
      tensor::dequantize_row(type, bytes.data() + r * rb, back.data() + r * shape[0], static_cast<int64_t>(shape[0]));
    }
    tw.t[name] = std::move(back);
    if (name == s.skip_tensor) return;
    auto res = w.add_tensor(name, type, std::move(shape), std::move(bytes));
    if (!res.ok()) std::abort();
  };
  const uint64_t E = static_cast<uint64_t>(s.n_embd), V = static_cast<uint64_t>(s.n_vocab);
  const uint64_t D = static_cast<uint64_t>(s.head_dim), F = static_cast<uint64_t>(s.n_ff);
  const uint64_t H = static_cast<uint64_t>(s.n_head), HK = static_cast<uint64_t>(s.n_head_kv);
  const float wsd = 0.5f / std::sqrt(static_cast<float>(s.n_embd));
  add("token_embd.weight", s.embd_type, {E, V}, 0.0f, 1.0f);
  add("output_norm.weight", GgmlType::F32, {E}, 1.0f, 0.1f);
  if (!s.tied) add("output.weight", s.matrix_type, {E, V}, 0.0f, 0.15f);
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    add(p + "attn_norm.weight", GgmlType::F32, {E}, 1.0f, 0.1f);
    add(p + "attn_q.weight", s.matrix_type, {E, H * D}, 0.0f, wsd);
    add(p + "attn_k.weight", s.matrix_type, {E, HK * D}, 0.0f, wsd);
    add(p + "attn_v.weight", s.matrix_type, {E, HK * D}, 0.0f, wsd);
    add(p + "attn_output.weight", s.matrix_type, {H * D, E}, 0.0f, 0.5f / std::sqrt(float(H * D)));
    if (a != "llama") {
      add(p + "attn_q_norm.weight", GgmlType::F32, {D}, 1.0f, 0.1f);
      add(p + "attn_k_norm.weight", GgmlType::F32, {D}, 1.0f, 0.1f);
    }
    add(p + "ffn_norm.weight", GgmlType::F32, {E}, 1.0f, 0.1f);
    if (s.n_expert > 0) {
      const uint64_t NE = static_cast<uint64_t>(s.n_expert);
      add(p + "ffn_gate_inp.weight", GgmlType::F32, {E, NE}, 0.0f, 0.5f);
      add(p + "ffn_gate_exps.weight", s.matrix_type, {E, F, NE}, 0.0f, wsd);
      add(p + "ffn_up_exps.weight", s.matrix_type, {E, F, NE}, 0.0f, wsd);
      add(p + "ffn_down_exps.weight", s.matrix_type, {F, E, NE}, 0.0f, 0.5f / std::sqrt(float(F)));
    } else {
      add(p + "ffn_gate.weight", s.matrix_type, {E, F}, 0.0f, wsd);
      add(p + "ffn_up.weight", s.matrix_type, {E, F}, 0.0f, wsd);
      add(p + "ffn_down.weight", s.matrix_type, {F, E}, 0.0f, 0.5f / std::sqrt(float(F)));
    }
  }
  auto res = w.write(path);
  if (!res.ok()) std::abort();
  return tw;
}

/// Naive double-precision forward over `tokens` (positions 0..n-1); returns n x n_vocab logits.
inline std::vector<double> reference_forward(const TinySpec& s, const TinyWeights& tw, const std::vector<int32_t>& tokens) {
  const int64_t E = s.n_embd, D = s.head_dim, H = s.n_head, HK = s.n_head_kv, F = s.n_ff, V = s.n_vocab;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const bool neox = s.arch != "llama";
  auto W = [&](const std::string& name) -> const std::vector<float>& { return tw.t.at(name); };
  auto matvec = [](const std::vector<float>& w, const std::vector<double>& x, int64_t rows, int64_t cols,
                   size_t offset = 0) {
    std::vector<double> y(static_cast<size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < cols; ++c) acc += double(w[offset + static_cast<size_t>(r * cols + c)]) * x[static_cast<size_t>(c)];
      y[static_cast<size_t>(r)] = acc;
    }
    return y;
  };
  auto rmsnorm = [](std::vector<double> x, const std::vector<float>& w, size_t off, int64_t len, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < len; ++i) ss += x[off + static_cast<size_t>(i)] * x[off + static_cast<size_t>(i)];
    const double inv = 1.0 / std::sqrt(ss / double(len) + eps);
    for (int64_t i = 0; i < len; ++i) x[off + static_cast<size_t>(i)] *= inv * w[static_cast<size_t>(i)];
    return x;
  };
  auto rope = [&](std::vector<double>& x, int64_t heads, int64_t pos) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const double th = double(pos) * std::pow(double(s.rope_base), -2.0 * double(i) / double(D));
        const size_t ia = size_t(h * D + (neox ? i : 2 * i)), ib = size_t(h * D + (neox ? i + D / 2 : 2 * i + 1));
        const double x0 = x[ia], x1 = x[ib];
        x[ia] = x0 * std::cos(th) - x1 * std::sin(th);
        x[ib] = x0 * std::sin(th) + x1 * std::cos(th);
      }
    }
  };
  auto ffn = [&](const std::vector<double>& h, const std::string& g, const std::string& u, const std::string& d,
                 size_t off_gu, size_t off_d) {
    auto gv = matvec(W(g), h, F, E, off_gu);
    auto uv = matvec(W(u), h, F, E, off_gu);
    for (int64_t i = 0; i < F; ++i) gv[static_cast<size_t>(i)] = gv[static_cast<size_t>(i)] / (1 + std::exp(-gv[static_cast<size_t>(i)])) * uv[static_cast<size_t>(i)];
    return matvec(W(d), gv, E, F, off_d);
  };

  std::vector<std::vector<double>> x(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const auto& te = W("token_embd.weight");
    x[static_cast<size_t>(t)].assign(te.begin() + tokens[static_cast<size_t>(t)] * E, te.begin() + (tokens[static_cast<size_t>(t)] + 1) * E);
  }
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    std::vector<std::vector<double>> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      auto h = rmsnorm(x[static_cast<size_t>(t)], W(p + "attn_norm.weight"), 0, E, 1e-5);
      q[static_cast<size_t>(t)] = matvec(W(p + "attn_q.weight"), h, H * D, E);
      k[static_cast<size_t>(t)] = matvec(W(p + "attn_k.weight"), h, HK * D, E);
      v[static_cast<size_t>(t)] = matvec(W(p + "attn_v.weight"), h, HK * D, E);
      if (neox) {
        for (int64_t hh = 0; hh < H; ++hh) q[static_cast<size_t>(t)] = rmsnorm(q[static_cast<size_t>(t)], W(p + "attn_q_norm.weight"), static_cast<size_t>(hh * D), D, 1e-5);
        for (int64_t hh = 0; hh < HK; ++hh) k[static_cast<size_t>(t)] = rmsnorm(k[static_cast<size_t>(t)], W(p + "attn_k_norm.weight"), static_cast<size_t>(hh * D), D, 1e-5);
      }
      rope(q[static_cast<size_t>(t)], H, t);
      rope(k[static_cast<size_t>(t)], HK, t);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> att(static_cast<size_t>(H * D), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t g = hh / (H / HK);
        std::vector<double> sc(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += q[static_cast<size_t>(t)][static_cast<size_t>(hh * D + c)] * k[static_cast<size_t>(j)][static_cast<size_t>(g * D + c)];
          sc[static_cast<size_t>(j)] = d / std::sqrt(double(D));
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (double& e : sc) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t c = 0; c < D; ++c) att[static_cast<size_t>(hh * D + c)] += sc[static_cast<size_t>(j)] / z * v[static_cast<size_t>(j)][static_cast<size_t>(g * D + c)];
        }
      }
      auto o = matvec(W(p + "attn_output.weight"), att, E, H * D);
      for (int64_t i = 0; i < E; ++i) x[static_cast<size_t>(t)][static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
    }
    for (int64_t t = 0; t < n; ++t) {
      auto h = rmsnorm(x[static_cast<size_t>(t)], W(p + "ffn_norm.weight"), 0, E, 1e-5);
      std::vector<double> out(static_cast<size_t>(E), 0.0);
      if (s.n_expert > 0) {
        auto logits = matvec(W(p + "ffn_gate_inp.weight"), h, s.n_expert, E);
        double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
        for (double& l : logits) z += (l = std::exp(l - mx));
        std::vector<int> order(static_cast<size_t>(s.n_expert));
        for (int e = 0; e < s.n_expert; ++e) order[static_cast<size_t>(e)] = e;
        std::stable_sort(order.begin(), order.end(), [&](int a2, int b2) { return logits[static_cast<size_t>(a2)] > logits[static_cast<size_t>(b2)]; });
        double wsum = 0;
        for (int64_t j = 0; j < s.n_expert_used; ++j) wsum += logits[size_t(order[static_cast<size_t>(j)])] / z;
        for (int64_t j = 0; j < s.n_expert_used; ++j) {
          const int e = order[static_cast<size_t>(j)];
          const double wgt = logits[static_cast<size_t>(e)] / z / wsum;
          auto y = ffn(h, p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", p + "ffn_down_exps.weight",
                       static_cast<size_t>(e) * static_cast<size_t>(F * E), static_cast<size_t>(e) * static_cast<size_t>(E * F));
          for (int64_t i = 0; i < E; ++i) out[static_cast<size_t>(i)] += wgt * y[static_cast<size_t>(i)];
        }
      } else {
        out = ffn(h, p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight", 0, 0);
      }
      for (int64_t i = 0; i < E; ++i) x[static_cast<size_t>(t)][static_cast<size_t>(i)] += out[static_cast<size_t>(i)];
    }
  }
  std::vector<double> logits;
  for (int64_t t = 0; t < n; ++t) {
    auto h = rmsnorm(x[static_cast<size_t>(t)], W("output_norm.weight"), 0, E, 1e-5);
    auto l = matvec(s.tied ? W("token_embd.weight") : W("output.weight"), h, V, E);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

}  // namespace car::testing
