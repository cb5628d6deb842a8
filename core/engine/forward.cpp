#include "core/engine/forward.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <new>

#include "core/engine/deepseek2_ops.h"
#include "core/model/architecture.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/util/result.h"

namespace car::engine {
namespace {

constexpr int64_t kMinParallelGlu = 2048;  // SwiGLU elements below which the pool is not used
constexpr int64_t kGluGrain = 256;
constexpr int64_t kNormGrain = 4;           // rows per task of norm_rows
constexpr int64_t kRopeGrain = 8;           // rows per task of attention's RoPE and K / V stores
constexpr int64_t kPrefetchKvRows = 16;     // steps of up to this many rows fetch their K / V rows ahead
constexpr int64_t kPrefetchKvElems = 4096;  // fp16 keys (values) fetched ahead per KV group: 8 KiB

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

ForwardPass::ForwardPass(std::shared_ptr<const model::Model> model, experts::ExpertSource* experts, ThreadPool* pool,
                         int64_t max_batch)
    : model_(std::move(model)), hp_(model_->hparams()), experts_(experts), pool_(pool), max_batch_(max_batch) {
  CAR_CHECK(max_batch_ >= 1);
  CAR_CHECK(hp_.head_dim_k <= kMaxHeadDim && hp_.head_dim_v <= kMaxHeadDim);
  CAR_CHECK(!hp_.is_moe() || experts_ != nullptr);
  rope_.n_rot = hp_.n_rot;
  rope_.head_dim = hp_.head_dim_k;
  rope_.freq_base = hp_.rope_freq_base;
  rope_.freq_scale = hp_.rope_freq_scale;
  rope_.type = hp_.rope_type;
  rope_.freq_factors = model_->rope_freq_factors();
  rope_.yarn = hp_.yarn;
  rope_swa_ = rope_;
  if (hp_.rope_freq_base_swa > 0.0f) {
    rope_swa_.freq_base = hp_.rope_freq_base_swa;
    rope_swa_.freq_scale = hp_.rope_freq_scale_swa;
  }

  const int64_t B = max_batch_;
  const int64_t ff = std::max({hp_.n_ff, hp_.n_ff_exp, hp_.n_ff_shexp});
  x_.resize(sz(B * hp_.n_embd));
  xn_.resize(sz(B * hp_.n_embd));
  q_.resize(sz(B * hp_.q_dim()));
  k_.resize(sz(B * hp_.k_dim()));
  v_.resize(sz(B * hp_.v_dim()));
  attn_.resize(sz(B * hp_.attn_out_dim()));
  proj_.resize(sz(B * hp_.n_embd));
  // A decoded MoE token holds the gate / up outputs of all its experts at once.
  const int64_t ff_rows = std::max(B * ff, hp_.is_moe() ? hp_.n_expert_used * hp_.n_ff_exp : 0);
  gate_.resize(sz(ff_rows));
  up_.resize(sz(ff_rows));
  rope_cache_.resize(sz(B * hp_.n_rot));
  if (hp_.rope_freq_base_swa > 0.0f) rope_cache_swa_.resize(sz(B * hp_.n_rot));
  row_token_.resize(sz(B));
  row_kv_.resize(sz(B));
  row_pos_.resize(sz(B));
  gemm_.resize(sz(B));
  keep_.resize(sz(B));
  keep_gemm_.resize(sz(B));
  panel_.resize(sz(B));
  keep_panel_.resize(sz(B));
  sgemm_.resize(sz(B));
  keep_sgemm_.resize(sz(B));
  if (hp_.is_moe()) {
    const int64_t E = hp_.n_expert;
    const int64_t K = hp_.n_expert_used;
    router_.resize(sz(B * E));
    probs_.resize(sz(B * E));
    sel_ids_.resize(sz(B * K));
    sel_w_.resize(sz(B * K));
    slot_out_.resize(sz(B * K * hp_.n_embd));
    xe_.resize(sz(B * hp_.n_embd));
    group_rows_.resize(sz(B * K));
    group_start_.resize(sz(E + 1));
    cursor_.resize(sz(E));
    active_.reserve(sz(E));
    leases_.reserve(sz(std::max(E, K)));
    tasks_.reserve(sz(2 * K));
    expert_tasks_.reserve(sz(2 * E));
    guessed_.resize(sz(E));
    guess_.reserve(sz(E));
    if (hp_.n_ff_shexp > 0 && !hp_.is_mla()) shexp_gate_.resize(sz(B));
  }
  if (hp_.is_mla()) {
    CAR_CHECK(hp_.mla_cache_dim_k() <= kMaxHeadDim);
    rope_mla_ = rope_;
    rope_mla_.head_dim = hp_.n_rot;
    const int64_t dc = hp_.mla_cache_dim_k();
    mla_qa_.resize(sz(B * hp_.q_lora_rank));
    mla_kv_.resize(sz(B * dc));
    mla_q_.resize(sz(B * hp_.n_head * dc));
    mla_lat_.resize(sz(B * hp_.n_head * hp_.kv_lora_rank));
    mla_sel_.resize(sz(hp_.n_expert));
    mla_tasks_.reserve(
        sz(B * hp_.n_head * std::max<int64_t>(1, std::max(hp_.kv_lora_rank, hp_.head_dim_v) / 7 + 1)));
  }
}

Result<KvCache> ForwardPass::create_cache(int64_t n_ctx) const {
  // MLA: one KV head holding [latent | rope key] as keys and the latent again as values (see hparams.h).
  if (hp_.is_mla()) return KvCache::create(hp_.n_layer, n_ctx, 1, hp_.mla_cache_dim_k(), hp_.mla_cache_dim_v());
  return KvCache::create(hp_.n_layer, n_ctx, hp_.n_head_kv, hp_.head_dim_k, hp_.head_dim_v, hp_.swa_window);
}

KvCache ForwardPass::make_cache(int64_t n_ctx) const {
  auto c = create_cache(n_ctx);
  if (!c.ok()) throw std::bad_alloc();
  return std::move(*c);
}

uint64_t ForwardPass::scratch_bytes() const {
  uint64_t f = x_.size() + xn_.size() + q_.size() + k_.size() + v_.size() + attn_.size() + proj_.size() +
               gate_.size() + up_.size() + rope_cache_.size() + rope_cache_swa_.size() + router_.size() +
               probs_.size() + sel_w_.size() + slot_out_.size() + xe_.size() + shexp_gate_.size() +
               mla_qa_.size() + mla_kv_.size() + mla_q_.size() + mla_lat_.size() + mla_sel_.size();
  uint64_t i = sel_ids_.size() + group_rows_.size() + group_start_.size() + cursor_.size() + active_.capacity();
  const uint64_t rows = row_token_.size() * sizeof(int32_t) + row_kv_.size() * sizeof(KvCache*) +
                        row_pos_.size() * sizeof(int64_t) + gemm_.size() + keep_.size() * sizeof(int32_t) +
                        keep_gemm_.size() + panel_.size() + keep_panel_.size() + sgemm_.size() +
                        keep_sgemm_.size();
  return f * sizeof(float) + i * sizeof(int32_t) + rows;
}

uint64_t ForwardPass::scratch_bytes_for(const model::Hparams& hp, int64_t max_batch) {
  // The sizes the constructor gives its buffers, in its order.
  const uint64_t B = static_cast<uint64_t>(max_batch);
  const uint64_t ff = static_cast<uint64_t>(std::max({hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp}));
  const uint64_t embd = static_cast<uint64_t>(hp.n_embd);
  const uint64_t ff_rows =
      std::max<uint64_t>(B * ff, hp.is_moe() ? static_cast<uint64_t>(hp.n_expert_used * hp.n_ff_exp) : 0);
  uint64_t f =
      B * (2 * embd + static_cast<uint64_t>(hp.q_dim() + hp.k_dim() + hp.v_dim() + hp.attn_out_dim()) + embd +
           static_cast<uint64_t>(hp.n_rot)) +
      2 * ff_rows;
  if (hp.rope_freq_base_swa > 0.0f) f += B * static_cast<uint64_t>(hp.n_rot);  // rope_cache_swa_
  uint64_t i = 0;
  if (hp.is_moe()) {
    const uint64_t E = static_cast<uint64_t>(hp.n_expert);
    const uint64_t K = static_cast<uint64_t>(hp.n_expert_used);
    f += 2 * B * E + B * K + B * K * embd + B * embd;  // router_, probs_, sel_w_, slot_out_, xe_
    if (hp.n_ff_shexp > 0 && !hp.is_mla()) f += B;     // shexp_gate_
    i += B * K + B * K + (E + 1) + E + E;  // sel_ids_, group_rows_, group_start_, cursor_, active_
  }
  if (hp.is_mla()) {  // mla_qa_, mla_kv_, mla_q_, mla_lat_, mla_sel_
    const uint64_t dc = static_cast<uint64_t>(hp.mla_cache_dim_k());
    const uint64_t heads = static_cast<uint64_t>(hp.n_head);
    f += B * (static_cast<uint64_t>(hp.q_lora_rank) + dc + heads * dc +
              heads * static_cast<uint64_t>(hp.kv_lora_rank)) +
         static_cast<uint64_t>(hp.n_expert);
  }
  // row_token_, row_kv_, row_pos_, gemm_, keep_, keep_gemm_, panel_, keep_panel_, sgemm_, keep_sgemm_
  const uint64_t rows = B * (sizeof(int32_t) + sizeof(KvCache*) + sizeof(int64_t) + 1 + sizeof(int32_t) + 1 + 4);
  return f * sizeof(float) + i * sizeof(int32_t) + rows;
}

uint64_t ForwardPass::kv_cache_bytes_for(const model::Hparams& hp, int64_t n_ctx) {
  if (hp.is_mla()) {
    return static_cast<uint64_t>(hp.n_layer * n_ctx * (hp.mla_cache_dim_k() + hp.mla_cache_dim_v())) *
           sizeof(uint16_t);
  }
  return static_cast<uint64_t>(hp.n_layer * hp.n_head_kv * n_ctx * (hp.head_dim_k + hp.head_dim_v)) *
         sizeof(uint16_t);
}

void ForwardPass::parallel(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (pool_ == nullptr || pool_->size() == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  pool_->parallel_for(n, grain, 0, fn);
}

void ForwardPass::norm_rows(const float* w, int64_t n) {
  // rms_norm sums each row's squares in double one after another (ggml's order), ~1 us a row of 1024 at
  // the add's latency: rows are shared out from kNormGrain up (a fork-join costs ~0.25 us).
  const int64_t E = hp_.n_embd;
  parallel(n, kNormGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) rms_norm(x_.data() + i * E, w, xn_.data() + i * E, E, hp_.rms_eps);
  });
}

void ForwardPass::glu(int64_t count) {
  // Element-wise, so the split cannot change a result: a decode step's few thousand expf calls are worth
  // sharing with the pool's other threads, which would otherwise wait (a fork-join costs ~0.25 us).
  float* g = gate_.data();
  const float* u = up_.data();
  auto act = hp_.traits->ffn_act == model::FfnAct::gelu ? &geglu : &swiglu;
  if (pool_ == nullptr || pool_->size() == 1 || count < kMinParallelGlu) {
    act(g, u, g, count);
    return;
  }
  pool_->parallel_for_shares(count, kGluGrain, 0,
                             [&](int64_t b, int64_t e) { act(g + b, u + b, g + b, e - b); });
}

void ForwardPass::mm(const tensor::MatrixView& w, const float* x, int64_t n, float* y) {
  if (n == 1) {
    tensor::matvec(w, x, y, pool_);
  } else {
    tensor::matmul(w, x, n, w.cols, y, w.rows, pool_);
  }
}

tensor::MatmulTask ForwardPass::row_task(const tensor::MatrixView& w, const float* x, int64_t n,
                                         float* y) const {
  return {w, x, n, w.cols, y, w.rows, gemm_.data(), panel_.data()};
}

void ForwardPass::mm_rows(const tensor::MatrixView& w, const float* x, int64_t n, float* y) {
  if (n == 1 && plain_one()) {
    tensor::matvec(w, x, y, pool_);
  } else {
    tensor::matmul_ordered(w, x, n, w.cols, y, w.rows, gemm_.data(), panel_.data(), pool_);
  }
}

Result<void> ForwardPass::eval(std::span<const int32_t> tokens, KvCache& kv, float* logits, bool all_rows) {
  const int64_t n_total = static_cast<int64_t>(tokens.size());
  CAR_CHECK(n_total > 0);
  CAR_CHECK(kv.n_past() + n_total <= kv.n_ctx());
  // The call's tokens are one llama.cpp batch, whatever max_batch_ cuts them into.
  const int64_t panel_end = iq_panel_end(kv.n_past(), n_total);
  const int64_t sgemm_to = sgemm_end(kv.n_past(), n_total);
  for (int64_t begin = 0; begin < n_total; begin += max_batch_) {
    const int64_t n = std::min(max_batch_, n_total - begin);
    const bool last_chunk = begin + n == n_total;
    SeqChunk chunk;
    chunk.kv = &kv;
    chunk.tokens = tokens.subspan(sz(begin), sz(n));
    chunk.panel_end = panel_end;
    chunk.sgemm_end = sgemm_to;
    chunk.output = all_rows ? SeqChunk::Output::all : last_chunk && logits != nullptr ? SeqChunk::Output::last
                                                                                      : SeqChunk::Output::none;
    float* out = all_rows ? logits + begin * hp_.n_vocab : logits;
    if (Result<void> r = eval_step(std::span<const SeqChunk>(&chunk, 1), out); !r) return r;
  }
  return {};
}

void ForwardPass::embed(const int32_t* tokens, int64_t n) {
  const tensor::MatrixView& te = model_->token_embd();
  for (int64_t i = 0; i < n; ++i) {
    CAR_CHECK(tokens[i] >= 0 && tokens[i] < hp_.n_vocab);
    const uint8_t* row = te.data + sz(tokens[i]) * te.row_bytes;
    tensor::dequantize_row(te.type, row, x_.data() + i * hp_.n_embd, hp_.n_embd);
  }
  if (hp_.traits->embed_scale) {  // gemma: ggml_scale(inp_embd, sqrtf(n_embd))
    const float scale = std::sqrt(static_cast<float>(hp_.n_embd));
    for (int64_t i = 0; i < n * hp_.n_embd; ++i) x_[sz(i)] = x_[sz(i)] * scale;
  }
}

Result<void> ForwardPass::eval_step(std::span<const SeqChunk> chunks, float* logits) {
  const int64_t E = hp_.n_embd;
  // Lay out the rows: chunk after chunk, each row with its cache, position and product order. A chunk's
  // whole groups of 4 rows take the gemm order and its tail the gemv order, as a batch of that chunk alone
  // would (tensor::matmul's rule); the rows that give logits are the ones carried through the last layer.
  int64_t n = 0;
  int64_t n_keep = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const SeqChunk& ch = chunks[c];
    const int64_t len = static_cast<int64_t>(ch.tokens.size());
    CAR_CHECK(ch.kv != nullptr && len > 0 && n + len <= max_batch_);
    CAR_CHECK(ch.kv->n_past() + len <= ch.kv->n_ctx());
    for (size_t d = 0; d < c; ++d) CAR_CHECK(chunks[d].kv != ch.kv);
    const int64_t pos0 = ch.kv->n_past();
    const int64_t gemm_end = ch.gemm_end >= 0 ? ch.gemm_end : pos0 + len - len % 4;
    const int64_t panel_end = ch.panel_end >= 0 ? ch.panel_end : iq_panel_end(pos0, len);
    const int64_t sgemm_to = ch.sgemm_end >= 0 ? ch.sgemm_end : sgemm_end(pos0, len);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = n + j;
      row_token_[sz(i)] = ch.tokens[sz(j)];
      row_kv_[sz(i)] = ch.kv;
      row_pos_[sz(i)] = pos0 + j;
      gemm_[sz(i)] = pos0 + j < gemm_end ? 1 : 0;
      panel_[sz(i)] = pos0 + j < panel_end ? 1 : 0;
      sgemm_[sz(i)] = pos0 + j < sgemm_to ? 1 : 0;
      if (ch.output == SeqChunk::Output::all || (ch.output == SeqChunk::Output::last && j == len - 1)) {
        keep_gemm_[sz(n_keep)] = ch.output == SeqChunk::Output::all ? gemm_[sz(i)] : 0;
        keep_panel_[sz(n_keep)] = ch.output == SeqChunk::Output::all ? panel_[sz(i)] : 0;
        keep_sgemm_[sz(n_keep)] = ch.output == SeqChunk::Output::all ? sgemm_[sz(i)] : 0;
        keep_[sz(n_keep++)] = static_cast<int32_t>(i);
      }
    }
    n += len;
  }
  CAR_CHECK(n > 0);
  timing_ = time_phases_.load(std::memory_order_relaxed);
  if (timing_) phase_last_ = PhaseClock::now();
  for (const SeqChunk& ch : chunks) ch.kv->prepare(ch.kv->n_past() + static_cast<int64_t>(ch.tokens.size()));

  embed(row_token_.data(), n);
  for (int64_t i = 0; i < n; ++i) rope_cache(rope_, row_pos_[sz(i)], rope_cache_.data() + i * hp_.n_rot);
  if (!rope_cache_swa_.empty()) {
    for (int64_t i = 0; i < n; ++i) {
      rope_cache(rope_swa_, row_pos_[sz(i)], rope_cache_swa_.data() + i * hp_.n_rot);
    }
  }
  phase_end(StepPhase::embed);

  int64_t rows = n;  // rows still carried through the layers
  const bool prefetch = prefetch_ && experts_ != nullptr && experts_->streams();
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    const model::LayerWeights& L = model_->layers()[sz(il)];
    if (prefetch && L.is_moe) prefetch_layer(il, rows);
    if (hp_.is_mla()) {
      attention_mla(il, rows);
      phase_end(StepPhase::attention);
    } else {
      attention(il, rows);
    }
    // Last layer: only the rows that give logits need the FFN (llama.cpp's inp_out_ids). A row kept alone
    // from its chunk is a batch of one there (the gemv order), as in eval() of that chunk.
    if (il == hp_.n_layer - 1 && n_keep < rows) {
      for (int64_t j = 0; j < n_keep; ++j) {
        const int64_t from = keep_[sz(j)];
        if (from != j) {
          std::memmove(x_.data() + j * E, x_.data() + from * E, sz(E) * sizeof(float));
          std::memmove(proj_.data() + j * E, proj_.data() + from * E, sz(E) * sizeof(float));
        }
      }
      std::copy(keep_gemm_.begin(), keep_gemm_.begin() + n_keep, gemm_.begin());
      std::copy(keep_panel_.begin(), keep_panel_.begin() + n_keep, panel_.begin());
      std::copy(keep_sgemm_.begin(), keep_sgemm_.begin() + n_keep, sgemm_.begin());
      rows = n_keep;
      if (rows == 0) break;
    }
    for (int64_t i = 0; i < rows * E; ++i) x_[sz(i)] = proj_[sz(i)] + x_[sz(i)];
    norm_rows(L.ffn_norm, rows);
    if (L.is_moe) {
      if (Result<void> r = moe_ffn(il, rows); !r) return r;
    } else {
      dense_ffn(il, rows);
    }
    for (int64_t i = 0; i < rows * E; ++i) x_[sz(i)] = proj_[sz(i)] + x_[sz(i)];
    phase_end(StepPhase::ffn_rest);
  }
  for (const SeqChunk& ch : chunks) ch.kv->advance(static_cast<int64_t>(ch.tokens.size()));
  if (timing_) phase_steps_.fetch_add(1, std::memory_order_relaxed);

  if (n_keep == 0) return {};
  CAR_CHECK(logits != nullptr);
  norm_rows(model_->output_norm(), rows);
  mm_rows(model_->output(), xn_.data(), rows, logits);
  if (const float* b = model_->output_bias(); b != nullptr) {
    for (int64_t i = 0; i < rows; ++i) add_bias(logits + i * hp_.n_vocab, b, hp_.n_vocab);
  }
  if (hp_.final_logit_softcap > 0.0f) softcap(logits, hp_.final_logit_softcap, rows * hp_.n_vocab);
  phase_end(StepPhase::output);
  return {};
}

