#include "daemon/request_handler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <random>
#include <utility>

#include "core/util/error_codes.h"
#include "daemon/model_resolver.h"
#include "daemon/protocol.h"
#include "daemon/safe_text.h"

namespace car::daemon {

namespace asio = boost::asio;
using nlohmann::json;
using protocol::Op;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
double ms_of(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double seconds_of(std::chrono::milliseconds d) {
  return static_cast<double>(d.count()) / 1000.0;
}

std::optional<std::chrono::milliseconds> ttl_of(const LiveSettings& live) {
  if (live.idle_ttl.count() <= 0) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(live.idle_ttl);
}

// Client-supplied strings go into log lines only through these (safe_text.h): quoted and escaped.
std::string id_text(const json& id) {
  return log_id(id);
}
std::string text(std::string_view s) {
  return s.empty() ? "-" : log_quote(std::string(s));
}

/// The request's log line (one per request, at info). The quoting is skipped when info is off.
void log_request(uint64_t conn, const json& id, std::string_view op, const std::string& model,
                 std::string_view outcome, Clock::time_point received) {
  if (!spdlog::should_log(spdlog::level::info)) return;
  spdlog::info("conn={} id={} op={} model={} outcome={} ms={:.2f}", conn, id_text(id), text(op), text(model),
               outcome, ms_since(received));
}

/// The op as a metrics label: its wire name, or "unknown" (never the client's own text).
std::string_view metrics_op(std::string_view op_text) {
  auto op = protocol::op_from_name(op_text);
  return op ? protocol::op_name(*op) : "unknown";
}

/// A random sampling seed for a request that gave none. At most 2^53 - 1, so clients that read JSON numbers
/// as doubles can send it back exactly.
uint64_t fresh_seed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng() & ((uint64_t{1} << 53) - 1);
}

}  // namespace

// ---- CallRegistry ----

std::shared_ptr<Call> CallRegistry::begin(json id, Op op, std::string model) {
  auto call = std::make_shared<Call>();
  call->id = std::move(id);
  call->op = op;
  call->model = std::move(model);
  calls_.push_back(call);
  return call;
}

void CallRegistry::end(const std::shared_ptr<Call>& call) {
  calls_.remove(call);
}

bool CallRegistry::id_in_flight(const json& id) const {
  for (const auto& c : calls_) {
    if (c->id == id) return true;
  }
  return false;
}

std::size_t CallRegistry::cancel(const json& target) {
  std::size_t n = 0;
  for (auto& c : calls_) {
    if (!c->id.is_null() && c->id == target && !c->cancelled.exchange(true)) ++n;
  }
  return n;
}

void CallRegistry::cancel_all() {
  for (auto& c : calls_) c->cancelled.store(true);
}

// ---- RequestHandler ----

struct RequestHandler::Request {
  json id;
  Op op = Op::kHealth;
  std::string op_text;  // as sent (log lines)
  json body;
  std::string model;
  std::optional<ResolvedModel> resolved;
  protocol::InferParams infer;
  std::optional<StreamExperts> stream_experts;  // the request's choice for a load it triggers
  /// The request's `keep_alive`, cut to CAR_INFERENCE_MAX_KEEP_ALIVE_SECS; nullopt: the cache's idle TTL.
  std::optional<std::chrono::seconds> keep_alive;
  Clock::time_point received;
};

RequestHandler::RequestHandler(asio::io_context& io, const ServerOptions& options, ModelRuntime& runtime,
                               const ConnectionLimits& connections, CacheClock cache_clock)
    : io_(io),
      options_(options),
      runtime_(runtime),
      connections_(connections),
      cache_(options.live.cache_budget_bytes, ttl_of(options.live),
             cache_clock ? std::move(cache_clock) : CacheClock([] { return Clock::now(); })),
      pool_(std::max<std::size_t>(1, options.workers), std::max<std::size_t>(1, options.queue_capacity)) {
  cache_.set_eviction_listener([this](EvictionCause cause, double age_seconds, uint64_t) {
    metrics_.observe_eviction(eviction_cause_name(cause), age_seconds);
  });
  cache_.set_pinned(options.live.pinned_models);
  // One budget: the streamed models' expert caches grow into the room the cache leaves and give it back
  // (down to one slot per bank) before a load evicts a whole model.
  runtime_.share_room([this] { return cache_.room_bytes(); });
  cache_.set_room_listener([this] { runtime_.room_changed(); });
}

