#include "core/engine/scheduler.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/engine/engine.h"
#include "core/engine/sampler.h"
#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/error_codes.h"
#include "core/util/limits.h"
#include "core/util/thread_signals.h"

namespace car::engine {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

/// One request from submit() to on_done. Touched by the scheduler thread only once queued.
struct Scheduler::Job {
  GenerateRequest req;
  GenerateCallbacks cb;
  const std::atomic<bool>* cancelled = nullptr;
  GenerateResult res;
  Result<void> error;  // set when the job failed (res is then not reported)
  int64_t n_prompt = 0;
  int64_t need = 0;          // KV positions it can reach: prompt + max_tokens, at most the context
  Slot* slot = nullptr;
  int64_t evaluated = 0;     // prompt positions in the slot's cache (reused or computed)
  bool decoding = false;     // the prompt is done; `next` is the token to evaluate
  int32_t next = -1;
  int generated = 0;         // tokens sampled
  bool done = false;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StopMatcher> stops;
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  std::vector<int32_t> history;
  Clock::time_point t_submit, t_first_step, t_prompt_done, t_last_token;
  bool started = false;
  std::vector<int32_t> chunk;  // this step's tokens
  SeqChunk::Output output = SeqChunk::Output::none;
};

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::shared_ptr<const model::Model> model,
                                                     std::shared_ptr<const tokenizer::Tokenizer> tok,
                                                     std::shared_ptr<const gguf::GgufFile> file,
                                                     std::unique_ptr<ForwardPass> forward,
                                                     const SchedulerOptions& options) {
  CAR_CHECK(options.slots >= 1 && options.n_ctx >= 1);
  // Every slot maps a whole context up front: address space only (nothing is written, so no page is
  // resident), and a refusal is the load's error rather than a request's.
  // The forward pass sizes them: the geometry is the model's (deepseek2's MLA caches one latent head).
  CAR_CHECK(forward != nullptr);
  std::vector<std::unique_ptr<KvCache>> caches;
  for (int i = 0; i < options.slots; ++i) {
    auto kv = forward->create_cache(options.n_ctx);
    if (!kv.ok()) {
      return make_error(kv.error().code, kv.error().message + " (sequence " + std::to_string(i + 1) + " of " +
                                             std::to_string(options.slots) + ")");
    }
    caches.push_back(std::make_unique<KvCache>(std::move(*kv)));
  }
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(model), std::move(tok), std::move(file),
                                                  std::move(forward), options, std::move(caches)));
}

Scheduler::Scheduler(std::shared_ptr<const model::Model> model, std::shared_ptr<const tokenizer::Tokenizer> tok,
                     std::shared_ptr<const gguf::GgufFile> file, std::unique_ptr<ForwardPass> forward,
                     const SchedulerOptions& options, std::vector<std::unique_ptr<KvCache>> caches)
    : model_(std::move(model)), tok_(std::move(tok)), file_(std::move(file)), forward_(std::move(forward)),
      options_(options) {
  CAR_CHECK(options_.slots >= 1 && options_.n_ctx >= 1);
  CAR_CHECK(caches.size() == static_cast<size_t>(options_.slots));
  const int64_t full = static_cast<int64_t>(options_.slots) * options_.n_ctx;
  if (options_.pool_tokens <= 0 || options_.pool_tokens > full) options_.pool_tokens = full;
  if (options_.step_tokens <= 0 || options_.step_tokens > forward_->max_batch()) {
    options_.step_tokens = forward_->max_batch();
  }
  // Every running sequence needs a row of its own in a step.
  CAR_CHECK(options_.step_tokens >= options_.slots);
  if (options_.gate != nullptr) gate_member_ = std::make_unique<ComputeGate::Member>(*options_.gate);
  logits_.resize(static_cast<size_t>(options_.slots) * static_cast<size_t>(model_->hparams().n_vocab));
  {
    MutexLock lock(mu_);
    slots_.resize(static_cast<size_t>(options_.slots));
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].kv = std::move(caches[i]);
  }
  thread_ = std::thread([this] {
    util::block_process_signals();
    run();
  });
}

Scheduler::~Scheduler() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Scheduler::kv_bytes() const {
  return static_cast<uint64_t>(options_.pool_tokens) * ForwardPass::kv_cache_bytes_for(model_->hparams(), 1);
}

void Scheduler::keep_prefix(Slot& s, int64_t keep, int64_t retain) {
  s.kv->shrink(keep, retain);
  s.cached.resize(static_cast<size_t>(keep));
  pool_used_ += keep - s.charge;
  s.charge = keep;
  s.resident = s.kv->resident_bytes();
}

