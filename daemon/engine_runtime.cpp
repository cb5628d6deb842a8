// The ModelRuntime backed by car::engine. An `infer` with `messages` is rendered here, with the loaded
// model's own chat template and special tokens (core/chat/model_chat.h).
//
// One ExpertPool per runtime (so per daemon): every model whose experts are streamed joins it and shares
// its budget (CAR_INFERENCE_EXPERT_RAM_GB, else the memory limits) and its reader threads. Each backend
// saves its expert usage sidecar when asked (shutdown, the periodic save) and when it is destroyed
// (eviction, invalidate), if it served a request since its last save.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "core/chat/model_chat.h"
#include "core/engine/engine.h"
#include "core/engine/expert_stats_json.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/error_codes.h"
#include "core/util/thread_annotations.h"
#include "daemon/model_runtime.h"

namespace car::daemon {

namespace {

/// The longest a request's chat template may render. Real templates take milliseconds even on long
/// conversations; the 50 M step limit alone would let a hostile one hold a worker for many seconds.
constexpr std::chrono::milliseconds kChatRenderTimeLimit{5000};

/// A chat rendering error as the client sees it: what went wrong and where (the template's own text for
/// raise_exception, the construct and position for a template error).
std::string chat_error_message(const Error& e, const std::string& no_template_hint) {
  if (e.code == errc::kRaiseException) return "the chat template rejected the conversation: " + e.message;
  if (e.code == errc::kNoChatTemplate) return e.message + (no_template_hint.empty() ? "" : ": " + no_template_hint);
  if (e.code == errc::kBadMessages) return "messages: " + e.message;
  return "chat template: " + e.message;
}

class EngineBackend final : public Backend {
 public:
  EngineBackend(std::shared_ptr<engine::LoadedModel> model, std::string name)
      : model_(std::move(model)), name_(std::move(name)) {}
  ~EngineBackend() override {
    try {
      save_state();
    } catch (const std::exception& e) {
      spdlog::warn("model {}: saving expert usage failed: {}", name_, e.what());
    }
  }
  EngineBackend(const EngineBackend&) = delete;
  EngineBackend& operator=(const EngineBackend&) = delete;

  Result<GenerateOutput> generate(const GenerateParams& params, const TokenSink& on_token,
                                  const std::atomic<bool>& cancelled) override {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Result<GenerateOutput>> out;
    generate_async(params, on_token, cancelled, [&](Result<GenerateOutput> r) {
      std::lock_guard<std::mutex> lock(mu);
      out.emplace(std::move(r));
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return out.has_value(); });
    return std::move(*out);
  }

  bool concurrent() const override { return true; }