RequestHandler::~RequestHandler() {
  pool_.stop();
  runtime_.share_room({});  // the runtime may outlive us (and our cache, whose models leave its pool)
}

void RequestHandler::reject(const std::shared_ptr<Client>& client, const json& id, const Error& error,
                            Clock::time_point received) {
  ++requests_;
  Request req;
  req.id = id;
  req.received = received;
  answer(client, req, Reply::failure(error.code, error.message), error.code);
}

void RequestHandler::handle(const std::shared_ptr<Client>& client, protocol::Request request,
                            Clock::time_point received) {
  ++requests_;
  Request req;
  req.id = std::move(request.id);
  req.op_text = std::move(request.op);
  req.body = std::move(request.body);
  req.received = received;
  try {
    dispatch(client, req);
  } catch (const std::exception& e) {
    spdlog::error("conn {}: op {} threw: {}", client->number(), text(req.op_text), e.what());
    answer(client, req, Reply::failure(protocol::code::kInternal, e.what()), protocol::code::kInternal);
  }
}

void RequestHandler::handle_infer(const std::shared_ptr<Client>& client, json id,
                                  Result<protocol::InferParams> infer, Clock::time_point received) {
  ++requests_;
  Request req;
  req.id = std::move(id);
  req.op = Op::kInfer;
  req.op_text = protocol::op_name(Op::kInfer);
  req.received = received;
  try {
    if (admit(client, req)) dispatch_infer(client, req, std::move(infer));
  } catch (const std::exception& e) {
    spdlog::error("conn {}: op infer threw: {}", client->number(), e.what());
    answer(client, req, Reply::failure(protocol::code::kInternal, e.what()), protocol::code::kInternal);
  }
}

void RequestHandler::answer(const std::shared_ptr<Client>& client, const Request& req, Reply reply,
                            std::string_view outcome) {
  client->reply(req.id, nullptr, std::move(reply));
  log_request(client->number(), req.id, req.op_text, req.model, outcome, req.received);
  metrics_.count_request(metrics_op(req.op_text), outcome);
}

