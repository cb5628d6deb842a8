// Service: what the daemon does with a request line - parse it, answer the quick ops (health, stats,
// list, invalidate, cancel) on the io thread, and run load/infer as jobs on the worker pool whose results
// and streamed tokens are posted back to the io thread. Owns the backend cache, the worker pool and the
// set of open sessions; borrows the io_context and the ModelRuntime.
//
// Threading: every member function runs on the io thread, except what the jobs do on workers (the cache,
// the runtime and `sizes_` are the only state they touch; both are thread-safe). Shutdown:
// begin_shutdown() makes new requests answer `shutting_down`; cancel_in_flight() cancels the rest; once
// nothing is in flight, the `drained` callback runs (the server then closes sessions and stops).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "core/cache/backend_cache.h"
#include "daemon/connection_limits.h"
#include "daemon/model_runtime.h"
#include "daemon/server_options.h"
#include "daemon/session.h"
#include "daemon/worker_pool.h"

namespace car::daemon {

/// What the cache holds per model.
using ModelCache = BackendCache<std::shared_ptr<Backend>>;

class Service {
 public:
  Service(boost::asio::io_context& io, const ServerOptions& options, ModelRuntime& runtime);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  /// One framed request line from `session`.
  void handle_line(const std::shared_ptr<Session>& session, std::string_view line);

  void session_opened(const std::shared_ptr<Session>& session);
  void session_closed(const std::shared_ptr<Session>& session);

  /// Refuse new requests from now on; `drained` runs (once, on the io thread) when nothing is in flight.
  void begin_shutdown(std::function<void()> drained);
  /// Cancel every request in flight on every session (the grace period is over).
  void cancel_in_flight();
  /// Close every session: now, or (graceful) once its queued replies are written; `all_closed` runs on
  /// the io thread when the last session is gone (at once when there is none).
  void close_sessions(bool graceful, std::function<void()> all_closed);
  /// Stop the worker pool (after the io loop ended), save each cached model's state, empty the cache.
  void run_shutdown_hooks();

  /// Apply settings that may change live (SIGHUP).
  void apply_live(const LiveSettings& live);
  /// Sweep idle models (the idle timer calls it). Returns how many were evicted.
  std::size_t evict_idle();
  /// One line for systemd's STATUS=.
  std::string status_line() const;

  std::size_t in_flight() const { return in_flight_; }
  bool shutting_down() const { return shutting_down_; }
  ModelCache& cache() { return cache_; }
  ConnectionLimits& connections() { return connections_; }

 private:
  struct Request;
  void dispatch(const std::shared_ptr<Session>& session, Request& req);
  void reply_now(const std::shared_ptr<Session>& session, Request& req, const std::string& line,
                 const std::string& outcome);
  void start_job(const std::shared_ptr<Session>& session, Request& req);
  // Runs on a worker. Returns the final line; posts token events itself.
  std::string run_load(const std::shared_ptr<Session>& session, const std::shared_ptr<Pending>& pending,
                       const Request& req, std::string& outcome);
  std::string run_infer(const std::shared_ptr<Session>& session, const std::shared_ptr<Pending>& pending,
                        const Request& req, std::string& outcome);
  // Worker side: get the model's lease (cache hit or load). On failure, `error_line` is set.
  std::optional<ModelCache::Lease> acquire_model(const Request& req, LoadInfo& info, std::string& error_line,
                                                 std::string& outcome);
  // Drop `id` from the cache if `handle` is still what it holds there (its file changed); logs `why` at info
  // when it did. Another request that saw the same change and already dropped (or reloaded) it wins.
  void drop_stale(const std::string& id, const ModelCache::Handle& handle, const std::string& why);
  void job_done();
  nlohmann::json stats_json() const;
  /// Every kStateSavePeriod (checked by evict_idle, which the idle timer calls): save each cached model's
  /// state (the expert usage sidecar) on a worker, skipping models serving a request. io thread.
  void save_states_if_due();
  /// Save one model's state unless a request holds it. Any thread.
  static void save_unless_busy(const std::string& key, CachedBackend<std::shared_ptr<Backend>>& entry);
  static constexpr std::chrono::seconds kStateSavePeriod{60};
  nlohmann::json list_json(std::string& error) const;

  boost::asio::io_context& io_;
  const ServerOptions& options_;
  ModelRuntime& runtime_;
  ModelCache cache_;
  WorkerPool pool_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  // io thread only:
  ConnectionLimits connections_;  // before sessions_: sessions report to it until they are destroyed
  std::unordered_set<std::shared_ptr<Session>> sessions_;
  std::size_t in_flight_ = 0;        // jobs submitted and not yet reported
  bool shutting_down_ = false;
  std::function<void()> drained_;
  std::function<void()> all_closed_;
  uint64_t requests_ = 0;
  uint64_t busy_rejections_ = 0;
  std::chrono::steady_clock::time_point last_state_save_ = std::chrono::steady_clock::now();

  // What the engine reported about a model right after loading it: whether it streams experts (its bytes
  // are the cache entry's charge). stats/load read this instead of asking a model that may be busy.
  struct ModelFacts {
    bool streams_experts = false;
  };
  std::optional<ModelFacts> facts(const std::string& id) const;
  mutable std::mutex facts_mutex_;
  std::unordered_map<std::string, ModelFacts> facts_;  ///< GUARDED_BY(facts_mutex_)
};

}  // namespace car::daemon
