// RequestHandler: what the daemon does with a request, whatever front end it came through. It dispatches
// on the op, validates the request, answers the quick ops (health, stats, list, invalidate, cancel) at
// once on the io thread, and runs load/infer as jobs on the worker pool whose results and streamed tokens
// are posted back to the io thread. It owns the backend cache and the worker pool; it borrows the
// io_context, the ModelRuntime and the connection counts it reports in `stats`.
//
// A front end frames and parses requests and hands each to handle() with the Client it came from (the HTTP
// front hands an `infer` already typed to handle_infer()), and turns the Replies - an ok `infer` as a typed
// protocol::InferResult - and token events it gets back into its own wire format. The
// handler keeps each client's requests in flight in that client's CallRegistry (unique ids, `cancel`).
//
// Threading: every member function runs on the io thread, except what the jobs do on workers (they touch
// only the cache, the runtime and `facts_`, which are thread-safe or locked). Shutdown: begin_shutdown()
// makes new requests answer `shutting_down`; once nothing is in flight, the `drained` callback runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "core/cache/backend_cache.h"
#include "core/util/result.h"
#include "core/util/thread_annotations.h"
#include "daemon/connection_limits.h"
#include "daemon/metrics.h"
#include "daemon/model_catalog.h"
#include "daemon/model_runtime.h"
#include "daemon/protocol.h"
#include "daemon/server_options.h"
#include "daemon/worker_pool.h"

namespace car::daemon {

/// What the cache holds per model.
using ModelCache = BackendCache<std::shared_ptr<Backend>>;

/// One request in flight (load, infer): registered when its job is queued, removed when it is answered.
struct Call {
  nlohmann::json id;
  protocol::Op op = protocol::Op::kLoad;
  std::string model;
  std::atomic<bool> cancelled{false};  ///< set on the io thread, read by the worker between tokens
  std::atomic<bool> deadline_passed{false};  ///< io thread: the request's deadline_ms cancelled it
  bool overflowed = false;  ///< io thread: the front cancelled it because its client did not read the stream
};

/// The requests in flight on one client. io thread only.
class CallRegistry {
 public:
  std::shared_ptr<Call> begin(nlohmann::json id, protocol::Op op, std::string model);
  void end(const std::shared_ptr<Call>& call);
  /// Is a request with this id in flight?
  bool id_in_flight(const nlohmann::json& id) const;
  /// Cancel the requests in flight whose id equals `target` (never a null id). Returns how many.
  std::size_t cancel(const nlohmann::json& target);
  /// Cancel every request in flight (disconnect, shutdown past the grace period).
  void cancel_all();
  std::size_t size() const { return calls_.size(); }
  bool empty() const { return calls_.empty(); }

 private:
  std::list<std::shared_ptr<Call>> calls_;
};

/// The final answer to one request, before a front end puts it into its wire format.
struct Reply {
  bool ok = true;
  nlohmann::json result;  ///< ok replies but infer's
  /// An ok `infer` reply's result, typed: each front renders it its own way (the socket's `result`
  /// object, an OpenAI response); `result` is then null.
  std::optional<protocol::InferResult> infer;
  std::string code;       ///< failed replies: a protocol::code
  std::string message;

  static Reply success(nlohmann::json result) { return Reply{true, std::move(result), std::nullopt, {}, {}}; }
  static Reply inferred(protocol::InferResult result) {
    return Reply{true, nullptr, std::move(result), {}, {}};
  }
  static Reply failure(std::string_view code, std::string message) {
    return Reply{false, nullptr, std::nullopt, std::string(code), std::move(message)};
  }
};

/// A connection as the handler sees it; implemented by each front end. Every member runs on the io thread.
class Client {
 public:
  virtual ~Client() = default;
  /// The final answer to the request `id`. `call` is the request in flight it ends (already out of
  /// calls()), or null for a request answered at once. An ok `infer` reply carries Reply::infer.
  virtual void reply(const nlohmann::json& id, const std::shared_ptr<Call>& call, Reply reply) = 0;
  /// A streamed token of `call` (the request asked for `stream`): id, released text and, when the request
  /// asked for logprobs, its logprob entry.
  virtual void token(const std::shared_ptr<Call>& call, const protocol::TokenEvent& event) = 0;
  /// The requests in flight on this client.
  virtual CallRegistry& calls() = 0;
  /// The connection's number, for log lines.
  virtual uint64_t number() const = 0;
};

class RequestHandler {
 public:
  using Clock = std::chrono::steady_clock;

  /// `cache_clock` is the cache's notion of now (idle times, load times); empty: the steady clock.
  RequestHandler(boost::asio::io_context& io, const ServerOptions& options, ModelRuntime& runtime,
                 const ConnectionLimits& connections, CacheClock cache_clock = {});
  ~RequestHandler();
  RequestHandler(const RequestHandler&) = delete;
  RequestHandler& operator=(const RequestHandler&) = delete;

  /// One parsed request from `client`, received at `received`.
  void handle(const std::shared_ptr<Client>& client, protocol::Request request, Clock::time_point received);
  /// An `infer` request a front parsed into its typed form itself (the HTTP front maps an OpenAI request
  /// through protocol::InferBuilder): answered as a socket request with the same fields would be. `infer`
  /// holds the bad_request its fields got when they were refused.
  void handle_infer(const std::shared_ptr<Client>& client, nlohmann::json id,
                    Result<protocol::InferParams> infer, Clock::time_point received);
  /// A request the front end could not parse: answer `error`, carrying `id` when one was recovered.
  void reject(const std::shared_ptr<Client>& client, const nlohmann::json& id, const Error& error,
              Clock::time_point received);