void RequestHandler::dispatch(const std::shared_ptr<Client>& client, Request& req) {
  auto fail = [&](std::string_view code, std::string message) {
    answer(client, req, Reply::failure(code, std::move(message)), code);
  };
  const auto op = protocol::op_from_name(req.op_text);
  if (!op) {
    return fail(protocol::code::kUnknownOp,
                "unknown op '" + req.op_text + "' (known: " + protocol::known_ops_text() + ")");
  }
  req.op = *op;
  if (!admit(client, req)) return;
  if (auto known = protocol::check_fields(req.op, req.body); !known) {
    return fail(protocol::code::kBadRequest, known.error().message);
  }

  switch (req.op) {
    case Op::kHealth:
      return answer(client, req, Reply::success(health_json()), "ok");
    case Op::kStats:
      return answer(client, req, Reply::success(stats_json()), "ok");
    case Op::kMetrics:
      return answer(client, req, Reply::success({{"text", metrics_text()}}), "ok");
    case Op::kList: {
      std::string error;
      json r = list_json(error);
      if (!error.empty()) return fail(protocol::code::kInternal, error);
      return answer(client, req, Reply::success(std::move(r)), "ok");
    }
    case Op::kCancel: {
      auto t = req.body.find("target");
      if (t == req.body.end() || t->is_null() || t->is_object() || t->is_array()) {
        return fail(protocol::code::kBadRequest, "field 'target' (the id of a request in flight) is missing");
      }
      std::size_t n = client->calls().cancel(*t);
      return answer(client, req, Reply::success({{"cancelled", n > 0}, {"target", *t}}),
                    n > 0 ? "ok" : "ok(no such request)");
    }
    case Op::kInfer: {
      auto infer = protocol::parse_infer(req.body);
      req.body = nullptr;  // parsed: the job does not need the document
      return dispatch_infer(client, req, std::move(infer));
    }
    case Op::kLoad:
    case Op::kInvalidate:
      break;
  }

  // The ops that name a model.
  auto model = protocol::model_field(req.body);
  if (!model) return fail(protocol::code::kBadRequest, model.error().message);
  req.model = *model;
  if (req.op == Op::kInvalidate) {
    if (auto ok = check_model_id(req.model); !ok) return fail(protocol::code::kForbidden, ok.error().message);
    // The model saves its state (expert usage sidecar) and is freed on a worker, not on the io thread.
    auto handle = cache_.peek(req.model);
    if (!handle) {
      // Nothing cached: an id without a model file is not_found, not "was not loaded".
      if (auto file = resolve_model(options_.models_dir, req.model);
          !file && file.error().code == errc::kNotFound) {
        return fail(protocol::code::kNotFound, file.error().message);
      }
    }
    bool evicted = cache_.invalidate(req.model);
    if (handle) {
      (void)pool_.try_submit([handle]() mutable {
        save_unless_busy(handle->key(), *handle);
        handle.reset();  // the last reference, unless a request still holds the model
      });
    }
    return answer(client, req, Reply::success({{"model", req.model}, {"evicted", evicted}}), "ok");
  }
  auto stream_experts = protocol::stream_experts_field(req.body);
  if (!stream_experts) return fail(protocol::code::kBadRequest, stream_experts.error().message);
  req.stream_experts = std::move(*stream_experts);
  auto keep_alive = protocol::keep_alive_field(req.body);
  if (!keep_alive) return fail(protocol::code::kBadRequest, keep_alive.error().message);
  if (*keep_alive) req.keep_alive = std::chrono::seconds(**keep_alive);
  req.body = nullptr;  // parsed: the job does not need the document
  resolve_and_start(client, req);
}

bool RequestHandler::admit(const std::shared_ptr<Client>& client, const Request& req) {
  auto fail = [&](std::string_view code, std::string message) {
    answer(client, req, Reply::failure(code, std::move(message)), code);
    return false;
  };
  if (shutting_down_) return fail(protocol::code::kShuttingDown, "car-inferenced is shutting down");
  // An id shared by two requests in flight would make their replies and `cancel` ambiguous.
  if (!req.id.is_null() && client->calls().id_in_flight(req.id)) {
    return fail(protocol::code::kBadRequest,
                "id " + protocol::dump(req.id) +
                    " is already used by a request in flight on this connection; "
                    "ids must be unique among requests in flight (that request "
                    "carries on)");
  }
  return true;
}

void RequestHandler::dispatch_infer(const std::shared_ptr<Client>& client, Request& req,
                                    Result<protocol::InferParams> infer) {
  if (!infer) {
    return answer(client, req, Reply::failure(protocol::code::kBadRequest, infer.error().message),
                  protocol::code::kBadRequest);
  }
  req.infer = std::move(*infer);
  req.model = req.infer.model;
  // No seed asked for: a fresh one (reported in the result), so sampled text differs run to run.
  if (!req.infer.seed_given) req.infer.generate.sampling.seed = fresh_seed();
  req.stream_experts = req.infer.stream_experts;
  req.keep_alive = req.infer.keep_alive;
  resolve_and_start(client, req);
}

void RequestHandler::resolve_and_start(const std::shared_ptr<Client>& client, Request& req) {
  // Longer than the admin allows: cut, and the reply's keep_alive_s says what applies.
  if (req.keep_alive) req.keep_alive = std::min(*req.keep_alive, options_.live.max_keep_alive);
  auto resolved = resolve_model(options_.models_dir, req.model);
  if (!resolved) {
    const std::string_view code = protocol::wire_code(resolved.error().code);
    return answer(client, req, Reply::failure(code, resolved.error().message), code);
  }
  req.resolved = std::move(*resolved);
  start_job(client, req);
}

