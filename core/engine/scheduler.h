// Scheduler: one per loaded model. It owns the model's sequence slots (a KV cache each, with the ids it
// holds for prefix reuse) and a thread that advances every running sequence together (continuous
// batching): each step is one ForwardPass::eval_step over a token of every decoding sequence plus prompt
// chunks of those still reading their prompt, within a per-step token budget; then each sequence samples
// its next token with its own sampler and streams it.
//
//   submit() --> queue (FIFO) --> a free slot (the one whose cached ids share the longest prefix with the
//   prompt; those positions are not recomputed) and room in the KV pool --> steps --> on_done, the slot
//   keeps its cache for reuse
//
// KV memory comes from one pool per model, counted in positions (SchedulerOptions::pool_tokens): a running
// request holds the positions it can reach (prompt + max_tokens, at most the context), an idle slot the
// prefix it keeps for reuse. A request starts only when its slot and those positions are free; when they
// are not, the least recently used idle slots' prefixes are dropped (their pages given back) if that makes
// room, else the request waits at the head of the queue (a later, smaller request does not overtake it).
// A request that needs more than the whole pool is refused at once (context_overflow). Each slot's cache
// maps a whole context but holds only the pages of the rows written (KvCache), so the memory resident is
// bounded by the pool, not by slots x context.
//
// A request waits in the queue, not on a thread: submit() returns at once and the callbacks run on the
// scheduler's thread. Output does not depend on company: eval_step computes each row as its sequence alone
// would, a prompt row's product order depends only on its position in the prompt (not on the chunking or a
// reused prefix), and sampling is per sequence, so a request's tokens and logprobs are bit-identical alone
// and batched with any others, whatever its slot held before.
//
// Thread safety: submit() and stats() may be called from any thread. The callbacks run on the scheduler's
// thread (on_done also on the submitting thread for a request refused before queueing) and must not
// block: they hold up every sequence of the model.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/engine/compute_gate.h"
#include "core/engine/forward.h"
#include "core/engine/generate_request.h"
#include "core/util/result.h"
#include "core/util/thread_annotations.h"

namespace car::gguf {
class GgufFile;
}
namespace car::tokenizer {
class Tokenizer;
}

namespace car::engine {

struct SchedulerOptions {
  int slots = 1;            ///< sequences run at once (each a KV cache mapping n_ctx positions)
  int64_t n_ctx = 0;        ///< tokens per slot
  /// KV positions over all slots (running requests' reservations + idle slots' kept prefixes); 0 or more
  /// than slots x n_ctx = slots x n_ctx.
  int64_t pool_tokens = 0;
  int64_t step_tokens = 0;  ///< rows per step (decode tokens + prompt chunks); 0 = the forward pass's max_batch
  int max_queued = 0;       ///< requests waiting for a slot beyond which submit() refuses with busy; 0 = no limit
  /// The compute threads' turns shared with the process's other models (each step's forward pass holds
  /// it); null = this model computes whenever it likes.
  std::shared_ptr<ComputeGate> gate;
};

/// What a request's caller hears. on_token may be empty.
struct GenerateCallbacks {
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(Result<GenerateResult>)> on_done;  ///< called exactly once
};

/// A model's load right now (Scheduler::stats).
struct SchedulerStats {
  int slots = 0;
  int active = 0;               ///< sequences in a slot (reading their prompt or generating)
  int queued = 0;               ///< requests waiting for a slot
  /// KV pool positions taken: running requests' reservations (prompt + max_tokens) and idle slots' kept
  /// prefixes.
  int64_t kv_tokens_used = 0;
  int64_t kv_tokens_capacity = 0;  ///< the KV pool, positions
  /// Bytes of the pages the slots' KV caches hold now (the rows written, page by page; at most the pool's
  /// bytes plus a page per region boundary per slot).
  uint64_t kv_bytes_resident = 0;
  uint64_t steps = 0;           ///< steps run since load
  uint64_t tokens_generated = 0;
  uint64_t batched_rows = 0;    ///< rows evaluated over all steps (prompt + decode)
  /// Tokens generated per second over the last kRateWindow (up to now; 0 when idle that long).
  double tokens_per_s = 0;
};

class Scheduler {
 public:
  static constexpr std::chrono::seconds kRateWindow{10};

