// ForwardPass: evaluates a Model on a batch of token ids, appending their keys/values to a KvCache and
// producing logits - the one transformer every supported architecture shares (see core/model/architecture.h):
//
//   x = embed(tokens)                                       dequantized rows of token_embd (gemma: x sqrtf(n_embd))
//   for each layer:
//     h = rms_norm(x) * attn_norm
//     q, k, v = h Wq + bq, h Wk + bk, h Wv + bv             (biases when the file has them: qwen2;
//                                                           qk_norm archs: per-head rms_norm of q, k)
//     q, k = rope(q, pos), rope(k, pos);  cache k, v in fp16   (gemma3's windowed layers: their own RoPE base;
//                                                           gemma: q *= attn_scale, the kernel's scale 1)
//     x += post(attention(q, cache) Wo + bo)                causal, grouped-query: q head h reads kv head h / (n_head / n_head_kv);
//                                                           a sliding-window layer reads only the keys at
//                                                           pos - p' < window (KvCache::first_visible);
//                                                           post = rms_norm * attn_post_norm (gemma), else none;
//                                                           gemma2: scores soft-capped (attend_head_softcap);
//                                                           gpt-oss: each head's sink logit joins its softmax; + bo
//     h = rms_norm(x) * ffn_norm
//     x += dense: post((act(h Wgate) * (h Wup)) Wdown)     act = silu, or gelu (gemma); post: ffn_post_norm
//          moe:   sum over the router's top-k experts e of weight_e * expert_e(h)    (ExpertSource)
//                 gpt-oss: router / expert biases, weights = softmax of the top-k logits, swiglu_oai
//                 + sigmoid(h . w_gate_shexp) * shared_expert(h)   (qwen2moe: a resident dense SwiGLU FFN)
//   logits = (rms_norm(x) * output_norm) Wout (+ output bias when the file has one)
//            (then c * tanh(logits / c) with final_logit_softcapping c)
//
// A batch (prompt processing) runs every product as a matrix-matrix product over its rows, and an MoE layer
// groups the batch's rows by expert so each chosen expert's weights are read once per batch; a single token
// (decode) uses matrix-vector products. Batches longer than max_batch() are split. All scratch is allocated
// in the constructor: eval() allocates nothing.
//
// Experts come from the ExpertSource as leases. Decode leases the token's K experts with one acquire_many;
// a batch leases its distinct experts with acquire_many in waves of at most slots(layer) experts, so a
// streamed source's cache never has to hold more than its budget. With prefetch on (and a streaming
// source), before layer L's attention the router of layer L is applied to the residual stream as it left
// layer L-1 (normed with L's ffn_norm) and the top-k guesses are passed to prefetch(L), so their reads
// overlap the attention (a batched step guesses the union of its rows' experts, in id order: the order its
// waves lease them; the source decides, from
// the guesses' measured precision, whether to read them ahead or only score them); this reads scratch only
// and never changes a result. Which experts are leased,
// and in what waves, never changes a product or the summation order: output is bit-identical to the
// resident source's. A failed read (io_error) ends eval() with that error; the cache is not advanced for
// the failing batch and the ForwardPass stays usable.
//
// Thread safety: a ForwardPass is mutable scratch; one eval() at a time. The Model and ExpertSource it uses
// are shared and must outlive it; the ThreadPool (may be null = single-threaded) too.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/engine/kv_cache.h"
#include "core/engine/ops.h"
#include "core/experts/expert_source.h"
#include "core/model/model.h"
#include "core/util/result.h"
#include "core/util/thread_pool.h"