void RequestHandler::start_job(const std::shared_ptr<Client>& client, Request& req) {
  auto call = client->calls().begin(req.id, req.op, req.model);
  auto shared_req = std::make_shared<Request>(std::move(req));
  // A deadline cancels the request as `cancel` would, marked so its reply says why. The timer lives until
  // the request ends (`finish` cancels it) and holds the call weakly.
  std::shared_ptr<asio::steady_timer> deadline_timer;
  if (shared_req->op == Op::kInfer && shared_req->infer.deadline) {
    deadline_timer = std::make_shared<asio::steady_timer>(io_);
    deadline_timer->expires_at(shared_req->received + *shared_req->infer.deadline);
    deadline_timer->async_wait([weak = std::weak_ptr<Call>(call)](const boost::system::error_code& ec) {
      if (ec) return;
      if (auto c = weak.lock()) {
        c->deadline_passed.store(true);
        c->cancelled.store(true);
      }
    });
  }
  // The job hands its references to the io thread with the result, so the client is never destroyed
  // on a worker.
  // The request's ending, from any thread: it hands its references to the io thread with the reply, so the
  // client is never destroyed on a worker or a model's scheduler thread.
  Finish finish = [this, client, call, shared_req, deadline_timer](Reply reply, std::string outcome) {
    asio::post(io_, [this, client, call, shared_req, deadline_timer, reply = std::move(reply),
                     outcome = std::move(outcome)]() mutable {
      if (deadline_timer) deadline_timer->cancel();
      if (call->deadline_passed.load()) {
        // Ended by its deadline: a request that had not started says so; one that generated ends with
        // finish_reason "deadline" and its text so far.
        if (!reply.ok && reply.code == protocol::code::kCancelled) {
          reply = Reply::failure(protocol::code::kDeadlineExceeded,
                                 "deadline_ms " + std::to_string(shared_req->infer.deadline->count()) +
                                     " passed before the request started");
          outcome = protocol::code::kDeadlineExceeded;
        } else if (reply.ok && reply.infer && reply.infer->output.finish_reason == "cancelled") {
          reply.infer->output.finish_reason = "deadline";
          outcome = "ok(deadline, " + std::to_string(reply.infer->output.tokens.size()) + " tokens)";
        }
      }
      client->calls().end(call);
      client->reply(shared_req->id, call, std::move(reply));
      log_request(client->number(), shared_req->id, shared_req->op_text, shared_req->model, outcome,
                  shared_req->received);
      metrics_.count_request(metrics_op(shared_req->op_text), outcome);
      job_done();
    });
  };
  bool queued = pool_.try_submit([this, client, call, shared_req, finish]() mutable {
    std::string outcome = "ok";
    std::optional<Reply> reply;
    try {
      if (shared_req->op == Op::kLoad) {
        reply = run_load(call, *shared_req, outcome);
      } else {
        // nullopt: the generation runs on the model's scheduler, which calls `finish` when it ends.
        reply = run_infer(client, call, shared_req, outcome, finish);
        if (reply) unload_if_asked(*shared_req);
      }
    } catch (const std::exception& e) {
      outcome = protocol::code::kInternal;
      reply = Reply::failure(protocol::code::kInternal, e.what());
    }
    if (reply) finish(std::move(*reply), std::move(outcome));
  });
  if (!queued) {
    ++busy_rejections_;
    client->calls().end(call);
    client->reply(shared_req->id, call,
                  Reply::failure(protocol::code::kBusy,
                                 "car-inferenced is busy: " + std::to_string(options_.queue_capacity) +
                                     " requests are already queued; retry later"));
    log_request(client->number(), shared_req->id, shared_req->op_text, shared_req->model,
                protocol::code::kBusy, shared_req->received);
    metrics_.count_request(metrics_op(shared_req->op_text), protocol::code::kBusy);
    return;
  }
  ++in_flight_;
}