const char* step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::embed:
      return "embed";
    case StepPhase::attn_proj:
      return "attn_proj";
    case StepPhase::rope_kv:
      return "rope_kv";
    case StepPhase::attention:
      return "attention";
    case StepPhase::attn_out:
      return "attn_out";
    case StepPhase::route:
      return "route";
    case StepPhase::ffn_gate_up:
      return "ffn_gate_up";
    case StepPhase::ffn_act:
      return "ffn_act";
    case StepPhase::ffn_down:
      return "ffn_down";
    case StepPhase::ffn_rest:
      return "ffn_rest";
    case StepPhase::output:
      return "output";
    case StepPhase::count:
      break;
  }
  return "?";
}

void ForwardPass::set_phase_timing(bool on) {
  if (on) {
    for (std::atomic<uint64_t>& ns : phase_ns_) ns.store(0, std::memory_order_relaxed);
    phase_steps_.store(0, std::memory_order_relaxed);
  }
  time_phases_.store(on, std::memory_order_relaxed);
}

StepPhaseTimes ForwardPass::phase_times() const {
  StepPhaseTimes t;
  for (size_t p = 0; p < t.seconds.size(); ++p) {
    t.seconds[p] = static_cast<double>(phase_ns_[p].load(std::memory_order_relaxed)) * 1e-9;
  }
  t.steps = phase_steps_.load(std::memory_order_relaxed);
  return t;
}