  void generate_async(const GenerateParams& params, TokenSink on_token, const std::atomic<bool>& cancelled,
                      GenerateDone done) override {
    // The request as parse_infer produced it; only a conversation still needs rendering into the prompt.
    engine::GenerateRequest req = params.generate;
    std::string template_source;
    const bool use_raw = params.messages && params.raw_without_template && !params.chat_template &&
                         !chat::model_chat_template(engine::model_file(*model_));
    if (params.messages && !use_raw) {
      // The conversation in the model's own prompt format, its special-token text parsed, and no second
      // BOS when the template wrote one.
      chat::RenderOptions render;
      render.cancelled = &cancelled;
      render.limits.max_duration = kChatRenderTimeLimit;
      auto chat = chat::render_model_chat(engine::model_file(*model_), engine::model_tokenizer(*model_),
                                          nlohmann::ordered_json(*params.messages), params.chat_template,
                                          params.add_generation_prompt, render);
      // A render stopped by `cancel` or a disconnect is answered as a request cancelled before its
      // generation began; anything else the template or the conversation did wrong is the client's.
      if (!chat && chat.error().code == errc::kCancelled) {
        return done(make_error(errc::kCancelled, "request cancelled while its chat template rendered"));
      }
      if (!chat) return done(make_error(errc::kBadRequest, chat_error_message(chat.error(), params.no_template_hint)));
      req.prompt = std::move(chat->text);
      req.parse_special = true;
      req.add_bos = !chat->starts_with_bos;
      template_source = std::move(chat->template_source);
    }
    const bool want_logprobs = req.logprobs || req.top_logprobs > 0;
    engine::GenerateCallbacks cb;
    if (on_token) {
      cb.on_token = [this, want_logprobs, on_token = std::move(on_token)](const engine::TokenEvent& ev) {
        protocol::TokenEvent out{ev.token, ev.text, std::nullopt};
        if (want_logprobs && ev.token >= 0) {
          out.logprobs = logprob_entry(ev.token, ev.logprob, ev.top_logprobs);
        }
        on_token(out);
      };
    }
    cb.on_done = [this, want_logprobs, template_source = std::move(template_source),
                  done = std::move(done)](Result<engine::GenerateResult> res) mutable {
      if (!res) {
        if (res.error().code == errc::kIoError) spdlog::error("model {}: {}", name_, res.error().message);
        return done(res.error());
      }
      GenerateOutput out;
      out.text = std::move(res->text);
      out.tokens = std::move(res->tokens);
      out.finish_reason = std::move(res->finish_reason);
      out.chat_template = std::move(template_source);
      out.prompt_tokens = static_cast<int>(res->prompt_tokens.size());
      out.cached_tokens = static_cast<int>(res->cached_tokens);
      out.queue_ms = res->queue_ms;
      out.ttft_ms = res->ttft_ms;
      out.prompt_ms = res->prompt_ms;
      out.decode_ms = res->decode_ms;
      out.itl_ms = std::move(res->itl_ms);
      if (want_logprobs) {
        out.logprobs.reserve(out.tokens.size());
        for (size_t i = 0; i < out.tokens.size(); ++i) {
          static const std::vector<engine::TopLogprob> kNone;
          out.logprobs.push_back(logprob_entry(out.tokens[i], i < res->logprobs.size() ? res->logprobs[i] : 0,
                                               i < res->top_logprobs.size() ? res->top_logprobs[i] : kNone));
        }
      }
      done(std::move(out));
    };
    if (engine::model_streams_experts(*model_)) dirty_.store(true, std::memory_order_relaxed);
    engine::submit(*model_, req, std::move(cb), &cancelled);
  }

  std::optional<engine::SchedulerStats> scheduler_stats() const override {
    return engine::model_scheduler_stats(*model_);
  }

  /// A token's logprob entry, its text and its alternatives' texts from the model's vocabulary.
  protocol::TokenLogprobs logprob_entry(int32_t token, double logprob,
                                        const std::vector<engine::TopLogprob>& top) const {
    const tokenizer::Tokenizer& tok = engine::model_tokenizer(*model_);
    protocol::TokenLogprobs e;
    e.token = token;
    e.text = tok.token_to_piece(token, true);
    e.logprob = logprob;
    e.top_logprobs.reserve(top.size());
    for (const auto& t : top) {
      e.top_logprobs.push_back({t.token, tok.token_to_piece(t.token, true), t.logprob});
    }
    return e;
  }

  uint64_t memory_bytes() const override { return engine::model_memory_bytes(*model_); }
  bool streams_experts() const override { return engine::model_streams_experts(*model_); }
  int64_t context_length() const override { return engine::model_context_length(*model_); }

  void save_state() override {
    // Only a streamed model has a sidecar, and only requests change its counts.
    if (!dirty_.exchange(false, std::memory_order_relaxed)) return;
    auto saved = engine::model_save_state(*model_);
    if (!saved) {
      dirty_.store(true, std::memory_order_relaxed);
      spdlog::warn("model {}: saving expert usage failed: {}", name_, saved.error().message);
    } else {
      spdlog::debug("model {}: expert usage saved", name_);
    }
    for (const auto& w : engine::model_take_warnings(*model_)) spdlog::warn("model {}: {}", name_, w);
  }

  nlohmann::json expert_stats() const override {
    auto s = engine::model_expert_stats(*model_);
    if (!s) return nullptr;
    return engine::expert_stats_json(*s);
  }
  Result<void> check_file(const std::filesystem::path& path) const override {
    return engine::model_check_file(*model_, path.string());
  }