void RequestHandler::job_done() {
  --in_flight_;
  if (shutting_down_ && in_flight_ == 0 && drained_) std::exchange(drained_, nullptr)();
}

std::optional<ModelCache::Lease> RequestHandler::acquire_model(const Request& req, LoadInfo& info,
                                                               Reply& error, std::string& outcome) {
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
  if (info.loaded) metrics_.observe_load(std::chrono::duration<double>(info.load_time).count());
  // The latest request to start on a model sets how long it stays after its last use (Ollama's rule).
  if (lease) (*lease)->set_keep_alive(req.keep_alive);
  if (!lease) {
    outcome = protocol::wire_code(lease.error().code);
    error = Reply::failure(outcome, lease.error().message);
    return std::nullopt;
  }
  if (info.loaded) {
    ModelFacts f;
    {
      auto model_lock = lease->lock();
      f.streams_experts = lease->backend()->streams_experts();
      f.context_length = lease->backend()->context_length();
    }
    MutexLock lock(facts_mutex_);
    facts_[m.id] = f;
  }
  return std::move(*lease);
}

Reply RequestHandler::run_load(const std::shared_ptr<Call>& call, const Request& req, std::string& outcome) {
  metrics_.observe_queue_wait(ms_since(req.received) / 1000);
  if (call->cancelled.load()) {
    outcome = protocol::code::kCancelled;
    return Reply::failure(outcome, "load cancelled before it started");
  }
  LoadInfo info;
  Reply error;
  auto lease = acquire_model(req, info, error, outcome);
  if (!lease) return error;
  const ModelFacts f = facts(req.model).value_or(ModelFacts{});
  const uint64_t size_bytes = (*lease)->size_bytes();  // the cache's charge, as `stats` reports it
  lease->reset();
  const bool unloaded = unload_if_asked(req);
  json r = {{"model", req.model},
            {"size_bytes", size_bytes},
            {"file_bytes", req.resolved->file_bytes},
            {"load_ms", ms_of(info.load_time)},
            {"cached", info.hit},
            {"waited", info.waited},
            {"retained", info.cached && !unloaded},
            {"pinned", cache_.is_pinned(req.model)},
            {"keep_alive_s", keep_alive_json(req)},
            {"streaming", f.streams_experts},
            {"context_length", f.context_length}};
  outcome = info.hit ? "ok(hit)" : "ok(loaded)";
  return Reply::success(std::move(r));
}