void ForwardPass::prefetch_layer(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t K = hp_.n_expert_used;
  // The router's input will be rms_norm(x + attention(x)) * ffn_norm; x itself is a cheap, usually close,
  // stand-in available before the attention runs. xn_ and the router scratch are recomputed before use.
  norm_rows(L.ffn_norm, n);
  route(il, n);
  std::fill(guessed_.begin(), guessed_.end(), uint8_t{0});
  guess_.clear();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = sel_ids_[sz(i * K + j)];
      if (guessed_[sz(e)] == 0) {
        guessed_[sz(e)] = 1;
        guess_.push_back(e);
      }
    }
  }
  // A batched step leases its experts in id order, in waves of slots(layer): guesses in that order make the
  // few slots a small cache has free go to the experts of the first wave, which use them before a later
  // wave's misses could evict them.
  std::sort(guess_.begin(), guess_.end());
  experts_->prefetch(static_cast<int>(il), guess_);
}

void ForwardPass::attention(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t E = hp_.n_embd;
  const int64_t dk = hp_.head_dim_k;
  const int64_t dv = hp_.head_dim_v;
  const int64_t n_head = hp_.n_head;
  const int64_t n_kv_head = hp_.n_head_kv;

  // This layer's K and V rows of the step's positions are cold (the weights streamed through the caches
  // since they were last near): ask for them now, for writing, so the stores below do not wait on each line
  // in turn while the projections run. A prompt's rows are consecutive and the hardware finds them itself.
  if (n <= kPrefetchKvRows) {
    for (int64_t i = 0; i < n; ++i) {
      KvCache& kv = *row_kv_[sz(i)];
      const int64_t pos = row_pos_[sz(i)];
      for (int64_t h = 0; h < n_kv_head; ++h) {
        const auto* kr = reinterpret_cast<const char*>(kv.k(il, h) + pos * dk);
        const auto* vr = reinterpret_cast<const char*>(kv.v(il, h) + pos * dv);
        for (int64_t b = 0; b < dk * 2; b += 64) __builtin_prefetch(kr + b, 1);
        for (int64_t b = 0; b < dv * 2; b += 64) __builtin_prefetch(vr + b, 1);
      }
    }
  }
  norm_rows(L.attn_norm, n);
  if (n == 1 && plain_one()) {
    const tensor::MatvecTask qkv[] = {
        {L.wq, xn_.data(), q_.data()}, {L.wk, xn_.data(), k_.data()}, {L.wv, xn_.data(), v_.data()}};
    tensor::matvec_fused(qkv, 3, pool_);
  } else {
    const tensor::MatmulTask qkv[] = {row_task(L.wq, xn_.data(), n, q_.data()),
                                      row_task(L.wk, xn_.data(), n, k_.data()),
                                      row_task(L.wv, xn_.data(), n, v_.data())};
    tensor::matmul_fused(qkv, 3, pool_);
  }
  phase_end(StepPhase::attn_proj);

  // Row by row (each writes only its own Q, K and cache rows), shared with the pool for a prompt: on one
  // thread this took 8-9 ms of a 128-token moe-2b prompt's step while the others waited (car bench --phases).
  parallel(n, kRopeGrain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t i = row_begin; i < row_end; ++i) {
      float* qi = q_.data() + i * hp_.q_dim();
      float* ki = k_.data() + i * hp_.k_dim();
      // Biases (qwen2): added to each projection before any norm or rotation, as llama.cpp's build_qkv.
      if (L.q_bias != nullptr) add_bias(qi, L.q_bias, hp_.q_dim());
      if (L.k_bias != nullptr) add_bias(ki, L.k_bias, hp_.k_dim());
      if (L.v_bias != nullptr) add_bias(v_.data() + i * hp_.v_dim(), L.v_bias, hp_.v_dim());
      if (L.q_norm != nullptr) {
        for (int64_t h = 0; h < n_head; ++h) rms_norm(qi + h * dk, L.q_norm, qi + h * dk, dk, hp_.rms_eps);
        for (int64_t h = 0; h < n_kv_head; ++h) rms_norm(ki + h * dk, L.k_norm, ki + h * dk, dk, hp_.rms_eps);
      }
      const bool swa_rope = hp_.swa_rope(il);
      const RopeParams& rp = swa_rope ? rope_swa_ : rope_;
      const float* rc = (swa_rope ? rope_cache_swa_ : rope_cache_).data() + i * hp_.n_rot;
      rope_apply(rp, rc, qi, n_head);
      rope_apply(rp, rc, ki, n_kv_head);
      // Gemma: Q scaled in float before the kernel rounds it to fp16 (the kernel's scale is then 1).
      if (hp_.attn_scale > 0.0f) {
        for (int64_t d = 0; d < hp_.q_dim(); ++d) qi[d] = qi[d] * hp_.attn_scale;
      }
      // Store K and V of this position in fp16.
      const float* vi = v_.data() + i * hp_.v_dim();
      KvCache& kv = *row_kv_[sz(i)];
      const int64_t pos = row_pos_[sz(i)];
      for (int64_t h = 0; h < n_kv_head; ++h) {
        to_fp16(ki + h * dk, kv.k(il, h) + pos * dk, dk);
        to_fp16(vi + h * dv, kv.v(il, h) + pos * dv, dv);
      }
    }
  });
  phase_end(StepPhase::rope_kv);

  const float scale = hp_.attn_scale > 0.0f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(dk));
  const int64_t group = n_head / n_kv_head;
  const float* sinks = L.attn_sinks;  // gpt-oss: one logit per head in the softmax's denominator
  // The keys and values a task reads (those of one KV head of one row) come from memory: a batched step's
  // expert weights pass through the caches between layers. Each thread takes whole KV groups in order (their
  // heads share those rows) and fetches the start of the next group's while it attends this one (the start:
  // a long context's rows are a sequential read the hardware prefetcher takes over). Decode at 8 streams of
  // moe-2b spent ~1 ms a step here with one head per task from a shared cursor, 0.5-0.6 ms so.
  struct KvRows {
    const uint16_t* k;
    const uint16_t* v;
    int64_t count;
  };
  auto kv_rows = [&](int64_t t) {  // the keys and values task t (row t / n_head, head t % n_head) attends
    const int64_t i = t / n_head;
    const KvCache& ckv = *row_kv_[sz(i)];
    const int64_t g = (t % n_head) / group;
    // Positions before the layer's sliding window are masked (-inf) in llama.cpp, which its flash
    // attention skips; starting the loop at the window's first key is the same arithmetic.
    const int64_t pos = row_pos_[sz(i)];
    const int64_t first = ckv.first_visible(il, pos);
    return KvRows{ckv.k(il, g) + first * dk, ckv.v(il, g) + first * dv, pos + 1 - first};
  };
  auto prefetch_kv = [&](int64_t t) {  // their first 8 KiB each
    const KvRows r = kv_rows(t);
    const auto* kb = reinterpret_cast<const char*>(r.k);
    const auto* vb = reinterpret_cast<const char*>(r.v);
    const int64_t k_bytes = std::min<int64_t>(r.count * dk, kPrefetchKvElems) * 2;
    const int64_t v_bytes = std::min<int64_t>(r.count * dv, kPrefetchKvElems) * 2;
    for (int64_t off = 0; off < k_bytes; off += 64) __builtin_prefetch(kb + off);
    for (int64_t off = 0; off < v_bytes; off += 64) __builtin_prefetch(vb + off);
  };
  auto task = [&](int64_t begin, int64_t end) {
    std::array<uint16_t, kMaxHeadDim> q16;
    std::array<uint16_t, kMaxHeadDim> acc16;
    if (end < n * n_head) prefetch_kv(end);
    // Whole KV groups (the shares and the inline loop below are in units of `group`): a group's heads read
    // the same keys and values, which attend_group converts once for two heads.
    for (int64_t t = begin; t < end; t += group) {
      const int64_t i = t / n_head;
      const int64_t h = t % n_head;
      const KvRows r = kv_rows(t);
      const float* qh = q_.data() + i * hp_.q_dim() + h * dk;
      float* out = attn_.data() + i * hp_.attn_out_dim() + h * dv;
      if (hp_.attn_logit_softcap > 0.0f) {  // gemma2: the cap sits inside the softmax (no sinks there)
        for (int64_t j = 0; j < group; ++j) {
          attend_head_softcap(qh + j * dk, r.k, r.v, r.count, dk, dv, scale, hp_.attn_logit_softcap,
                              out + j * dv, q16.data(), acc16.data());
        }
      } else {
        tensor::attend_group(qh, group, r.k, r.v, r.count, dk, dv, scale, out,
                             sinks != nullptr ? sinks + h : nullptr, q16.data(), acc16.data());
      }
    }
  };
  if (pool_ == nullptr || pool_->size() == 1 || n * n_head <= group) {
    for (int64_t t = 0; t < n * n_head; t += group) task(t, t + group);
  } else {
    pool_->parallel_for_shares(n * n_head, group, 0, task);
  }
  phase_end(StepPhase::attention);
  mm_rows(L.wo, attn_.data(), n, proj_.data());
  if (L.o_bias != nullptr) {
    for (int64_t i = 0; i < n; ++i) add_bias(proj_.data() + i * E, L.o_bias, E);
  }
  post_norm(L.attn_post_norm, n);
  phase_end(StepPhase::attn_out);
}