namespace car::engine {

/// The largest K / V head dimension ForwardPass computes (its attention tasks keep a head in stack scratch);
/// load_model refuses models with larger heads.
inline constexpr int64_t kMaxHeadDim = 1024;

/// One sequence's part of a batched step (ForwardPass::eval_step): `tokens` evaluated at positions
/// kv->n_past() ... of its own cache, and which of its rows produce logits.
struct SeqChunk {
  enum class Output { none, last, all };
  KvCache* kv = nullptr;
  std::span<const int32_t> tokens;
  Output output = Output::none;
  /// Repacked products (tensor::matmul_ordered): rows at positions below gemm_end take llama.cpp's gemm
  /// order, the others its gemv order. -1 = the rule of a batch of this chunk alone (its whole groups of 4
  /// rows gemm). The scheduler gives a prompt's rows gemm_end = the prompt's whole groups of 4 from
  /// position 0, so a row's order depends neither on the chunking nor on a reused prefix.
  int64_t gemm_end = -1;
  /// IQ panel products (tensor::matmul_ordered, iq_panel_product): rows at positions below panel_end take
  /// llama.cpp's panel order, the others the dot order. -1 = the rule of a batch of this chunk alone (every
  /// row if it has 8 or more). The scheduler gives a prompt's rows iq_panel_end(0, prompt length), for the
  /// same reason as gemm_end.
  int64_t panel_end = -1;
  /// Quantized products llama.cpp hands to llamafile's tinyBLAS (tensor::ProductOrder::sgemm; deepseek2's
  /// per-head attn_k_b / attn_v_b): rows at positions below sgemm_end take that order, the others the dot
  /// order. -1 = the rule of a batch of this chunk alone (every row if it has 2 or more). The scheduler gives
  /// a prompt's rows sgemm_end(0, prompt length), for the same reason as gemm_end.
  int64_t sgemm_end = -1;
};

/// llama.cpp's batch of n tokens from position `begin` runs in ubatches of kLlamaUbatch; those of 8 or more
/// rows take the IQ panel order. The end of the positions that do: begin + n, or the end of the last whole
/// ubatch when the remainder is under 8.
inline constexpr int64_t kLlamaUbatch = 512;
/// The end of the positions of a batch of n tokens from `begin` that fall in ubatches of `min_rows` or more.
inline int64_t ubatch_rows_end(int64_t begin, int64_t n, int64_t min_rows) {
  const int64_t rest = n % kLlamaUbatch;
  return begin + (rest >= min_rows ? n : n - rest);
}
inline int64_t iq_panel_end(int64_t begin, int64_t n) {
  return ubatch_rows_end(begin, n, 8);
}
/// llamafile's sgemm takes ubatches of 2 or more rows (a single row goes to ggml_vec_dot_*).
inline int64_t sgemm_end(int64_t begin, int64_t n) {
  return ubatch_rows_end(begin, n, 2);
}

/// The parts of a forward step whose wall time ForwardPass::set_phase_timing measures, in step order. Each
/// phase ends where its work does and takes all the time since the previous one ended (the small glue
/// between products - residual adds, norms, gathers - goes to the product that follows it).
enum class StepPhase : int {
  embed,        ///< the KV pages the step writes (KvCache::prepare), token embeddings, RoPE tables
  attn_proj,    ///< attention norm and the Q / K / V products (an MLA layer's whole attention: `attention`)
  rope_kv,      ///< biases, Q / K norms, RoPE, the K / V stores
  attention,    ///< the attention kernel over each row's cache
  attn_out,     ///< the attention output product (and post-norm)
  route,        ///< residual, FFN norm, the router and its top-k (MoE layers)
  ffn_gate_up,  ///< the FFN's gate and up products: a dense layer's, or the routed experts' (with the gather)
  ffn_act,      ///< the gated activation (SwiGLU, GELU, swiglu_oai)
  ffn_down,     ///< the FFN's down product(s)
  ffn_rest,     ///< the rest of the layer: expert weights' sum, the shared expert, the residual
  output,       ///< the final norm and the output (vocabulary) product
  count
};
inline constexpr int kStepPhases = static_cast<int>(StepPhase::count);
/// The phase's name in car bench's table and JSON ("attn_proj", ...).
const char* step_phase_name(StepPhase p);

/// Step phases summed over steps since timing was switched on.
struct StepPhaseTimes {
  std::array<double, kStepPhases> seconds{};
  uint64_t steps = 0;
};

class ForwardPass {
 public:
  /// `experts` may be null for a dense model.
  ForwardPass(std::shared_ptr<const model::Model> model, experts::ExpertSource* experts, ThreadPool* pool,
              int64_t max_batch = 64);