std::optional<Reply> RequestHandler::run_infer(const std::shared_ptr<Client>& client,
                                               const std::shared_ptr<Call>& call,
                                               const std::shared_ptr<Request>& shared_req, std::string& outcome,
                                               const Finish& finish) {
  const Request& req = *shared_req;
  const double queue_ms = ms_since(req.received);
  metrics_.observe_queue_wait(queue_ms / 1000);
  if (call->cancelled.load()) {
    outcome = protocol::code::kCancelled;
    return Reply::failure(outcome, "request cancelled before it started");
  }
  LoadInfo info;
  Reply error;
  const Clock::time_point acquire_start = Clock::now();
  auto lease = acquire_model(req, info, error, outcome);
  if (!lease) return error;
  const double load_ms = ms_since(acquire_start);  // a warm model: the cache lookup alone
  if (call->cancelled.load()) {
    outcome = protocol::code::kCancelled;
    return Reply::failure(outcome, "request cancelled while its model loaded");
  }
  // Where streamed tokens go. The sink may be destroyed on the model's scheduler thread, after the reply:
  // it reaches the client through `target`, which `end` empties on the io thread, so the last reference to
  // a client is never dropped on that thread.
  struct StreamTarget {
    std::shared_ptr<Client> client;
    std::shared_ptr<Call> call;
  };
  std::shared_ptr<StreamTarget> target;
  TokenSink sink;
  if (req.infer.stream) {
    target = std::make_shared<StreamTarget>(StreamTarget{client, call});
    sink = [this, target](const protocol::TokenEvent& event) {
      asio::post(io_, [client = target->client, call = target->call, event] { client->token(call, event); });
    };
  }
  // The request's own parameters, as parse_infer produced it, are what the runtime receives.
  const GenerateParams& params = req.infer;
  const double started_ms = ms_since(req.received);  // arrival -> the runtime has it

  // What the generation's end does, on whatever thread ends it: the reply, built on the io thread, where
  // the lease is also let go (a model whose last handle goes is destroyed there, never on the scheduler
  // thread that would have to join itself).
  auto end = [this, shared_req, target, load_ms, queue_ms, started_ms, finish](
                 std::shared_ptr<ModelCache::Lease> held, Result<GenerateOutput> out) {
    const Request& request = *shared_req;
    if (target) *target = StreamTarget{};  // every token was posted before the generation ended
    ModelCache::Handle used = held->handle();
    held->reset();
    std::string ended;
    if (!out) {
      // The file changed under the model while it computed: the next request must load it afresh. (A
      // streamed expert that could not be read from an unchanged file is also io_error; that model stays
      // cached.)
      if (out.error().code == errc::kIoError) {
        if (auto current = used->backend()->check_file(request.resolved->path); !current) {
          drop_stale(request.model, used, current.error().message);
        }
      }
      ended = protocol::wire_code(out.error().code);
      unload_if_asked(request);
      finish(Reply::failure(ended, out.error().message), ended);
      return;
    }
    metrics_.observe_generation(static_cast<uint64_t>(out->prompt_tokens), out->prompt_ms / 1000,
                                out->tokens.size(), out->decode_ms / 1000, out->finish_reason,
                                static_cast<uint64_t>(out->cached_tokens));
    if (!out->tokens.empty()) metrics_.observe_first_token(request.model, (started_ms + out->ttft_ms) / 1000);
    metrics_.observe_inter_token(request.model, out->itl_ms);
    ended = "ok(" + out->finish_reason + ", " + std::to_string(out->tokens.size()) + " tokens)";
    // The typed result goes to the front as it is; each renders it in its own wire format.
    protocol::InferResult r;
    r.model = request.model;
    r.seed = request.infer.generate.sampling.seed;
    r.logprobs = request.infer.generate.logprobs;
    r.load_ms = load_ms;
    r.queue_ms = queue_ms + out->queue_ms;  // the worker queue, then the model's own
    r.ttft_ms = out->tokens.empty() ? 0 : started_ms + out->ttft_ms;
    if (request.keep_alive) {
      // What now applies to the model: nothing when it is pinned (never evicted for idleness).
      r.keep_alive_given = true;
      if (!cache_.is_pinned(request.model)) r.keep_alive_s = request.keep_alive->count();
    }
    r.output = std::move(*out);
    unload_if_asked(request);
    finish(Reply::inferred(std::move(r)), ended);
  };

  std::shared_ptr<Backend> backend = lease->backend();
  if (backend->concurrent()) {
    // The model's scheduler queues and batches it; this worker is free at once. The lease lives until the
    // generation ends: a model serving a request is never evicted from under it.
    auto held = std::make_shared<ModelCache::Lease>(std::move(*lease));
    backend->generate_async(params, std::move(sink), call->cancelled,
                            [this, held, end](Result<GenerateOutput> out) mutable {
                              asio::post(io_, [held = std::move(held), end = std::move(end),
                                               out = std::move(out)]() mutable { end(held, std::move(out)); });
                            });
    return std::nullopt;
  }
  // A runtime that runs one request at a time per model: wait for the model's lock here (cancellable).
  auto model_lock = lease->lock_unless(call->cancelled);
  if (!model_lock.owns_lock()) {
    lease->reset();
    outcome = protocol::code::kCancelled;
    return Reply::failure(outcome, "request cancelled while it waited for its model");
  }
  auto out = backend->generate(params, sink, call->cancelled);
  model_lock.unlock();
  auto held = std::make_shared<ModelCache::Lease>(std::move(*lease));
  end(held, std::move(out));
  return std::nullopt;
}