namespace {

/// Push the product y = W x of one head's matrix W of deepseek2's attn_k_b / attn_v_b. llama.cpp keeps these
/// 3-D tensors in plain form (its CPU repacking takes 2-D weights only), so a head whose type and row count
/// our kernels would sum in a repacked order is split into 7-row pieces, which they sum row by row in the
/// plain dot order (each row's result is the same in any split). A row of a batch of 2 or more (`sgemm`)
/// takes llamafile's order unless the head is F32: ggml's mul_mat rounds the permuted activation to the
/// vec_dot type (Q8_0, Q8_K, F16, BF16) into a contiguous buffer, which llamafile_sgemm accepts
/// (tensor::ProductOrder::sgemm: F16 / BF16 the mul_mat order); an F32 head's activation needs no rounding,
/// stays permuted, and goes to ggml_vec_dot_f32 (the mul_mat_id order the model set).
void push_head_product(std::vector<tensor::MatvecTask>& tasks, tensor::MatrixView w, const float* x, float* y,
                       bool sgemm) {
  if (sgemm && w.type != GgmlType::F32) w.order = tensor::ProductOrder::sgemm;  // never repacked()
  if (!tensor::detail::repacked(w)) {
    tasks.push_back({w, x, y});
    return;
  }
  const int64_t rows = w.rows;
  for (int64_t r = 0; r < rows; r += 7) {
    tensor::MatrixView piece = w;
    piece.data += sz(r) * w.row_bytes;
    piece.rows = std::min<int64_t>(7, rows - r);
    tasks.push_back({piece, x, y + r});
  }
}

}  // namespace