  /// Maps every slot's KV cache (address space only: no page is touched). Errors: internal (a mapping
  /// was refused).
  static Result<std::unique_ptr<Scheduler>> create(std::shared_ptr<const model::Model> model,
                                                   std::shared_ptr<const tokenizer::Tokenizer> tok,
                                                   std::shared_ptr<const gguf::GgufFile> file,
                                                   std::unique_ptr<ForwardPass> forward,
                                                   const SchedulerOptions& options);
  /// Stops the thread; requests still queued or running end with `cancelled`.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Queue a request (see engine::generate for its checks and errors; a refused request's on_done runs
  /// before submit returns). `cancelled` (may be null) must outlive the request (until on_done); a
  /// cancelled request leaves at the next step (or the queue) with finish_reason "cancelled".
  void submit(const GenerateRequest& request, GenerateCallbacks callbacks, const std::atomic<bool>* cancelled);

  SchedulerStats stats() const;
  int64_t n_ctx() const { return options_.n_ctx; }
  int slots() const { return options_.slots; }
  int64_t pool_tokens() const { return options_.pool_tokens; }
  /// Bytes of the KV pool (pool_tokens x bytes per position: what the model is charged for KV), and of
  /// the logits rows.
  uint64_t kv_bytes() const;
  uint64_t logits_bytes() const;
  /// Bytes of the slots' KV mappings the kernel reports resident (mincore): SchedulerStats'
  /// kv_bytes_resident as the kernel sees it, for tests and diagnostics (a system call per slot).
  uint64_t kv_bytes_mapped_resident() const;
  const ForwardPass& forward() const { return *forward_; }
  /// ForwardPass::set_phase_timing / phase_times of the model's forward pass; from any thread.
  void set_phase_timing(bool on) { forward_->set_phase_timing(on); }
  StepPhaseTimes phase_times() const { return forward_->phase_times(); }

 private:
  struct Job;
  struct Slot {
    std::unique_ptr<KvCache> kv;
    std::vector<int32_t> cached;  // the ids whose K/V are in kv
    Job* job = nullptr;
    uint64_t last_used = 0;
    int64_t charge = 0;          // pool positions: the job's reservation, or cached.size() when idle
    uint64_t resident = 0;       // kv->resident_bytes() as of the last change
  };

  Scheduler(std::shared_ptr<const model::Model> model, std::shared_ptr<const tokenizer::Tokenizer> tok,
            std::shared_ptr<const gguf::GgufFile> file, std::unique_ptr<ForwardPass> forward,
            const SchedulerOptions& options, std::vector<std::unique_ptr<KvCache>> caches);
  void run();
  /// Keep the first `keep` positions of an idle slot (or of one being admitted): its cache gives back the
  /// pages past row `retain` (>= keep; a request being admitted keeps the pages its reservation will write,
  /// instead of faulting them in again), and the pool charges it `keep`.
  void keep_prefix(Slot& s, int64_t keep, int64_t retain) CAR_REQUIRES(mu_);
  void keep_prefix(Slot& s, int64_t keep) CAR_REQUIRES(mu_) { keep_prefix(s, keep, keep); }
  /// Take queued requests into free slots (and drop cancelled queued ones into `finished`).
  void admit(std::vector<std::unique_ptr<Job>>& finished) CAR_REQUIRES(mu_);
  /// One step over the running jobs; finished jobs move to `finished`.
  void step(std::vector<std::unique_ptr<Job>>& finished);
  void finish(Job& job);
  void fail_all_running(const Error& e, std::vector<std::unique_ptr<Job>>& finished);

  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::shared_ptr<const gguf::GgufFile> file_;
  std::unique_ptr<ForwardPass> forward_;
  SchedulerOptions options_;
  std::vector<float> logits_;  // slots x n_vocab: one output row per sequence per step
  std::unique_ptr<ComputeGate::Member> gate_member_;  // null without a gate; declared after options_ (its gate)

  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool stop_ CAR_GUARDED_BY(mu_) = false;
  std::deque<std::unique_ptr<Job>> queue_ CAR_GUARDED_BY(mu_);
  // Slots and running jobs: changed by the scheduler thread only, under mu_ (so stats() can read them).
  std::vector<Slot> slots_ CAR_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Job>> running_ CAR_GUARDED_BY(mu_);  // in admission order
  uint64_t clock_ CAR_GUARDED_BY(mu_) = 0;
  int64_t pool_used_ CAR_GUARDED_BY(mu_) = 0;  // sum of the slots' charges
  uint64_t steps_ CAR_GUARDED_BY(mu_) = 0;
  uint64_t tokens_generated_ CAR_GUARDED_BY(mu_) = 0;
  uint64_t batched_rows_ CAR_GUARDED_BY(mu_) = 0;
  // (step end, tokens sampled in it) over the last kRateWindow, for SchedulerStats::tokens_per_s.
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> recent_ CAR_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace car::engine