void RequestHandler::drop_stale(const std::string& id, const ModelCache::Handle& handle,
                                const std::string& why) {
  if (cache_.peek(id) != handle) return;  // already dropped (and perhaps reloaded) by another request
  if (!cache_.invalidate(id)) return;
  spdlog::info(
      "model {}: its file changed on disk ({}); dropped the cached model, the next request loads the "
      "file again",
      log_quote(id), why);
}

bool RequestHandler::unload_if_asked(const Request& req) {
  if (!req.keep_alive || req.keep_alive->count() != 0) return false;
  // Not when another request still uses it, or it is pinned (evict_if_expired checks both).
  const bool unloaded = cache_.evict_if_expired(req.model);
  if (unloaded) spdlog::debug("model {} unloaded after the request (keep_alive 0)", log_quote(req.model));
  return unloaded;
}

json RequestHandler::keep_alive_json(const Request& req) const {
  // What now applies to the model: null when it is never evicted for idleness (pinned, or no TTL at all).
  if (cache_.is_pinned(req.model)) return nullptr;
  if (req.keep_alive) return req.keep_alive->count();
  const auto ttl = cache_.idle_ttl();
  return ttl ? json(static_cast<double>(ttl->count()) / 1000.0) : json(nullptr);
}

std::optional<RequestHandler::ModelFacts> RequestHandler::facts(const std::string& id) const {
  MutexLock lock(facts_mutex_);
  auto it = facts_.find(id);
  if (it == facts_.end()) return std::nullopt;
  return it->second;
}

void RequestHandler::begin_shutdown(std::function<void()> drained) {
  shutting_down_ = true;
  drained_ = std::move(drained);
  if (in_flight_ == 0 && drained_) std::exchange(drained_, nullptr)();
}