  /// Evaluate `tokens` (each in [0, n_vocab)) at positions kv.n_past() ... and advance the cache.
  /// Precondition: kv.n_past() + tokens.size() <= kv.n_ctx(). `logits` receives n_vocab floats per token
  /// when `all_rows`, else only the last token's n_vocab floats. Errors: the expert source's (io_error);
  /// batches before the failing one stay in the cache (kv.n_past() says how far it got).
  Result<void> eval(std::span<const int32_t> tokens, KvCache& kv, float* logits, bool all_rows);

  /// Evaluate several sequences' chunks in one pass (continuous batching): every weight product runs once
  /// over all their rows, attention reads each row's own cache. A row's summation order depends only on its
  /// own chunk (its position against gemm_end, see SeqChunk; matmul_ordered), never on the company, so a
  /// sequence's results are bit-identical alone and batched. With gemm_end = -1 a chunk's rows are computed
  /// as eval() of that chunk alone computes them. `logits` receives n_vocab floats per output row, in chunk
  /// order (Output::last: one row, Output::all: one per token).
  /// Preconditions: 1 <= total tokens <= max_batch(); each chunk fits its cache; no cache appears twice.
  /// Errors: the expert source's (io_error); then no cache is advanced.
  Result<void> eval_step(std::span<const SeqChunk> chunks, float* logits);

  /// Time each step's phases (StepPhase) on the calling thread: a clock read at each phase's end, summed
  /// into totals another thread may read (phase_times). Off by default (one branch per phase when off);
  /// switching on clears the totals. Changes no result.
  void set_phase_timing(bool on);
  StepPhaseTimes phase_times() const;

  /// Prefetch the next MoE layer's guessed experts (streaming sources only). On by default.
  void set_prefetch(bool on) { prefetch_ = on; }
  bool prefetch() const { return prefetch_; }

  /// A cache sized for this model: make_cache throws std::bad_alloc where create_cache returns the mapping's
  /// error. Every cache a forward pass runs on must come from one of them: the geometry is the model's
  /// (deepseek2's MLA caches one [latent | rope key] head, not n_head_kv heads of head_dim_k).
  KvCache make_cache(int64_t n_ctx) const;
  Result<KvCache> create_cache(int64_t n_ctx) const;

  const model::Model& model() const { return *model_; }
  int64_t max_batch() const { return max_batch_; }
  /// Bytes of scratch this object holds.
  uint64_t scratch_bytes() const;
  /// What scratch_bytes() will be for a model of `hp` and `max_batch`, without building one (the memory
  /// estimate made before loading; tests/engine/memory_estimate_test.cpp keeps the two equal).
  static uint64_t scratch_bytes_for(const model::Hparams& hp, int64_t max_batch);
  /// Bytes of the KV cache make_cache(n_ctx) allocates for `hp`.
  static uint64_t kv_cache_bytes_for(const model::Hparams& hp, int64_t n_ctx);

