#include "daemon/service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "daemon/model_resolver.h"
#include "daemon/protocol.h"
#include "daemon/safe_text.h"

namespace car::daemon {

namespace asio = boost::asio;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
double ms_of(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// Map an engine/runtime error code onto the wire's codes; anything unknown is `internal`.
std::string wire_code(const std::string& code) {
  static const char* known[] = {"bad_request",      "not_found", "forbidden",     "load_failed",
                                "context_overflow", "cancelled", "shutting_down", "busy",
                                "io_error"};
  for (const char* k : known) {
    if (code == k) return code;
  }
  return protocol::code::kInternal;
}

std::optional<std::chrono::milliseconds> ttl_of(const LiveSettings& live) {
  if (live.idle_ttl.count() <= 0) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(live.idle_ttl);
}

// Client-supplied strings go into log lines only through these (safe_text.h): quoted and escaped.
std::string id_text(const json& id) { return log_id(id); }
std::string text(const std::string& s) { return s.empty() ? "-" : log_quote(s); }

}  // namespace

struct Service::Request {
  json id;
  std::string op;
  json body;
  std::string model;
  std::optional<ResolvedModel> resolved;
  protocol::InferParams infer;
  std::optional<std::string> stream_experts;  // the request's choice for a load it triggers
  Clock::time_point received = Clock::now();
};

Service::Service(asio::io_context& io, const ServerOptions& options, ModelRuntime& runtime)
    : io_(io),
      options_(options),
      runtime_(runtime),
      cache_(options.live.cache_budget_bytes, ttl_of(options.live)),
      pool_(std::max<std::size_t>(1, options.workers), std::max<std::size_t>(1, options.queue_capacity)),
      connections_(options.live, current_fd_limit()) {}

Service::~Service() { pool_.stop(); }

void Service::session_opened(const std::shared_ptr<Session>& session) {
  if (sessions_.insert(session).second) connections_.opened(session->peer().uid);
}

void Service::session_closed(const std::shared_ptr<Session>& session) {
  if (sessions_.erase(session) != 0) {
    connections_.closed(session->peer().uid);
    spdlog::debug("conn {}: closed", session->number());
  }
  if (sessions_.empty() && all_closed_) std::exchange(all_closed_, nullptr)();
}

void Service::handle_line(const std::shared_ptr<Session>& session, std::string_view line) {
  Request req;
  ++requests_;
  auto parsed = protocol::parse_request(line, &req.id);
  if (!parsed) {
    reply_now(session, req, protocol::error_line(req.id, parsed.error().code, parsed.error().message),
              parsed.error().code);
    return;
  }
  req.op = std::move(parsed->op);
  req.body = std::move(parsed->body);
  try {
    dispatch(session, req);
  } catch (const std::exception& e) {
    spdlog::error("conn {}: op {} threw: {}", session->number(), text(req.op), e.what());
    reply_now(session, req, protocol::error_line(req.id, protocol::code::kInternal, e.what()), "internal");
  }
}

void Service::reply_now(const std::shared_ptr<Session>& session, Request& req, const std::string& line,
                        const std::string& outcome) {
  session->send(line);
  spdlog::info("conn={} id={} op={} model={} outcome={} ms={:.2f}", session->number(), id_text(req.id),
               text(req.op), text(req.model), outcome, ms_since(req.received));
}

void Service::dispatch(const std::shared_ptr<Session>& session, Request& req) {
  auto fail = [&](const char* code, const std::string& message) {
    reply_now(session, req, protocol::error_line(req.id, code, message), code);
  };
  const std::string& op = req.op;
  static const char* ops[] = {"load", "infer", "stats", "invalidate", "list", "health", "cancel"};
  if (std::find_if(std::begin(ops), std::end(ops), [&](const char* o) { return op == o; }) == std::end(ops)) {
    return fail(protocol::code::kUnknownOp,
                "unknown op '" + op + "' (known: load, infer, stats, invalidate, list, health, cancel)");
  }
  if (shutting_down_) return fail(protocol::code::kShuttingDown, "car-inferenced is shutting down");
  // An id shared by two requests in flight would make their replies and `cancel` ambiguous.
  if (!req.id.is_null() && session->id_in_flight(req.id)) {
    return fail(protocol::code::kBadRequest,
                "id " + protocol::dump(req.id) +
                    " is already used by a request in flight on this connection; "
                    "ids must be unique among requests in flight (that request "
                    "carries on)");
  }

  if (op == "health") {
    json r = {{"status", "ok"},
              {"engine", runtime_.name()},
              {"uptime_s", std::chrono::duration<double>(Clock::now() - started_).count()},
              {"models_loaded", cache_.entries()},
              {"in_flight", in_flight_}};
    return reply_now(session, req, protocol::ok_line(req.id, r), "ok");
  }
  if (op == "stats") return reply_now(session, req, protocol::ok_line(req.id, stats_json()), "ok");
  if (op == "list") {
    std::string error;
    json r = list_json(error);
    if (!error.empty()) return fail(protocol::code::kInternal, error);
    return reply_now(session, req, protocol::ok_line(req.id, r), "ok");
  }
  if (op == "cancel") {
    auto t = req.body.find("target");
    if (t == req.body.end() || t->is_null() || t->is_object() || t->is_array()) {
      return fail(protocol::code::kBadRequest, "field 'target' (the id of a request in flight) is missing");
    }
    std::size_t n = session->cancel(*t);
    return reply_now(session, req, protocol::ok_line(req.id, {{"cancelled", n > 0}, {"target", *t}}),
                     n > 0 ? "ok" : "ok(no such request)");
  }

  // The ops that name a model.
  auto model = protocol::model_field(req.body);
  if (!model) return fail(protocol::code::kBadRequest, model.error().message);
  req.model = *model;
  if (op == "invalidate") {
    if (auto ok = check_model_id(req.model); !ok) return fail(protocol::code::kForbidden, ok.error().message);
    // The model saves its state (expert usage sidecar) and is freed on a worker, not on the io thread.
    auto handle = cache_.peek(req.model);
    bool evicted = cache_.invalidate(req.model);
    if (handle) {
      (void)pool_.try_submit([handle]() mutable {
        save_unless_busy(handle->key(), *handle);
        handle.reset();  // the last reference, unless a request still holds the model
      });
    }
    return reply_now(session, req, protocol::ok_line(req.id, {{"model", req.model}, {"evicted", evicted}}), "ok");
  }
  if (op == "infer") {
    auto params = protocol::parse_infer(req.body);
    if (!params) return fail(protocol::code::kBadRequest, params.error().message);
    req.infer = std::move(*params);
    req.stream_experts = req.infer.stream_experts;
  } else {
    auto stream_experts = protocol::stream_experts_field(req.body);
    if (!stream_experts) return fail(protocol::code::kBadRequest, stream_experts.error().message);
    req.stream_experts = std::move(*stream_experts);
  }
  auto resolved = resolve_model(options_.models_dir, req.model);
  if (!resolved) return fail(wire_code(resolved.error().code).c_str(), resolved.error().message);
  req.resolved = std::move(*resolved);
  start_job(session, req);
}

void Service::start_job(const std::shared_ptr<Session>& session, Request& req) {
  auto pending = session->begin(req.id, req.op, req.model);
  auto shared_req = std::make_shared<Request>(std::move(req));
  // The job hands its references to the io thread with the result, so the session is never destroyed
  // on a worker.
  bool queued = pool_.try_submit([this, session, pending, shared_req]() mutable {
    std::string outcome = "ok";
    std::string line;
    try {
      line = shared_req->op == "load" ? run_load(session, pending, *shared_req, outcome)
                                      : run_infer(session, pending, *shared_req, outcome);
    } catch (const std::exception& e) {
      outcome = protocol::code::kInternal;
      line = protocol::error_line(shared_req->id, protocol::code::kInternal, e.what());
    }
    asio::post(io_, [this, session = std::move(session), pending = std::move(pending),
                     shared_req = std::move(shared_req), line = std::move(line), outcome]() mutable {
      session->finish(pending, std::move(line));
      spdlog::info("conn={} id={} op={} model={} outcome={} ms={:.2f}", session->number(),
                   id_text(shared_req->id), text(shared_req->op), text(shared_req->model), outcome,
                   ms_since(shared_req->received));
      job_done();
    });
  });
  if (!queued) {
    ++busy_rejections_;
    session->finish(pending, protocol::error_line(shared_req->id, protocol::code::kBusy,
                                                  "car-inferenced is busy: " +
                                                      std::to_string(options_.queue_capacity) +
                                                      " requests are already queued; retry later"));
    spdlog::info("conn={} id={} op={} model={} outcome=busy ms={:.2f}", session->number(),
                 id_text(shared_req->id), text(shared_req->op), text(shared_req->model),
                 ms_since(shared_req->received));
    return;
  }
  ++in_flight_;
}

void Service::job_done() {
  --in_flight_;
  if (shutting_down_ && in_flight_ == 0 && drained_) {
    auto cb = std::move(drained_);
    drained_ = nullptr;
    cb();
  }
}

std::optional<ModelCache::Lease> Service::acquire_model(const Request& req, LoadInfo& info, std::string& error_line,
                                                        std::string& outcome) {
  const ResolvedModel& m = *req.resolved;
  // On a miss the cache makes room for the runtime's estimate (or refuses a model larger than the whole
  // budget) before loading, then charges what the loaded model reports: one size for the cache, `load`
  // and `stats`.
  const LoadRequest load_request{req.stream_experts};
  auto estimate = [&] { return runtime_.estimate_bytes(m.path, load_request); };
  auto load = [&]() -> Result<Sized<std::shared_ptr<Backend>>> {
    spdlog::debug("loading model {} from {}", log_quote(m.id), log_quote(m.path.string()));
    auto backend = runtime_.load_with(m.path, load_request);
    if (!backend) return backend.error();
    const uint64_t bytes = (*backend)->memory_bytes();  // no one else has it yet
    return Sized<std::shared_ptr<Backend>>{std::move(*backend), bytes};
  };
  auto lease = cache_.lease_or_load(m.id, estimate, load, &info);
  if (lease && info.hit) {
    // The cached model must still be the file the id names: a file replaced (renamed over), rewritten or
    // truncated in place since it was loaded is loaded again. Requests holding the old backend keep it.
    if (auto current = lease->backend()->check_file(m.path); !current) {
      ModelCache::Handle stale = lease->handle();
      lease->reset();
      drop_stale(m.id, stale, current.error().message);
      info = LoadInfo{};
      lease = cache_.lease_or_load(m.id, estimate, load, &info);
    }
  }
  if (!lease) {
    outcome = wire_code(lease.error().code);
    error_line = protocol::error_line(req.id, outcome, lease.error().message);
    return std::nullopt;
  }
  if (info.loaded) {
    ModelFacts f;
    {
      auto model_lock = lease->lock();
      f.streams_experts = lease->backend()->streams_experts();
    }
    std::lock_guard lock(facts_mutex_);
    facts_[m.id] = f;
  }
  return std::move(*lease);
}

std::string Service::run_load(const std::shared_ptr<Session>&, const std::shared_ptr<Pending>& pending,
                              const Request& req, std::string& outcome) {
  if (pending->cancelled.load()) {
    outcome = protocol::code::kCancelled;
    return protocol::error_line(req.id, outcome, "load cancelled before it started");
  }
  LoadInfo info;
  std::string error;
  auto lease = acquire_model(req, info, error, outcome);
  if (!lease) return error;
  const ModelFacts f = facts(req.model).value_or(ModelFacts{});
  const uint64_t size_bytes = (*lease)->size_bytes();  // the cache's charge, as `stats` reports it
  lease->reset();
  json r = {{"model", req.model},
            {"size_bytes", size_bytes},
            {"file_bytes", req.resolved->file_bytes},
            {"load_ms", ms_of(info.load_time)},
            {"cached", info.hit},
            {"waited", info.waited},
            {"retained", info.cached},
            {"streaming", f.streams_experts}};
  outcome = info.hit ? "ok(hit)" : "ok(loaded)";
  return protocol::ok_line(req.id, r);
}

std::string Service::run_infer(const std::shared_ptr<Session>& session, const std::shared_ptr<Pending>& pending,
                               const Request& req, std::string& outcome) {
  const double queue_ms = ms_since(req.received);
  if (pending->cancelled.load()) {
    outcome = protocol::code::kCancelled;
    return protocol::error_line(req.id, outcome, "request cancelled before it started");
  }
  LoadInfo info;
  std::string error;
  const Clock::time_point acquire_start = Clock::now();
  auto lease = acquire_model(req, info, error, outcome);
  if (!lease) return error;
  const double load_ms = ms_since(acquire_start);  // a warm model: the cache lookup alone
  if (pending->cancelled.load()) {
    outcome = protocol::code::kCancelled;
    return protocol::error_line(req.id, outcome, "request cancelled while its model loaded");
  }
  // One request at a time per model; a request waiting here for another one can still be cancelled.
  auto model_lock = lease->lock_unless(pending->cancelled);
  if (!model_lock.owns_lock()) {
    lease->reset();
    outcome = protocol::code::kCancelled;
    return protocol::error_line(req.id, outcome, "request cancelled while it waited for its model");
  }

  GenerateParams params;
  params.prompt = req.infer.prompt;
  params.max_tokens = req.infer.max_tokens;
  params.temperature = req.infer.temperature;
  params.top_k = req.infer.top_k;
  params.top_p = req.infer.top_p;
  params.seed = req.infer.seed;
  params.stop = req.infer.stop;
  params.ignore_eos = req.infer.ignore_eos;
  TokenSink sink;
  if (req.infer.stream) {
    sink = [this, session, pending, id = req.id](int32_t token, const std::string& text) {
      asio::post(io_, [session, pending, line = protocol::token_line(id, text, token)]() mutable {
        session->send_token(pending, std::move(line));
      });
    };
  }
  auto out = lease->backend()->generate(params, sink, pending->cancelled);
  model_lock.unlock();
  ModelCache::Handle used = lease->handle();
  lease->reset();
  if (!out) {
    // The file changed under the model while it computed: the next request must load it afresh. (A streamed
    // expert that could not be read from an unchanged file is also io_error; that model stays cached.)
    if (out.error().code == "io_error") {
      if (auto current = used->backend()->check_file(req.resolved->path); !current) {
        drop_stale(req.model, used, current.error().message);
      }
    }
    outcome = wire_code(out.error().code);
    return protocol::error_line(req.id, outcome, out.error().message);
  }
  json r = {{"model", req.model},
            {"text", out->text},
            {"tokens", out->tokens},
            {"finish_reason", out->finish_reason},
            {"usage", {{"prompt_tokens", out->prompt_tokens}, {"completion_tokens", out->tokens.size()}}},
            {"timings",
             {{"load_ms", load_ms},
              {"queue_ms", queue_ms},
              {"prompt_ms", out->prompt_ms},
              {"decode_ms", out->decode_ms}}}};
  outcome = "ok(" + out->finish_reason + ", " + std::to_string(out->tokens.size()) + " tokens)";
  return protocol::ok_line(req.id, r);
}

void Service::drop_stale(const std::string& id, const ModelCache::Handle& handle, const std::string& why) {
  if (cache_.peek(id) != handle) return;  // already dropped (and perhaps reloaded) by another request
  if (!cache_.invalidate(id)) return;
  spdlog::info(
      "model {}: its file changed on disk ({}); dropped the cached model, the next request loads the "
      "file again",
      log_quote(id), why);
}

std::optional<Service::ModelFacts> Service::facts(const std::string& id) const {
  std::lock_guard lock(facts_mutex_);
  auto it = facts_.find(id);
  if (it == facts_.end()) return std::nullopt;
  return it->second;
}

void Service::begin_shutdown(std::function<void()> drained) {
  shutting_down_ = true;
  drained_ = std::move(drained);
  if (in_flight_ == 0 && drained_) {
    auto cb = std::move(drained_);
    drained_ = nullptr;
    cb();
  }
}

void Service::cancel_in_flight() {
  for (const auto& s : sessions_) s->cancel_all();
}

void Service::close_sessions(bool graceful, std::function<void()> all_closed) {
  all_closed_ = std::move(all_closed);
  auto copy = sessions_;  // closing erases from sessions_
  for (const auto& s : copy) {
    if (graceful) {
      s->close_when_idle();
    } else {
      s->close_now();
    }
  }
  if (sessions_.empty() && all_closed_) std::exchange(all_closed_, nullptr)();
}

void Service::run_shutdown_hooks() {
  pool_.stop();
  for (const auto& item : cache_.list()) {
    auto handle = cache_.peek(item.key);
    if (!handle) continue;
    auto lock = handle->lock();
    spdlog::debug("saving state of model {}", item.key);
    try {
      handle->backend()->save_state();
    } catch (const std::exception& e) {
      spdlog::warn("saving state of model {} failed: {}", item.key, e.what());
    }
  }
  Evicted e = cache_.clear();
  spdlog::info("shutdown: released {} cached model(s), {} bytes", e.entries, e.bytes);
}

void Service::apply_live(const LiveSettings& live) {
  Evicted e = cache_.set_budget(live.cache_budget_bytes);
  cache_.set_idle_ttl(ttl_of(live));
  spdlog::set_level(spdlog::level::from_str(live.log_level));
  connections_.apply(live);
  spdlog::info("settings reloaded: cache budget {} bytes, idle TTL {} s, log level {} ({} model(s) evicted)",
               live.cache_budget_bytes, live.idle_ttl.count(), live.log_level, e.entries);
}

std::size_t Service::evict_idle() {
  save_states_if_due();
  Evicted e = cache_.evict_idle();
  if (e.entries > 0) spdlog::info("idle eviction: {} model(s), {} bytes released", e.entries, e.bytes);
  return e.entries;
}

void Service::save_states_if_due() {
  const auto now = Clock::now();
  if (now - last_state_save_ < kStateSavePeriod || shutting_down_) return;
  last_state_save_ = now;
  // On a worker: a save writes and syncs a file. Skipped this period when the queue is full.
  (void)pool_.try_submit([this] {
    for (const auto& item : cache_.list()) {
      if (auto handle = cache_.peek(item.key)) save_unless_busy(item.key, *handle);
    }
  });
}

void Service::save_unless_busy(const std::string& key, CachedBackend<std::shared_ptr<Backend>>& entry) {
  // A model serving a request is skipped: it saves next period, or when it is destroyed.
  std::unique_lock<ModelMutex> lock(entry.mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return;
  try {
    entry.backend()->save_state();
  } catch (const std::exception& e) {
    spdlog::warn("saving state of model {} failed: {}", key, e.what());
  }
}

std::string Service::status_line() const {
  CacheStats s = cache_.stats();
  return std::to_string(s.entries) + " model(s) loaded, cache " + std::to_string(s.total_bytes >> 20) + " of " +
         std::to_string(s.budget_bytes >> 20) + " MiB, " + std::to_string(in_flight_) + " request(s) in flight" +
         (shutting_down_ ? ", shutting down" : "");
}

json Service::stats_json() const {
  CacheStats s = cache_.stats();
  json models = json::array();
  json experts = json::object();
  for (const auto& item : s.items) {
    json m = {{"model", item.key},   {"size_bytes", item.size_bytes}, {"in_use", item.in_use},
              {"leases", item.leases}, {"idle_s", item.idle_seconds},  {"age_s", item.age_seconds},
              {"hits", item.hits}};
    if (auto f = facts(item.key)) m["streaming"] = f->streams_experts;
    if (auto handle = cache_.peek(item.key)) {
      json e = handle->backend()->expert_stats();
      if (!e.is_null()) experts[item.key] = std::move(e);
    }
    models.push_back(std::move(m));
  }
  json cache = {{"entries", s.entries},
                {"total_bytes", s.total_bytes},
                {"budget_bytes", s.budget_bytes},
                {"idle_ttl_s", s.idle_ttl ? json(s.idle_ttl->count() / 1000.0) : json(nullptr)},
                {"hits", s.hits},
                {"misses", s.misses},
                {"coalesced", s.coalesced},
                {"loads", s.loads},
                {"load_failures", s.load_failures},
                {"loading", s.loading},
                {"reserved_bytes", s.reserved_bytes},
                {"refused", s.refused},
                {"over_budget", s.over_budget},
                {"evictions", s.evictions_total()},
                {"evictions_by_cause",
                 {{"capacity", s.evictions_capacity},
                  {"idle", s.evictions_idle},
                  {"invalidate", s.evictions_invalidate},
                  {"clear", s.evictions_clear}}},
                {"evicted_held_entries", s.evicted_held_entries},
                {"evicted_held_bytes", s.evicted_held_bytes},
                {"mean_eviction_age_s", s.mean_eviction_age_seconds}};
  return {{"cache", cache},
          {"connections", connections_.stats()},
          {"models", models},
          {"experts", experts},  // per MoE model: its expert source's counters (Backend::expert_stats)
          {"requests", {{"total", requests_}, {"in_flight", in_flight_}, {"busy_rejections", busy_rejections_}}},
          {"workers", {{"threads", pool_.threads()}, {"queued", pool_.queued()}, {"running", pool_.running()}}},
          {"engine", runtime_.name()},
          {"uptime_s", std::chrono::duration<double>(Clock::now() - started_).count()}};
}

json Service::list_json(std::string& error) const {
  auto listed = list_models(options_.models_dir);
  if (!listed) {
    error = listed.error().message;
    return {};
  }
  json models = json::array();
  for (const auto& m : *listed) {
    models.push_back({{"model", m.id}, {"size_bytes", m.file_bytes}, {"loaded", cache_.contains(m.id)}});
  }
  return {{"models_dir", options_.models_dir.string()}, {"models", models}};
}

}  // namespace car::daemon