 private:
  std::shared_ptr<engine::LoadedModel> model_;
  std::string name_;
  std::atomic<bool> dirty_{false};  // served a request on streamed experts since the last save
};

class EngineRuntime final : public ModelRuntime {
 public:
  /// Every model this runtime loads takes its compute turns at one gate (fair sharing of the cores
  /// between models busy at once), unless the options bring one.
  explicit EngineRuntime(const RuntimeOptions& options) : options_(options) {
    if (!options_.compute_gate) options_.compute_gate = std::make_shared<engine::ComputeGate>();
  }

  Result<std::shared_ptr<Backend>> load(const std::filesystem::path& path) override {
    return load_with(path, {});
  }

  Result<std::shared_ptr<Backend>> load_with(const std::filesystem::path& path,
                                             const LoadRequest& request) override {
    auto model = engine::load_model(path.string(), options_for(request));
    if (!model) {
      const auto& e = model.error();
      // The engine's own codes (gguf_truncated, ...) are details; the wire codes are load_failed, io_error.
      if (e.code == errc::kNotFound || e.code == errc::kIoError) return e;
      return make_error(errc::kLoadFailed, e.message.empty() ? e.code : e.code + ": " + e.message);
    }
    const std::string name = path.stem().string();
    const std::string& reason = engine::model_stream_reason(**model);
    if (!reason.empty()) {
      spdlog::info("model {}: experts {} ({})", name,
                   engine::model_streams_experts(**model) ? "streamed" : "resident", reason);
    }
    for (const auto& w : engine::model_take_warnings(**model)) spdlog::warn("model {}: {}", name, w);
    const engine::SchedulerStats seq = engine::model_scheduler_stats(**model);
    spdlog::info("model {}: context {} tokens; KV pool {} positions ({} MiB) shared by {} sequences", name,
                 engine::model_context_length(**model), seq.kv_tokens_capacity,
                 engine::model_memory(**model).kv_cache >> 20, seq.slots);
    return std::shared_ptr<Backend>(std::make_shared<EngineBackend>(std::move(*model), name));
  }
  Result<uint64_t> estimate_bytes(const std::filesystem::path& path, const LoadRequest& request) override {
    auto m = engine::estimate_memory(path.string(), options_for(request));
    if (!m) {
      const auto& e = m.error();
      if (e.code == errc::kNotFound) return e;
      return make_error(errc::kLoadFailed, e.message.empty() ? e.code : e.code + ": " + e.message);
    }
    return m->charged();
  }
  void share_room(std::function<std::optional<uint64_t>()> room) override {
    std::shared_ptr<experts::ExpertPool> pool;
    {
      MutexLock lock(pool_mutex_);
      room_ = room;
      pool = pool_;
    }
    if (pool) pool->set_room(std::move(room));
  }
  void room_changed() override {
    std::shared_ptr<experts::ExpertPool> pool;
    {
      MutexLock lock(pool_mutex_);
      pool = pool_;
    }
    if (pool) pool->refresh();  // shrinks (giving slots back) or grows the streamed models' caches
  }
  bool available() const override { return true; }
  std::string name() const override { return "engine"; }

 private:
  /// The settings with the request's choices applied, and the daemon's pool when the model may stream.
  engine::LoadOptions options_for(const LoadRequest& request) {
    engine::LoadOptions options = options_;
    if (request.stream_experts) options.stream_experts = *request.stream_experts;
    if (options.stream_experts != StreamExperts::off) options.expert_pool = pool();
    return options;
  }
  /// The daemon's one expert pool, made by the first load that may stream (its reader threads are not
  /// started for a daemon that never streams).
  std::shared_ptr<experts::ExpertPool> pool() {
    MutexLock lock(pool_mutex_);
    if (!pool_) {
      experts::StreamOptions so;
      so.ram_gb = options_.expert_ram_gb;
      pool_ = std::make_shared<experts::ExpertPool>(so);
      if (room_) pool_->set_room(room_);
    }
    return pool_;
  }

  engine::LoadOptions options_;
  Mutex pool_mutex_;
  std::shared_ptr<experts::ExpertPool> pool_ CAR_GUARDED_BY(pool_mutex_);
  std::function<std::optional<uint64_t>()> room_ CAR_GUARDED_BY(pool_mutex_);  // share_room
};

}  // namespace

std::unique_ptr<ModelRuntime> make_default_runtime(const RuntimeOptions& options) {
  return std::make_unique<EngineRuntime>(options);
}

}  // namespace car::daemon
