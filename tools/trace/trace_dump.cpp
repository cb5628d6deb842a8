// Debug tool (built as car-trace-dump, not installed): a forward pass written against the engine's public ops and
// kernels, mirroring core/engine/forward.cpp for one prompt batch (products by tensor::matmul / matvec as the
// engine calls them), that writes every node llama.cpp's traces name ("NODE name ne0 ne1 ne2" + values).
// Compare with cmp.py:
//   T=../shared/conformance/traces/moe-llama-q6_k.txt
//   build/tools/car-trace-dump ../shared/conformance/models/moe-llama-q6_k.gguf /tmp/ours.txt $(python3 tools/trace/cmp.py $T)
//   python3 tools/trace/cmp.py $T /tmp/ours.txt
// ISA=scalar|avx2|avx512 selects the kernels. The MoE path computes each (token, slot) product separately
// (equal to the engine's grouped products bit for bit).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <array>

#include "core/engine/ops.h"
#include "core/engine/kv_cache.h"
#include "core/experts/resident_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "core/model/architecture.h"
#include "core/tensor/kernels.h"

using namespace car;
using namespace car::engine;

static FILE* out;
static void dump(const std::string& name, const float* v, int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
  std::fprintf(out, "NODE %s %lld %lld %lld\n", name.c_str(), (long long)ne0, (long long)ne1, (long long)ne2);
  for (int64_t i = 0; i < ne0 * ne1 * ne2; ++i) std::fprintf(out, "%.9g\n", v[i]);
}