void RequestHandler::run_shutdown_hooks() {
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

void RequestHandler::apply_live(const LiveSettings& live) {
  Evicted e = cache_.set_budget(live.cache_budget_bytes);
  cache_.set_idle_ttl(ttl_of(live));
  cache_.set_pinned(live.pinned_models);
  spdlog::set_level(spdlog::level::from_str(live.log_level));
  spdlog::info("settings reloaded: cache budget {} bytes, idle TTL {} s, log level {} ({} model(s) evicted)",
               live.cache_budget_bytes, live.idle_ttl.count(), live.log_level, e.entries);
}

std::size_t RequestHandler::evict_idle(std::optional<std::chrono::nanoseconds>* next_due) {
  save_states_if_due();
  Evicted e = cache_.evict_idle(next_due);
  if (e.entries > 0) spdlog::info("idle eviction: {} model(s), {} bytes released", e.entries, e.bytes);
  return e.entries;
}

void RequestHandler::save_states_if_due() {
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

void RequestHandler::save_unless_busy(const std::string& key,
                                      CachedBackend<std::shared_ptr<Backend>>& entry) {
  // A model serving a request is skipped: it saves next period, or when it is destroyed.
  std::unique_lock<ModelMutex> lock(entry.mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return;
  try {
    entry.backend()->save_state();
  } catch (const std::exception& e) {
    spdlog::warn("saving state of model {} failed: {}", key, e.what());
  }
}

std::string RequestHandler::status_line() const {
  CacheStats s = cache_.stats();
  return std::to_string(s.entries) + " model(s) loaded, cache " + std::to_string(s.total_bytes >> 20) +
         " of " + std::to_string(s.budget_bytes >> 20) + " MiB, " + std::to_string(in_flight_) +
         " request(s) in flight" + (shutting_down_ ? ", shutting down" : "");
}

json RequestHandler::health_json() const {
  // Member by member: a braced list builds a temporary array per pair first, which made this the dearest
  // part of a `health` round trip.
  json h(json::value_t::object);
  h["status"] = "ok";
  h["engine"] = runtime_.name();
  h["uptime_s"] = std::chrono::duration<double>(Clock::now() - started_).count();
  h["models_loaded"] = cache_.entries();
  h["in_flight"] = in_flight_;
  return h;
}

json RequestHandler::sequences_json(const engine::SchedulerStats& s) {
  return {{"parallel", s.slots},
          {"active", s.active},
          {"queued", s.queued},
          {"kv_tokens_used", s.kv_tokens_used},
          {"kv_tokens_capacity", s.kv_tokens_capacity},
          {"kv_bytes_resident", s.kv_bytes_resident},
          {"tokens_generated", s.tokens_generated},
          {"steps", s.steps},
          {"tokens_per_s", s.tokens_per_s}};
}

json RequestHandler::stats_json() const {
  CacheStats s = cache_.stats();
  json models = json::array();
  json experts = json::object();
  for (const auto& item : s.items) {
    json m = {{"model", item.key},     {"size_bytes", item.size_bytes}, {"in_use", item.in_use},
              {"leases", item.leases}, {"idle_s", item.idle_seconds},   {"age_s", item.age_seconds},
              {"hits", item.hits},     {"pinned", item.pinned}};
    const json ttl = item.idle_ttl ? json(seconds_of(*item.idle_ttl)) : json(nullptr);
    m["keep_alive_s"] = item.keep_alive_set ? ttl : json(nullptr);
    m["idle_ttl_s"] = ttl;
    if (auto f = facts(item.key)) {
      m["streaming"] = f->streams_experts;
      m["context_length"] = f->context_length;
    }
    if (auto handle = cache_.peek(item.key)) {
      json e = handle->backend()->expert_stats();
      if (!e.is_null()) experts[item.key] = std::move(e);
      if (auto sched = handle->backend()->scheduler_stats()) m["sequences"] = sequences_json(*sched);
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
  return {
      {"cache", cache},
      {"connections", connections_.stats()},
      {"models", models},
      {"experts", experts},  // per MoE model: its expert source's counters (Backend::expert_stats)
      {"requests", {{"total", requests_}, {"in_flight", in_flight_}, {"busy_rejections", busy_rejections_}}},
      {"workers", {{"threads", pool_.threads()}, {"queued", pool_.queued()}, {"running", pool_.running()}}},
      {"engine", runtime_.name()},
      {"uptime_s", std::chrono::duration<double>(Clock::now() - started_).count()}};
}

json RequestHandler::list_json(std::string& error) const {
  auto listed = list_models(options_.models_dir);
  if (!listed) {
    error = listed.error().message;
    return {};
  }
  const CacheStats cache = cache_.stats();
  json models = json::array();
  for (const auto& m : *listed) {
    json row = {{"model", m.id}, {"size_bytes", m.file_bytes}, {"loaded", cache_.contains(m.id)}};
    // What the file holds, from its header (no tensor data read); null fields for a file that is not GGUF.
    row["arch"] = nullptr;
    row["params"] = nullptr;
    row["quant"] = nullptr;
    row["context_length"] = nullptr;
    // Read once per file version (model_catalog.h): a repeated `list` does not parse the headers again.
    if (const auto info = catalog_.describe(m.path)) {
      if (!info->architecture.empty()) row["arch"] = info->architecture;
      row["params"] = info->parameters;
      if (!info->quantization.empty()) row["quant"] = info->quantization;
      if (info->context_length) row["context_length"] = *info->context_length;
    }
    // Seconds until the idle sweep may evict it (its keep-alive, else the idle TTL): null when not loaded, in
    // use, pinned, or idle eviction is off.
    row["idle_eviction_s"] = nullptr;
    row["pinned"] = cache_.is_pinned(m.id);
    row["sequences"] = nullptr;
    if (auto handle = cache_.peek(m.id)) {
      if (auto sched = handle->backend()->scheduler_stats()) row["sequences"] = sequences_json(*sched);
    }
    for (const auto& item : cache.items) {
      if (item.key != m.id || item.in_use || !item.idle_ttl) continue;
      row["idle_eviction_s"] = std::max(0.0, seconds_of(*item.idle_ttl) - item.idle_seconds);
    }
    models.push_back(std::move(row));
  }
  return {{"models_dir", options_.models_dir.string()}, {"models", models}};
}

}  // namespace car::daemon