void ForwardPass::attention_mla(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t n_head = hp_.n_head;
  const int64_t dq = hp_.head_dim_k;  // a query head: [nope | rope]
  const int64_t nope = dq - hp_.n_rot;
  const int64_t rank = hp_.kv_lora_rank;
  const int64_t dc = hp_.mla_cache_dim_k();  // a cache row / absorbed query head: [latent | rope]
  const int64_t dv = hp_.head_dim_v;

  norm_rows(L.attn_norm, n);
  // q = wq h, or wq_b(rms_norm(wq_a h) * attn_q_a_norm); [latent | k_pe] = wkv_a_mqa h.
  if (hp_.q_lora_rank > 0) {
    mm_rows(L.wq_a, xn_.data(), n, mla_qa_.data());
    for (int64_t i = 0; i < n; ++i) {
      float* qa = mla_qa_.data() + i * hp_.q_lora_rank;
      rms_norm(qa, L.q_a_norm, qa, hp_.q_lora_rank, hp_.rms_eps);
    }
    mm_rows(L.wq_b, mla_qa_.data(), n, q_.data());
  } else {
    mm_rows(L.wq, xn_.data(), n, q_.data());
  }
  mm_rows(L.wkv_a_mqa, xn_.data(), n, mla_kv_.data());

  // Per row: rotate k_pe, norm the latent, cache [latent | k_pe] (and the latent as the value) in fp16; each
  // head's absorbed query is [attn_k_b[h] q_nope | rope(q_pe)].
  mla_tasks_.clear();
  for (int64_t i = 0; i < n; ++i) {
    const float* rc = rope_cache_.data() + i * hp_.n_rot;
    float* kv_row = mla_kv_.data() + i * dc;
    rope_apply(rope_mla_, rc, kv_row + rank, 1);
    rms_norm(kv_row, L.kv_a_norm, kv_row, rank, hp_.rms_eps);
    KvCache& kv = *row_kv_[sz(i)];
    const int64_t pos = row_pos_[sz(i)];
    to_fp16(kv_row, kv.k(il, 0) + pos * dc, dc);
    to_fp16(kv_row, kv.v(il, 0) + pos * rank, rank);
    for (int64_t h = 0; h < n_head; ++h) {
      const float* qh = q_.data() + i * hp_.q_dim() + h * dq;
      float* qa = mla_q_.data() + (i * n_head + h) * dc;
      std::memcpy(qa + rank, qh + nope, sz(hp_.n_rot) * sizeof(float));
      rope_apply(rope_mla_, rc, qa + rank, 1);
      tensor::MatrixView wk = L.wk_b;
      wk.data += sz(h * rank) * wk.row_bytes;
      wk.rows = rank;
      push_head_product(mla_tasks_, wk, qh, qa, sgemm_[sz(i)] != 0);
    }
  }
  tensor::matvec_fused(mla_tasks_.data(), mla_tasks_.size(), pool_);

  // Attention of every absorbed head over the one cached latent head (MQA), llama.cpp's kq_scale.
  const float scale = hp_.mla_kq_scale;
  auto task = [&](int64_t begin, int64_t end) {
    std::array<uint16_t, kMaxHeadDim> q16;
    std::array<uint16_t, kMaxHeadDim> acc16;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / n_head;
      const KvCache& ckv = *row_kv_[sz(i)];
      const int64_t pos = row_pos_[sz(i)];
      attend_head(mla_q_.data() + t * dc, ckv.k(il, 0), ckv.v(il, 0), pos + 1, dc, rank, scale,
                  mla_lat_.data() + t * rank, q16.data(), acc16.data());
    }
  };
  parallel(n * n_head, 1, task);

  // Decompress each head's latent output with attn_v_b[h], then wo.
  mla_tasks_.clear();
  for (int64_t t = 0; t < n * n_head; ++t) {
    const int64_t h = t % n_head;
    tensor::MatrixView wv = L.wv_b;
    wv.data += sz(h * dv) * wv.row_bytes;
    wv.rows = dv;
    push_head_product(mla_tasks_, wv, mla_lat_.data() + t * rank, attn_.data() + t * dv, sgemm_[sz(t / n_head)] != 0);
  }
  tensor::matvec_fused(mla_tasks_.data(), mla_tasks_.size(), pool_);
  mm_rows(L.wo, attn_.data(), n, proj_.data());
}