uint64_t Scheduler::kv_bytes_mapped_resident() const {
  MutexLock lock(mu_);
  uint64_t total = 0;
  for (const Slot& s : slots_) total += s.kv->mapping().resident_bytes();
  return total;
}

uint64_t Scheduler::logits_bytes() const { return logits_.size() * sizeof(float); }

SchedulerStats Scheduler::stats() const {
  MutexLock lock(mu_);
  SchedulerStats s;
  s.slots = options_.slots;
  s.active = static_cast<int>(running_.size());
  s.queued = static_cast<int>(queue_.size());
  s.kv_tokens_used = pool_used_;
  s.kv_tokens_capacity = options_.pool_tokens;
  for (const Slot& slot : slots_) s.kv_bytes_resident += slot.resident;
  s.steps = steps_;
  s.tokens_generated = tokens_generated_;
  s.batched_rows = batched_rows_;
  const auto now = Clock::now();
  uint64_t recent = 0;
  for (const auto& [t, n] : recent_) {
    if (now - t <= kRateWindow) recent += n;
  }
  s.tokens_per_s = static_cast<double>(recent) / std::chrono::duration<double>(kRateWindow).count();
  return s;
}

void Scheduler::submit(const GenerateRequest& req, GenerateCallbacks cb, const std::atomic<bool>* cancelled) {
  auto job = std::make_unique<Job>();
  job->t_submit = Clock::now();
  auto refuse = [&](const char* code, const std::string& message) { cb.on_done(make_error(code, message)); };
  const int64_t n_vocab = model_->hparams().n_vocab;
  if (req.max_tokens < 0) return refuse(errc::kBadRequest, "max_tokens must be >= 0");
  if (req.top_logprobs < 0) return refuse(errc::kBadRequest, "top_logprobs must be >= 0");
  GenerateResult& res = job->res;
  res.prompt_tokens = !req.prompt_ids.empty() ? req.prompt_ids : tok_->encode(req.prompt, req.add_bos, req.parse_special);
  if (res.prompt_tokens.empty()) return refuse(errc::kBadRequest, "the prompt is empty (no tokens)");
  for (int32_t id : res.prompt_tokens) {
    if (id < 0 || id >= n_vocab) {
      return refuse(errc::kBadRequest, "prompt token id " + std::to_string(id) + " outside [0, " +
                                           std::to_string(n_vocab) + ")");
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(res.prompt_tokens.size());
  const int64_t loaded_ctx = options_.n_ctx;
  if (req.num_ctx < 0) return refuse(errc::kBadRequest, "num_ctx must be >= 0");
  if (req.num_ctx > loaded_ctx) {
    return refuse(errc::kBadRequest, "num_ctx " + std::to_string(req.num_ctx) +
                                         " exceeds the context the model is loaded with (" +
                                         std::to_string(loaded_ctx) + " tokens)");
  }
  const int64_t n_ctx = req.num_ctx > 0 ? req.num_ctx : loaded_ctx;
  job->req = req;
  if (req.max_tokens_to_context) {
    // Until the context is full (Ollama's num_predict -1) - or the KV pool, where a set pool is smaller -
    // within the longest generation car allows. A prompt that fills it is refused below.
    const int64_t room = std::min(n_ctx, options_.pool_tokens);
    if (n_prompt < room) {
      job->req.max_tokens = static_cast<int>(std::min<int64_t>(room - n_prompt, limits::kMaxGenerateTokens));
    }
    job->req.max_tokens_to_context = false;
  }
  if (n_prompt + job->req.max_tokens > n_ctx) {
    return refuse(errc::kContextOverflow, "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                                              std::to_string(job->req.max_tokens) + ") exceeds the context of " +
                                              std::to_string(n_ctx) + " tokens");
  }
  job->need = std::min<int64_t>(loaded_ctx, n_prompt + job->req.max_tokens);
  if (job->need > options_.pool_tokens) {
    return refuse(errc::kContextOverflow,
                  "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                      std::to_string(job->req.max_tokens) + ") needs " + std::to_string(job->need) +
                      " KV positions, more than the model's whole KV pool (" +
                      std::to_string(options_.pool_tokens) + " positions over its " +
                      std::to_string(options_.slots) + " sequences)");
  }
  job->cb = std::move(cb);
  job->cancelled = cancelled;
  job->n_prompt = n_prompt;
  {
    MutexLock lock(mu_);
    const int waiting = static_cast<int>(queue_.size());
    if (options_.max_queued > 0 && waiting >= options_.max_queued) {
      lock.unlock();
      job->cb.on_done(make_error(errc::kBusy, "the model's queue is full (" + std::to_string(waiting) +
                                                  " requests waiting for its " + std::to_string(options_.slots) +
                                                  " sequences); retry later"));
      return;
    }
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void Scheduler::admit(std::vector<std::unique_ptr<Job>>& finished) {
  // A cancelled request leaves the queue at once, wherever it stands.
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = **it;
    if (job.cancelled != nullptr && job.cancelled->load()) {
      job.res.finish_reason = "cancelled";
      job.done = true;
      finished.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  while (!queue_.empty()) {
    // The free slot whose cached ids share the longest prefix with the prompt; ties: least recently used.
    Job& job = *queue_.front();
    Slot* best = nullptr;
    int64_t best_common = -1;
    for (Slot& s : slots_) {
      if (s.job != nullptr) continue;
      int64_t common = 0;
      const int64_t max_common = std::min<int64_t>(static_cast<int64_t>(s.cached.size()), job.n_prompt - 1);
      while (common < max_common && s.cached[static_cast<size_t>(common)] == job.res.prompt_tokens[static_cast<size_t>(common)]) {
        ++common;
      }
      if (common > best_common || (common == best_common && s.last_used < best->last_used)) {
        best = &s;
        best_common = common;
      }
    }
    if (best == nullptr) return;  // every slot busy: the queue waits, first come first served
    const int64_t common = std::min(best_common, best->kv->n_past());
    // The pool: the slot's charge becomes the request's reservation (its reused prefix is part of it).
    int64_t over = pool_used_ - best->charge + job.need - options_.pool_tokens;
    if (over > 0) {
      // Room from the other idle slots' prefixes, least recently used first - only if that is enough;
      // otherwise the request waits (keeping every prefix) for running ones to end.
      std::vector<Slot*> idle;
      int64_t reclaimable = 0;
      for (Slot& s : slots_) {
        if (s.job == nullptr && &s != best && s.charge > 0) {
          idle.push_back(&s);
          reclaimable += s.charge;
        }
      }
      if (reclaimable < over) return;
      std::sort(idle.begin(), idle.end(), [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
      for (Slot* s : idle) {
        if (over <= 0) break;
        over -= s->charge;
        keep_prefix(*s, 0);
      }
    }
    // The pages of the rows this request will write stay (resident within its reservation): releasing them
    // only to fault them in again cost a page fault and a zeroed page per 4 KiB of KV.
    keep_prefix(*best, common, job.need);
    pool_used_ += job.need - best->charge;
    best->charge = job.need;
    best->job = &job;
    best->last_used = ++clock_;
    job.slot = best;
    job.evaluated = best->kv->n_past();
    job.res.cached_tokens = job.evaluated;
    running_.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

void Scheduler::run() {
  std::vector<std::unique_ptr<Job>> finished;
  for (;;) {
    {
      MutexLock lock(mu_);
      if (gate_member_ != nullptr && !stop_ && queue_.empty() && running_.empty()) {
        gate_member_->idle();  // keep no compute turns for a model with nothing to run
      }
      cv_.wait(lock, [this]() CAR_REQUIRES(mu_) { return stop_ || !queue_.empty() || !running_.empty(); });
      if (stop_) {
        for (auto& job : queue_) finished.push_back(std::move(job));
        queue_.clear();
        for (auto& job : running_) finished.push_back(std::move(job));
        running_.clear();
        for (Slot& s : slots_) s.job = nullptr;
      } else {
        admit(finished);
      }
    }
    bool stopping = false;
    {
      MutexLock lock(mu_);
      stopping = stop_;
    }
    if (stopping) {
      for (auto& job : finished) {
        if (!job->done && job->error.ok()) job->res.finish_reason = "cancelled";
        job->done = true;
        finish(*job);
      }
      return;
    }
    for (auto& job : finished) finish(*job);
    finished.clear();
    step(finished);
    for (auto& job : finished) finish(*job);
    finished.clear();
  }
}

void Scheduler::finish(Job& job) {
  if (!job.error.ok()) {
    job.cb.on_done(job.error.error());
    return;
  }
  // Text held back at the end: an incomplete UTF-8 tail (as U+FFFD) and a possible stop-string prefix.
  if (job.decoder != nullptr && !job.stops->stopped()) {
    std::string tail = job.stops->push(job.decoder->finish()).text;
    if (!job.stops->stopped()) tail += job.stops->flush();
    if (!tail.empty()) {
      job.res.text += tail;
      if (job.cb.on_token) {
        TokenEvent last;
        last.token = -1;
        last.text = tail;
        job.cb.on_token(last);
      }
    }
  }
  const auto now = Clock::now();
  if (job.started) {
    job.res.queue_ms = ms_between(job.t_submit, job.t_first_step);
    if (job.decoding) job.res.decode_ms = ms_between(job.t_prompt_done, now);
  } else {
    job.res.queue_ms = ms_between(job.t_submit, now);
  }
  job.cb.on_done(std::move(job.res));
}

void Scheduler::fail_all_running(const Error& e, std::vector<std::unique_ptr<Job>>& finished) {
  MutexLock lock(mu_);
  for (auto& job : running_) {
    Slot& s = *job->slot;
    keep_prefix(s, std::min(static_cast<int64_t>(s.cached.size()), s.kv->n_past()));
    s.job = nullptr;
    job->error = e;
    job->done = true;
    finished.push_back(std::move(job));
  }
  running_.clear();
}

void Scheduler::step(std::vector<std::unique_ptr<Job>>& finished) {
  // The running jobs, in admission order. Only this thread changes running_, so the pointers stay valid.
  std::vector<Job*> jobs;
  {
    MutexLock lock(mu_);
    for (auto& j : running_) jobs.push_back(j.get());
  }
  // Build the step: a decode row for every generating sequence first (each needs one row), then prompt
  // chunks in admission order within what is left of the budget.
  std::vector<SeqChunk> chunks;
  std::vector<Job*> in_step;
  int64_t budget = options_.step_tokens;
  for (Job* job : jobs) {
    if (job->cancelled != nullptr && job->cancelled->load()) {
      job->res.finish_reason = "cancelled";
      job->done = true;
      continue;
    }
    job->chunk.clear();
    if (!job->decoding) continue;
    job->chunk.push_back(job->next);
    job->output = SeqChunk::Output::last;
    --budget;
  }
  for (Job* job : jobs) {
    if (job->done || job->decoding || budget <= 0) continue;
    const int64_t rest = job->n_prompt - job->evaluated;
    const int64_t len = std::min(rest, budget);
    const auto begin = job->res.prompt_tokens.begin() + job->evaluated;
    job->chunk.assign(begin, begin + len);
    job->output = len == rest ? SeqChunk::Output::last : SeqChunk::Output::none;
    budget -= len;
  }
  for (Job* job : jobs) {
    if (job->done || job->chunk.empty()) continue;
    SeqChunk c;
    c.kv = job->slot->kv.get();
    c.tokens = job->chunk;
    c.output = job->output;
    // A prompt's whole groups of 4 from position 0 take the gemm order, wherever the chunks or a reused
    // prefix split it: a request's output depends neither on its company nor on its slot's history.
    c.gemm_end = job->decoding ? 0 : job->n_prompt - job->n_prompt % 4;
    // Likewise llama.cpp's IQ panel order: the prompt's rows as one batch of it would take it (iq_panel_end).
    c.panel_end = job->decoding ? 0 : iq_panel_end(0, job->n_prompt);
    // And the rows llama.cpp's mul_mat gives llamafile's sgemm (a batch of 2 or more rows, sgemm_end).
    c.sgemm_end = job->decoding ? 0 : sgemm_end(0, job->n_prompt);
    chunks.push_back(c);
    in_step.push_back(job);
  }

  if (!chunks.empty()) {
    Result<void> r = [&] {
      // The machine's compute threads are taken in turns with the process's other busy models (the gate
      // is held for the forward pass only); a request's first step starts once the turn is ours, so its
      // queue_ms includes a wait for another model's step.
      std::optional<ComputeGate::Turn> turn;
      if (gate_member_ != nullptr) turn.emplace(*gate_member_);
      const auto t_step = Clock::now();
      for (Job* job : in_step) {
        if (!job->started) {
          job->started = true;
          job->t_first_step = t_step;
        }
      }
      return forward_->eval_step(chunks, logits_.data());
    }();
    if (r.ok()) {
      // The weights under this step are those the model was loaded from (no read faulted, the file was not
      // rewritten in place); otherwise the logits came from zeros or a mix of two files.
      if (auto intact = file_->check_intact(); !intact) {
        {
          MutexLock lock(mu_);
          // Every prefix was computed from what may be other weights: none is kept, and the idle slots'
          // pages go back now (the running ones' when fail_all_running ends them).
          for (Slot& s : slots_) {
            if (s.job == nullptr) {
              keep_prefix(s, 0);
            } else {
              s.cached.clear();
            }
          }
        }
        static const std::string what =
            "model file changed or was truncated while in use (replace model files by atomic rename): ";
        fail_all_running(Error{errc::kIoError, what + intact.error().message}, finished);
        return;
      }
    } else {
      // No cache advanced: every sequence of the step fails (its slot keeps the prefix it had); the model
      // stays usable and the next step retries the read for the others.
      MutexLock lock(mu_);
      for (Job* job : in_step) {
        job->error = r.error();
        job->done = true;
        // Its rows may have been written in part: their pages are given back when the slot goes idle.
        job->slot->kv->touch(job->slot->kv->n_past() + static_cast<int64_t>(job->chunk.size()));
      }
    }
    if (r.ok()) {
      MutexLock lock(mu_);
      ++steps_;
      for (const SeqChunk& c : chunks) batched_rows_ += c.tokens.size();
      for (Job* job : in_step) {
        job->slot->cached.insert(job->slot->cached.end(), job->chunk.begin(), job->chunk.end());
        job->slot->resident = job->slot->kv->resident_bytes();
        if (!job->decoding) job->evaluated += static_cast<int64_t>(job->chunk.size());
      }
    }
  }

  // Sample: every sequence whose chunk gave logits (a prompt's end or a decoded token). A prompt fully
  // reused from the cache cannot happen: at least its last token is evaluated again for its logits.
  const size_t n_vocab = static_cast<size_t>(model_->hparams().n_vocab);
  size_t row = 0;
  uint64_t sampled = 0;
  for (Job* job : in_step) {
    if (job->done) continue;
    if (job->output == SeqChunk::Output::none) continue;
    const std::span<const float> logits(logits_.data() + row * n_vocab, n_vocab);
    ++row;
    GenerateRequest& req = job->req;
    GenerateResult& res = job->res;
    if (!job->decoding) {
      job->decoding = true;
      job->t_prompt_done = Clock::now();
      res.prompt_ms = ms_between(job->t_first_step, job->t_prompt_done);
      job->sampler = std::make_unique<Sampler>(req.sampling);
      job->stops = std::make_unique<StopMatcher>(req.stop);
      job->decoder = std::make_unique<tokenizer::StreamDecoder>(tok_);
      job->history = res.prompt_tokens;
      job->history.reserve(job->history.size() + static_cast<size_t>(req.max_tokens));
      res.finish_reason = "length";
    }
    if (job->generated >= req.max_tokens) {  // max_tokens 0
      job->done = true;
      continue;
    }
    if (job->cancelled != nullptr && job->cancelled->load()) {
      res.finish_reason = "cancelled";
      job->done = true;
      continue;
    }
    const int32_t id = job->sampler->sample(logits, job->history);
    if (!req.ignore_eos && tok_->is_eog(id)) {
      res.finish_reason = "eos";
      job->done = true;
      continue;
    }
    TokenEvent event;
    event.token = id;
    if (req.top_logprobs > 0) {
      res.top_logprobs.push_back(Sampler::top_logprobs(logits, req.top_logprobs));
      event.top_logprobs = res.top_logprobs.back();
    }
    if (req.logprobs || req.top_logprobs > 0) {
      event.logprob = Sampler::logprob_of(logits, id);
      res.logprobs.push_back(event.logprob);
    }
    const auto t_token = Clock::now();
    if (res.tokens.empty()) {
      res.ttft_ms = ms_between(job->t_submit, t_token);
    } else {
      res.itl_ms.push_back(static_cast<float>(ms_between(job->t_last_token, t_token)));
    }
    job->t_last_token = t_token;
    res.tokens.push_back(id);
    job->history.push_back(id);
    ++job->generated;
    ++sampled;
    const StopMatcher::Step st = job->stops->push(job->decoder->push(id));
    res.text += st.text;
    if (job->cb.on_token) {
      event.text = st.text;
      job->cb.on_token(event);
    }
    if (st.stopped) {
      res.finish_reason = "stop";
      job->done = true;
    } else if (job->generated >= req.max_tokens) {
      job->done = true;  // the last token is not evaluated: nothing follows it
    } else {
      job->next = id;
    }
  }

  MutexLock lock(mu_);
  tokens_generated_ += sampled;
  const auto end = Clock::now();
  if (sampled > 0) recent_.emplace_back(end, sampled);
  while (!recent_.empty() && end - recent_.front().first > kRateWindow) recent_.pop_front();
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->done) {
      Slot& s = *(*it)->slot;
      s.job = nullptr;
      s.last_used = ++clock_;
      keep_prefix(s, static_cast<int64_t>(s.cached.size()));  // the reservation's unused rest goes back
      finished.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace car::engine