  /// Refuse new requests from now on; `drained` runs (once, on the io thread) when nothing is in flight.
  void begin_shutdown(std::function<void()> drained);
  /// Stop the worker pool (after the io loop ended), save each cached model's state, empty the cache.
  void run_shutdown_hooks();

  /// Apply the cache and log settings that may change live (SIGHUP).
  void apply_live(const LiveSettings& live);
  /// Sweep idle models (the idle timer calls it). Returns how many were evicted.
  std::size_t evict_idle(std::optional<std::chrono::nanoseconds>* next_due = nullptr);
  /// One line for systemd's STATUS=.
  std::string status_line() const;

  /// The Prometheus exposition text (format 0.0.4) of every metric: what `GET /metrics` serves and the
  /// `metrics` op returns (docs/metrics.md). io thread (it reads the in-flight count).
  std::string metrics_text() const;
  /// Where the fronts record what the handler does not see, e.g. metrics().count_http(endpoint, status).
  /// Thread-safe.
  Metrics& metrics() { return metrics_; }

  std::size_t in_flight() const { return in_flight_; }
  bool shutting_down() const { return shutting_down_; }
  ModelCache& cache() { return cache_; }
  /// The model files' header facts (read once per file version); thread-safe.
  ModelCatalog& catalog() const { return catalog_; }
  const ServerOptions& options() const { return options_; }

 private:
  struct Request;
  void dispatch(const std::shared_ptr<Client>& client, Request& req);
  // The checks every request passes before its fields are read: false when `req` was answered (shutting
  // down, or its id already in flight).
  bool admit(const std::shared_ptr<Client>& client, const Request& req);
  void dispatch_infer(const std::shared_ptr<Client>& client, Request& req,
                      Result<protocol::InferParams> infer);
  // Cut the keep-alive, resolve the model file and queue the load/infer job.
  void resolve_and_start(const std::shared_ptr<Client>& client, Request& req);
  void answer(const std::shared_ptr<Client>& client, const Request& req, Reply reply,
              std::string_view outcome);
  void start_job(const std::shared_ptr<Client>& client, Request& req);
  // Run on a worker. Return the final reply; run_infer posts token events itself.
  Reply run_load(const std::shared_ptr<Call>& call, const Request& req, std::string& outcome);
  // Ends a load/infer request from any thread (posts the reply to the io thread).
  using Finish = std::function<void(Reply reply, std::string outcome)>;
  // A reply when the request ended here (an error before generating); nullopt when `finish` was or will be
  // called with it (the generation ran here, or runs on the model's scheduler).
  std::optional<Reply> run_infer(const std::shared_ptr<Client>& client, const std::shared_ptr<Call>& call,
                                 const std::shared_ptr<Request>& req, std::string& outcome, const Finish& finish);
  // Worker side: get the model's lease (cache hit or load). On failure, `error` is set.
  std::optional<ModelCache::Lease> acquire_model(const Request& req, LoadInfo& info, Reply& error,
                                                 std::string& outcome);
  // Drop `id` from the cache if `handle` is still what it holds there (its file changed); logs `why` at info
  // when it did. Another request that saw the same change and already dropped (or reloaded) it wins.
  void drop_stale(const std::string& id, const ModelCache::Handle& handle, const std::string& why);
  /// After a request asking for `keep_alive: 0`: evict its model now unless another request uses it or it
  /// is pinned. Returns whether it was evicted. Worker side.
  bool unload_if_asked(const Request& req);
  /// The idle TTL in seconds that applies to the request's model after it (null: never idle-evicted).
  nlohmann::json keep_alive_json(const Request& req) const;
  void job_done();
  nlohmann::json health_json() const;
  nlohmann::json stats_json() const;
  /// A model's sequences for `stats` and `list` (docs/protocol.md): its scheduler's figures.
  static nlohmann::json sequences_json(const engine::SchedulerStats& s);
  nlohmann::json list_json(std::string& error) const;
  /// Every kStateSavePeriod (checked by evict_idle, which the idle timer calls): save each cached model's
  /// state (the expert usage sidecar) on a worker, skipping models serving a request. io thread.
  void save_states_if_due();
  /// Save one model's state unless a request holds it. Any thread.
  static void save_unless_busy(const std::string& key, CachedBackend<std::shared_ptr<Backend>>& entry);
  static constexpr std::chrono::seconds kStateSavePeriod{60};

  boost::asio::io_context& io_;
  const ServerOptions& options_;
  ModelRuntime& runtime_;
  const ConnectionLimits& connections_;
  Metrics metrics_;  // before cache_: the cache's eviction listener records into it
  ModelCache cache_;
  WorkerPool pool_;
  // The model files' header facts for `list` (list_json is const; the catalog is its own lock).
  mutable ModelCatalog catalog_;
  const Clock::time_point started_ = Clock::now();

  // io thread only:
  std::size_t in_flight_ = 0;  // jobs submitted and not yet reported
  bool shutting_down_ = false;
  std::function<void()> drained_;
  uint64_t requests_ = 0;
  uint64_t busy_rejections_ = 0;
  Clock::time_point last_state_save_ = Clock::now();

  // What the engine reported about a model right after loading it: whether it streams experts (its bytes
  // are the cache entry's charge). stats/load read this instead of asking a model that may be busy.
  struct ModelFacts {
    bool streams_experts = false;
    int64_t context_length = 0;
  };
  std::optional<ModelFacts> facts(const std::string& id) const;
  mutable Mutex facts_mutex_;
  std::unordered_map<std::string, ModelFacts> facts_ CAR_GUARDED_BY(facts_mutex_);
};

}  // namespace car::daemon