void ForwardPass::post_norm(const float* w, int64_t n) {
  if (w == nullptr) return;
  const int64_t E = hp_.n_embd;
  for (int64_t i = 0; i < n; ++i) rms_norm(proj_.data() + i * E, w, proj_.data() + i * E, E, hp_.rms_eps);
}

void ForwardPass::dense_ffn(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t ff = hp_.n_ff;
  if (n == 1 && plain_one()) {
    const tensor::MatvecTask gate_up[] = {{L.ffn_gate, xn_.data(), gate_.data()},
                                          {L.ffn_up, xn_.data(), up_.data()}};
    tensor::matvec_fused(gate_up, 2, pool_);
  } else {
    const tensor::MatmulTask gate_up[] = {row_task(L.ffn_gate, xn_.data(), n, gate_.data()),
                                          row_task(L.ffn_up, xn_.data(), n, up_.data())};
    tensor::matmul_fused(gate_up, 2, pool_);
  }
  phase_end(StepPhase::ffn_gate_up);
  glu(n * ff);
  phase_end(StepPhase::ffn_act);
  mm_rows(L.ffn_down, gate_.data(), n, proj_.data());
  post_norm(L.ffn_post_norm, n);
  phase_end(StepPhase::ffn_down);
}

Result<void> ForwardPass::moe_ffn(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t NE = hp_.n_expert;
  const int64_t K = hp_.n_expert_used;

  route(il, n);
  phase_end(StepPhase::route);
  if (n == 1) {
    if (Result<void> r = moe_ffn_token(il); !r) return r;
    if (L.has_shexp) shared_expert(il, 1);
    return {};
  }

  // Dispatch: group the (row, slot) assignments by expert (counting sort; rows stay in increasing order).
  std::fill(group_start_.begin(), group_start_.end(), 0);
  for (int64_t a = 0; a < n * K; ++a) ++group_start_[sz(sel_ids_[sz(a)]) + 1];
  for (int64_t e = 0; e < NE; ++e) group_start_[sz(e + 1)] += group_start_[sz(e)];
  active_.clear();
  for (int64_t e = 0; e < NE; ++e) {
    if (group_start_[sz(e + 1)] > group_start_[sz(e)]) active_.push_back(static_cast<int32_t>(e));
  }
  for (int64_t e = 0; e < NE; ++e) cursor_[sz(e)] = group_start_[sz(e)];
  for (int64_t a = 0; a < n * K; ++a) group_rows_[sz(cursor_[sz(sel_ids_[sz(a)])]++)] = static_cast<int32_t>(a);

  // Run each distinct expert on its rows, leased once per batch in waves no larger than the source's free
  // slots; the products per expert and the slot sum below do not depend on the waves.
  const size_t wave = static_cast<size_t>(std::max(1, experts_->slots(static_cast<int>(il))));
  for (size_t first = 0; first < active_.size(); first += wave) {
    const size_t count = std::min(wave, active_.size() - first);
    Result<void> r = experts_->acquire_many(static_cast<int>(il),
                                            std::span<const int32_t>(active_.data() + first, count), leases_);
    if (!r) return r;
    CAR_CHECK(leases_.size() == count);
    run_experts(il, first, count);
    leases_.clear();
  }

  // Combine: each row's weighted expert outputs, summed.
  sum_slots(n);
  if (L.has_shexp) shared_expert(il, n);
  return {};
}