 private:
  using PhaseClock = std::chrono::steady_clock;
  /// The phase `p` ends now: the time since the previous phase ended is its.
  void phase_end(StepPhase p) {
    if (!timing_) return;
    const PhaseClock::time_point now = PhaseClock::now();
    phase_ns_[static_cast<size_t>(p)].fetch_add(
        static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - phase_last_).count()),
        std::memory_order_relaxed);
    phase_last_ = now;
  }
  void embed(const int32_t* tokens, int64_t n);
  void attention(int64_t il, int64_t n);
  /// deepseek2's multi-head latent attention in llama.cpp's absorbed form (model/deepseek2.cpp): proj_ rows =
  /// wo(attn_v_b(attention over the cached latent of the absorbed queries)) of x_'s n rows.
  void attention_mla(int64_t il, int64_t n);
  /// proj_'s n rows = rms_norm(row) * w (a sub-block's post norm, gemma); nothing when w is null.
  void post_norm(const float* w, int64_t n);
  void dense_ffn(int64_t il, int64_t n);
  Result<void> moe_ffn(int64_t il, int64_t n);
  /// moe_ffn for one token (decode): all chosen experts' products in two parallel regions.
  Result<void> moe_ffn_token(int64_t il);
  /// proj_ rows += sigmoid-gated shared expert of xn_'s n rows (layers with has_shexp).
  void shared_expert(int64_t il, int64_t n);
  /// The products of layer il's experts active_[first, first + count), whose leases are leases_[0, count).
  void run_experts(int64_t il, size_t first, size_t count);
  /// router_ rows = layer il's router logits of xn_'s n rows (+ its bias); sel_ids_ / sel_w_ = each row's
  /// experts and weights by the architecture's gating (probs_ scratch).
  void route(int64_t il, int64_t n);
  /// The routed experts' activation over gate_ / up_ [0, count): glu() or gpt-oss's swiglu_oai.
  void expert_glu(int64_t count);
  /// Guess MoE layer il's experts from x_'s n rows and prefetch them (uses router/selection scratch and xn_).
  void prefetch_layer(int64_t il, int64_t n);
  /// proj_ rows = the sum of each row's weighted slot outputs, in selection order.
  void sum_slots(int64_t n);
  /// y (n x w.rows) = x (n x w.cols) W^T, each input row rounded as the weight type requires (the batch
  /// rule for repacked orders: an expert's gathered rows).
  void mm(const tensor::MatrixView& w, const float* x, int64_t n, float* y);
  /// mm over the step's rows x_ / xn_ / attn_ / gate_ layout: row i in the orders gemm_[i] and panel_[i] say.
  void mm_rows(const tensor::MatrixView& w, const float* x, int64_t n, float* y);
  /// mm_rows' product as a task of a fused group (tensor::matmul_fused: products that are ready together in
  /// one fork-join, their shared input rounded once).
  tensor::MatmulTask row_task(const tensor::MatrixView& w, const float* x, int64_t n, float* y) const;
  /// xn_ = rms_norm(x_) * w over rows [0, n), on the pool when there are enough rows.
  void norm_rows(const float* w, int64_t n);
  /// gate_[i] = act(gate_[i], up_[i]) (swiglu, or geglu for FfnAct::gelu) for i in [0, count), on the pool
  /// when it is long enough.
  void glu(int64_t count);
  /// fn(begin, end) over [0, n) on the pool (inline when there is none).
  void parallel(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);

  std::shared_ptr<const model::Model> model_;
  const model::Hparams& hp_;
  experts::ExpertSource* experts_;  // non-owning; null for dense models
  ThreadPool* pool_;                // non-owning; may be null
  std::atomic<bool> time_phases_{false};
  bool timing_ = false;  ///< time_phases_ as the current step began
  PhaseClock::time_point phase_last_;
  std::array<std::atomic<uint64_t>, kStepPhases> phase_ns_{};
  std::atomic<uint64_t> phase_steps_{0};
  int64_t max_batch_;
  RopeParams rope_;
  RopeParams rope_swa_;  // the sliding-window layers' (rope_freq_base_swa; = rope_ when they share it)
  bool prefetch_ = true;

  // Scratch, max_batch_ rows each (widths in the comments).
  std::vector<float> x_;        // residual stream (n_embd)
  std::vector<float> xn_;       // normed input of a sub-block (n_embd)
  std::vector<float> q_;        // (n_head * head_dim_k)
  std::vector<float> k_;        // (n_head_kv * head_dim_k)
  std::vector<float> v_;        // (n_head_kv * head_dim_v)
  std::vector<float> attn_;     // attention output (n_head * head_dim_v)
  std::vector<float> proj_;     // a projection back to n_embd (n_embd)
  std::vector<float> gate_;     // (max(n_ff, n_ff_exp))
  std::vector<float> up_;       // (max(n_ff, n_ff_exp))
  std::vector<float> rope_cache_;  // (n_rot) per row
  std::vector<float> rope_cache_swa_;  // (n_rot) per row, with rope_swa_; only when rope_freq_base_swa is set
  // MoE scratch
  std::vector<float> router_;      // router logits (n_expert) per row
  std::vector<float> probs_;       // (n_expert) per row
  std::vector<int32_t> sel_ids_;   // (n_expert_used) per row
  std::vector<float> sel_w_;       // (n_expert_used) per row
  std::vector<float> slot_out_;    // weighted expert outputs (n_expert_used x n_embd) per row
  std::vector<float> xe_;          // gathered rows for one expert; the shared expert's output (n_embd)
  std::vector<float> shexp_gate_;  // the shared expert's gate logit (1) per row; shared_expert archs only
  // MLA scratch (deepseek2 only)
  RopeParams rope_mla_;         // rope_ over one contiguous rope part (head_dim = n_rot)
  std::vector<float> mla_qa_;   // (q_lora_rank) per row: the compressed query
  std::vector<float> mla_kv_;   // (kv_lora_rank + n_rot) per row: the latent and the rope key
  std::vector<float> mla_q_;    // (n_head * (kv_lora_rank + n_rot)) per row: the absorbed queries
  std::vector<float> mla_lat_;  // (n_head * kv_lora_rank) per row: the attention output in the latent
  std::vector<float> mla_sel_;  // (n_expert): the router's selection values
  std::vector<tensor::MatvecTask> mla_tasks_;  // per-head products of a step
  std::vector<int32_t> group_rows_;   // (token * n_expert_used + slot) per assignment, grouped by expert
  std::vector<int32_t> group_start_;  // (n_expert + 1) offsets into group_rows_
  std::vector<int32_t> cursor_;       // (n_expert) fill positions while grouping
  std::vector<int32_t> active_;       // experts with at least one row, in id order
  std::vector<experts::ExpertLease> leases_;  // decode: the token's K experts in slot order; batch: one wave
  std::vector<uint8_t> guessed_;              // (n_expert) prefetch: expert already in guess_
  std::vector<int32_t> guess_;                // (<= n_expert) prefetch: the guessed experts of one layer
  std::vector<tensor::MatmulTask> expert_tasks_;  // a batched step's fused expert products
  std::vector<tensor::MatvecTask> tasks_;     // (2 * n_expert_used) decode: one fused group of products
  // Per row of a step (max_batch_ each): its token, cache and position, and its repacked product order.
  std::vector<int32_t> row_token_;
  std::vector<KvCache*> row_kv_;
  std::vector<int64_t> row_pos_;
  std::vector<uint8_t> gemm_;
  std::vector<int32_t> keep_;      // rows carried through the last layer (those that give logits)
  std::vector<uint8_t> keep_gemm_;  // their orders there (a chunk's lone last row: gemv)
  std::vector<uint8_t> panel_;      // per row: the IQ panel order (SeqChunk::panel_end)
  std::vector<uint8_t> keep_panel_;  // the kept rows' (a chunk's lone last row: the dot order)
  std::vector<uint8_t> sgemm_;       // per row: the sgemm order (SeqChunk::sgemm_end)
  std::vector<uint8_t> keep_sgemm_;  // the kept rows' (a chunk's lone last row: the dot order)
  /// Does row 0 of a one-row step take the plain matvec order (no gemm, no panel)? The one-row paths that
  /// fuse matvec products are taken only then.
  bool plain_one() const { return gemm_[0] == 0 && panel_[0] == 0; }
};

}  // namespace car::engine