static void mm(const tensor::MatrixView& w, const float* x, int64_t n, float* y) {
  if (n == 1) tensor::matvec(w, x, y, nullptr); else tensor::matmul(w, x, n, w.cols, y, w.rows, nullptr);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  if (const char* e = std::getenv("ISA")) { tensor::Isa isa; if (tensor::parse_isa(e, &isa)) tensor::set_isa(isa); }
  std::fprintf(stderr, "isa %s\n", std::string(tensor::isa_name(tensor::current_isa())).c_str());
  auto f = gguf::GgufFile::open(argv[1]);
  if (!f.ok()) { std::fprintf(stderr, "open\n"); return 1; }
  auto m = model::Model::load(*f);
  if (!m.ok()) { std::fprintf(stderr, "load\n"); return 1; }
  std::shared_ptr<const model::Model> model = *m;
  out = std::fopen(argv[2], "w");
  std::vector<int32_t> ids;
  for (int i = 3; i < argc; ++i) ids.push_back(std::atoi(argv[i]));
  const model::Hparams& hp = model->hparams();
  std::unique_ptr<experts::ResidentExpertSource> src;
  if (hp.is_moe()) src = std::make_unique<experts::ResidentExpertSource>(model->expert_banks());
  const int64_t n = (int64_t)ids.size(), E = hp.n_embd;
  RopeParams rope;
  rope.n_rot = hp.n_rot; rope.head_dim = hp.head_dim_k; rope.freq_base = hp.rope_freq_base;
  rope.freq_scale = hp.rope_freq_scale; rope.type = hp.rope_type; rope.freq_factors = model->rope_freq_factors();
  KvCache kv(hp.n_layer, n + 1, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v);
  std::vector<float> x(n * E), xn(n * E), q(n * hp.q_dim()), k(n * hp.k_dim()), v(n * hp.v_dim()),
      att(n * hp.attn_out_dim()), proj(n * E), rc(n * hp.n_rot);
  const tensor::MatrixView& te = model->token_embd();
  for (int64_t i = 0; i < n; ++i) tensor::dequantize_row(te.type, te.data + ids[i] * te.row_bytes, x.data() + i * E, E);
  dump("embd", x.data(), E, n);
  for (int64_t i = 0; i < n; ++i) rope_cache(rope, i, rc.data() + i * hp.n_rot);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const model::LayerWeights& L = model->layers()[il];
    std::string s = "-" + std::to_string(il);
    for (int64_t i = 0; i < n; ++i) rms_norm(x.data() + i * E, L.attn_norm, xn.data() + i * E, E, hp.rms_eps);
    dump("attn_norm" + s, xn.data(), E, n);
    mm(L.wq, xn.data(), n, q.data()); dump("Qcur" + s, q.data(), hp.q_dim(), n);
    mm(L.wk, xn.data(), n, k.data()); dump("Kcur" + s, k.data(), hp.k_dim(), n);
    mm(L.wv, xn.data(), n, v.data()); dump("Vcur" + s, v.data(), hp.v_dim(), n);
    const int64_t dk = hp.head_dim_k, dv = hp.head_dim_v;
    for (int64_t i = 0; i < n; ++i) {
      float* qi = q.data() + i * hp.q_dim();
      float* ki = k.data() + i * hp.k_dim();
      if (L.q_norm) {
        for (int64_t h = 0; h < hp.n_head; ++h) rms_norm(qi + h * dk, L.q_norm, qi + h * dk, dk, hp.rms_eps);
        for (int64_t h = 0; h < hp.n_head_kv; ++h) rms_norm(ki + h * dk, L.k_norm, ki + h * dk, dk, hp.rms_eps);
      }
      rope_apply(rope, rc.data() + i * hp.n_rot, qi, hp.n_head);
      rope_apply(rope, rc.data() + i * hp.n_rot, ki, hp.n_head_kv);
      const float* vi = v.data() + i * hp.v_dim();
      for (int64_t h = 0; h < hp.n_head_kv; ++h) {
        to_fp16(ki + h * dk, kv.k(il, h) + i * dk, dk);
        to_fp16(vi + h * dv, kv.v(il, h) + i * dv, dv);
      }
    }
    dump("Qrope" + s, q.data(), hp.q_dim(), n);
    dump("Krope" + s, k.data(), hp.k_dim(), n);
    const float scale = 1.0f / std::sqrt((float)dk);
    const int64_t group = hp.n_head / hp.n_head_kv;
    std::array<uint16_t, 1024> q16, acc16;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < hp.n_head; ++h)
        attend_head(q.data() + i * hp.q_dim() + h * dk, kv.k(il, h / group), kv.v(il, h / group), i + 1, dk, dv, scale,
                    att.data() + i * hp.attn_out_dim() + h * dv, q16.data(), acc16.data());
    dump("kqv_out" + s, att.data(), hp.attn_out_dim(), n);
    mm(L.wo, att.data(), n, proj.data()); dump("attn_out" + s, proj.data(), E, n);
    for (int64_t i = 0; i < n * E; ++i) x[i] = proj[i] + x[i];
    dump("ffn_inp" + s, x.data(), E, n);
    for (int64_t i = 0; i < n; ++i) rms_norm(x.data() + i * E, L.ffn_norm, xn.data() + i * E, E, hp.rms_eps);
    dump("ffn_norm" + s, xn.data(), E, n);
    if (L.is_moe) {
      const int64_t NE = hp.n_expert, K = hp.n_expert_used, ff = hp.n_ff_exp;
      std::vector<float> logits(n * NE), probs(n * NE), w(n * K), g(n * K * ff), u(n * K * ff), d(n * K * E);
      std::vector<int32_t> sel(n * K);
      mm(L.ffn_gate_inp, xn.data(), n, logits.data()); dump("ffn_moe_logits" + s, logits.data(), NE, n);
      for (int64_t i = 0; i < n; ++i)
        select_experts(logits.data() + i * NE, NE, K, hp.traits->moe_norm_weights, probs.data() + i * NE,
                       sel.data() + i * K, w.data() + i * K);
      dump("ffn_moe_probs" + s, probs.data(), NE, n);
      for (int64_t i = 0; i < n; ++i) {
        std::fprintf(stderr, "L%lld tok %lld:", (long long)il, (long long)i);
        for (int64_t j = 0; j < K; ++j) std::fprintf(stderr, " %d(%.6f)", sel[i * K + j], w[i * K + j]);
        std::fprintf(stderr, "\n");
      }
      dump("ffn_moe_weights_norm" + s, w.data(), K, n);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < K; ++j) {
          experts::ExpertLease lease = std::move(src->acquire((int)il, sel[i * K + j]).value());
          const auto& ew = lease.weights();
          const int64_t a = i * K + j;
          tensor::matvec(ew.gate, xn.data() + i * E, g.data() + a * ff, nullptr);
          tensor::matvec(ew.up, xn.data() + i * E, u.data() + a * ff, nullptr);
        }
      dump("ffn_moe_gate" + s, g.data(), ff, K, n);
      dump("ffn_moe_up" + s, u.data(), ff, K, n);
      swiglu(g.data(), u.data(), g.data(), n * K * ff);
      dump("ffn_moe_swiglu" + s, g.data(), ff, K, n);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < K; ++j) {
          experts::ExpertLease lease = std::move(src->acquire((int)il, sel[i * K + j]).value());
          const int64_t a = i * K + j;
          tensor::matvec(lease.weights().down, g.data() + a * ff, d.data() + a * E, nullptr);
        }
      dump("ffn_moe_down" + s, d.data(), E, K, n);
      for (int64_t a = 0; a < n * K; ++a)
        for (int64_t e = 0; e < E; ++e) d[a * E + e] *= w[a];
      for (int64_t i = 0; i < n; ++i) {
        float* o = proj.data() + i * E;
        std::memcpy(o, d.data() + i * K * E, E * sizeof(float));
        for (int64_t j = 1; j < K; ++j)
          for (int64_t e = 0; e < E; ++e) o[e] += d[(i * K + j) * E + e];
      }
      dump("ffn_moe_out" + s, proj.data(), E, n);
    } else {
      const int64_t ff = hp.n_ff;
      std::vector<float> g(n * ff), u(n * ff);
      mm(L.ffn_gate, xn.data(), n, g.data()); dump("ffn_gate" + s, g.data(), ff, n);
      mm(L.ffn_up, xn.data(), n, u.data()); dump("ffn_up" + s, u.data(), ff, n);
      swiglu(g.data(), u.data(), g.data(), n * ff);
      mm(L.ffn_down, g.data(), n, proj.data()); dump("ffn_out" + s, proj.data(), E, n);
    }
    for (int64_t i = 0; i < n * E; ++i) x[i] = proj[i] + x[i];
    dump("l_out" + s, x.data(), E, n);
  }
  for (int64_t i = 0; i < n; ++i) rms_norm(x.data() + i * E, model->output_norm(), xn.data() + i * E, E, hp.rms_eps);
  dump("result_norm", xn.data(), E, n);
  std::vector<float> lg(n * hp.n_vocab);
  mm(model->output(), xn.data(), n, lg.data());
  dump("result_output", lg.data(), hp.n_vocab, n);
  std::fclose(out);
  return 0;
}