void ForwardPass::route(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t NE = hp_.n_expert;
  const int64_t K = hp_.n_expert_used;
  // The router (F32 weights: the input is not rounded), its bias when it has one (gpt-oss), and the top-k
  // experts and their weights per row as the architecture's gating computes them.
  mm_rows(L.ffn_gate_inp, xn_.data(), n, router_.data());
  if (hp_.is_mla()) {
    Deepseek2Routing r;
    r.sigmoid = hp_.gating_sigmoid;
    r.bias = L.exp_probs_b;
    r.n_groups = hp_.n_expert_groups;
    r.n_group_used = hp_.n_group_used;
    r.norm = hp_.expert_weights_norm;
    r.scale = hp_.expert_weights_scale;
    for (int64_t i = 0; i < n; ++i) {
      select_experts_deepseek2(router_.data() + i * NE, NE, K, r, probs_.data() + i * NE, mla_sel_.data(),
                               sel_ids_.data() + i * K, sel_w_.data() + i * K);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (L.ffn_gate_inp_bias != nullptr) add_bias(router_.data() + i * NE, L.ffn_gate_inp_bias, NE);
    select_experts(router_.data() + i * NE, NE, K, hp_.traits->moe_norm_weights, probs_.data() + i * NE,
                   sel_ids_.data() + i * K, sel_w_.data() + i * K, hp_.traits->expert_gating);
  }
}

void ForwardPass::expert_glu(int64_t count) {
  if (hp_.traits->expert_activation == model::ExpertActivation::swiglu) {
    glu(count);
    return;
  }
  float* g = gate_.data();
  const float* u = up_.data();
  if (pool_ == nullptr || pool_->size() == 1 || count < kMinParallelGlu) {
    swiglu_oai(g, u, g, count);
    return;
  }
  pool_->parallel_for_shares(count, kGluGrain, 0,
                             [&](int64_t b, int64_t e) { swiglu_oai(g + b, u + b, g + b, e - b); });
}

void ForwardPass::shared_expert(int64_t il, int64_t n) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t E = hp_.n_embd;
  const int64_t ff = hp_.n_ff_shexp;
  // Dense products over xn_'s rows (the same input as the routed experts): the gate's logit s per row, then
  // SwiGLU into gate_ and the down projection into xe_ (both free once the slots are summed).
  const bool gated = L.ffn_gate_inp_shexp.data != nullptr;  // deepseek2's shared experts have no gate
  if (n == 1 && plain_one()) {
    const tensor::MatvecTask tasks[] = {{L.ffn_gate_shexp, xn_.data(), gate_.data()},
                                        {L.ffn_up_shexp, xn_.data(), up_.data()},
                                        {L.ffn_gate_inp_shexp, xn_.data(), shexp_gate_.data()}};
    tensor::matvec_fused(tasks, gated ? 3 : 2, pool_);
  } else {
    const tensor::MatmulTask tasks[] = {row_task(L.ffn_gate_shexp, xn_.data(), n, gate_.data()),
                                        row_task(L.ffn_up_shexp, xn_.data(), n, up_.data()),
                                        row_task(L.ffn_gate_inp_shexp, xn_.data(), n, shexp_gate_.data())};
    tensor::matmul_fused(tasks, gated ? 3 : 2, pool_);
  }
  glu(n * ff);
  mm_rows(L.ffn_down_shexp, gate_.data(), n, xe_.data());
  if (!gated) {
    // llama.cpp's ggml_add(moe_out, ffn_shexp).
    for (int64_t i = 0; i < n * E; ++i) proj_[sz(i)] = proj_[sz(i)] + xe_[sz(i)];
    return;
  }
  // proj_ (the routed sum) += shared * g, g = silu(s) / s: llama.cpp's ggml_div(ggml_silu(s), s), the product
  // rounded before the sum (ggml_mul, then ggml_add). s == 0 would be 0 / 0 there; its limit is 1/2.
  for (int64_t i = 0; i < n; ++i) {
    const float s = shexp_gate_[sz(i)];
    const float g = s == 0.0f ? 0.5f : (s / (1.0f + std::exp(-s))) / s;
    float* out = proj_.data() + i * E;
    const float* sh = xe_.data() + i * E;
    for (int64_t d = 0; d < E; ++d) {
      const float scaled = sh[d] * g;
      out[d] = out[d] + scaled;
    }
  }
}

void ForwardPass::run_experts(int64_t il, size_t first, size_t count) {
  const model::LayerWeights& L = model_->layers()[sz(il)];
  const int64_t E = hp_.n_embd;
  const int64_t K = hp_.n_expert_used;
  const int64_t ff = hp_.n_ff_exp;
  // The experts in groups whose rows fit the buffers (xe_ and proj_ hold max_batch_ rows, gate_ and up_ at
  // least as many; an expert has at most one row per token, so any one fits): per group, every expert's gate
  // and up in one fused region, the activation over all their rows, every down in a second region. A batched
  // decode step's experts have a few rows each, and a region per product left the threads waiting on each
  // other's tails; the products are each expert's own matmul, so the bits do not change.
  for (size_t j0 = 0; j0 < count;) {
    size_t j1 = j0;
    int64_t rows = 0;
    while (j1 < count) {
      const int32_t e = active_[first + j1];
      const int64_t m = group_start_[sz(e) + 1] - group_start_[sz(e)];
      if (j1 > j0 && rows + m > max_batch_) break;
      rows += m;
      ++j1;
    }
    // Gather each expert's rows, then its gate and up products.
    expert_tasks_.clear();
    for (size_t j = j0, off = 0; j < j1; ++j) {
      const int32_t e = active_[first + j];
      const experts::ExpertWeights& w = leases_[j].weights();
      const int32_t g0 = group_start_[sz(e)];
      const int64_t m = group_start_[sz(e) + 1] - g0;
      float* xin = xe_.data() + off * sz(E);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t row = group_rows_[sz(g0 + r)] / K;
        std::memcpy(xin + r * E, xn_.data() + row * E, sz(E) * sizeof(float));
      }
      expert_tasks_.push_back({w.gate, xin, m, E, gate_.data() + off * sz(ff), ff});
      expert_tasks_.push_back({w.up, xin, m, E, up_.data() + off * sz(ff), ff});
      off += sz(m);
    }
    tensor::matmul_fused(expert_tasks_.data(), expert_tasks_.size(), pool_);
    if (L.ffn_gate_exps_bias != nullptr) {
      // Expert biases (gpt-oss): llama.cpp's ggml_add_id after each product, expert e's row to its rows.
      for (size_t j = j0, off = 0; j < j1; ++j) {
        const int32_t e = active_[first + j];
        const int64_t m = group_start_[sz(e) + 1] - group_start_[sz(e)];
        for (int64_t r = 0; r < m; ++r) {
          add_bias(up_.data() + (sz(off) + sz(r)) * sz(ff), L.ffn_up_exps_bias + e * ff, ff);
          add_bias(gate_.data() + (sz(off) + sz(r)) * sz(ff), L.ffn_gate_exps_bias + e * ff, ff);
        }
        off += sz(m);
      }
    }
    phase_end(StepPhase::ffn_gate_up);
    expert_glu(rows * ff);
    phase_end(StepPhase::ffn_act);
    // The downs into proj_ (free until the slots are summed below), then each row's weighted output to its
    // slot.
    expert_tasks_.clear();
    for (size_t j = j0, off = 0; j < j1; ++j) {
      const int32_t e = active_[first + j];
      const int64_t m = group_start_[sz(e) + 1] - group_start_[sz(e)];
      expert_tasks_.push_back(
          {leases_[j].weights().down, gate_.data() + off * sz(ff), m, ff, proj_.data() + off * sz(E), E});
      off += sz(m);
    }
    tensor::matmul_fused(expert_tasks_.data(), expert_tasks_.size(), pool_);
    for (size_t j = j0, off = 0; j < j1; ++j) {
      const int32_t e = active_[first + j];
      const int32_t g0 = group_start_[sz(e)];
      const int64_t m = group_start_[sz(e) + 1] - g0;
      for (int64_t r = 0; r < m; ++r) {
        float* src = proj_.data() + (sz(off) + sz(r)) * sz(E);
        if (L.ffn_down_exps_bias != nullptr) add_bias(src, L.ffn_down_exps_bias + e * E, E);
        const int32_t a = group_rows_[sz(g0 + r)];
        const float wgt = sel_w_[sz(a)];
        float* dst = slot_out_.data() + sz(a) * sz(E);
        for (int64_t d = 0; d < E; ++d) dst[d] = src[d] * wgt;
      }
      off += sz(m);
    }
    phase_end(StepPhase::ffn_down);
    j0 = j1;
  }
}

Result<void> ForwardPass::moe_ffn_token(int64_t il) {
  const int64_t E = hp_.n_embd;
  const int64_t K = hp_.n_expert_used;
  const int64_t ff = hp_.n_ff_exp;
  // One token: its K experts are distinct, so every expert has one row. Lease all K at once (one
  // acquire_many: a streaming source reads the misses together), run every chosen expert's gate and up in
  // one parallel region and all downs in a second, each slot into its own scratch.
  Result<void> r =
      experts_->acquire_many(static_cast<int>(il), std::span<const int32_t>(sel_ids_.data(), sz(K)), leases_);
  if (!r) return r;
  CAR_CHECK(static_cast<int64_t>(leases_.size()) == K);
  tasks_.clear();
  for (int64_t j = 0; j < K; ++j) {
    const experts::ExpertWeights& w = leases_[sz(j)].weights();
    tasks_.push_back({w.gate, xn_.data(), gate_.data() + j * ff});
    tasks_.push_back({w.up, xn_.data(), up_.data() + j * ff});
  }
  tensor::matvec_fused(tasks_.data(), tasks_.size(), pool_);
  const model::LayerWeights& L = model_->layers()[sz(il)];
  if (L.ffn_gate_exps_bias != nullptr) {
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = sel_ids_[sz(j)];
      add_bias(up_.data() + j * ff, L.ffn_up_exps_bias + e * ff, ff);
      add_bias(gate_.data() + j * ff, L.ffn_gate_exps_bias + e * ff, ff);
    }
  }
  phase_end(StepPhase::ffn_gate_up);
  expert_glu(K * ff);
  phase_end(StepPhase::ffn_act);
  tasks_.clear();
  for (int64_t j = 0; j < K; ++j) {
    tasks_.push_back({leases_[sz(j)].weights().down, gate_.data() + j * ff, slot_out_.data() + j * E});
  }
  tensor::matvec_fused(tasks_.data(), tasks_.size(), pool_);
  leases_.clear();
  for (int64_t j = 0; j < K; ++j) {
    const float wgt = sel_w_[sz(j)];
    float* dst = slot_out_.data() + j * E;
    if (L.ffn_down_exps_bias != nullptr) add_bias(dst, L.ffn_down_exps_bias + sel_ids_[sz(j)] * E, E);
    for (int64_t d = 0; d < E; ++d) dst[d] = dst[d] * wgt;
  }
  phase_end(StepPhase::ffn_down);
  sum_slots(1);
  return {};
}

void ForwardPass::sum_slots(int64_t n) {
  const int64_t E = hp_.n_embd;
  const int64_t K = hp_.n_expert_used;
  // Sum the slots in selection order (largest weight first), as llama.cpp adds the per-slot views.
  for (int64_t i = 0; i < n; ++i) {
    float* out = proj_.data() + i * E;
    const float* s0 = slot_out_.data() + sz(i * K) * sz(E);
    std::memcpy(out, s0, sz(E) * sizeof(float));
    for (int64_t j = 1; j < K; ++j) {
      const float* sj = slot_out_.data() + sz(i * K + j) * sz(E);
      for (int64_t d = 0; d < E; ++d) out[d] += sj[d];
    }
  }
}

}  // namespace car::engine
