// Server: car-inferenced's top-level object. Owns the io_context and everything that runs on its one
// thread - the NDJSON socket's Listener, the signalfd, the idle-eviction, watchdog and grace timers, the
// ConnectionManager (the NDJSON sessions and their limits) and the RequestHandler (dispatch, cache, worker
// pool). Heavy work never runs on the io thread.
//
// Life: open() binds the socket (0660, optional group) or adopts the socket-activation fd; run() serves
// until SIGTERM/SIGINT (or request_stop()), then stops accepting, lets in-flight work finish for the
// grace period, cancels what is left, closes sessions, runs the shutdown hooks and removes the socket
// file it created (open() removes it too when it fails after binding). SIGHUP re-reads the live settings.
// run() returns 0 on a clean shutdown.
//
// Connections: admitted by the Listener both fronts share (daemon/listener.h): a peer outside the
// allow-list is dropped; one past CAR_INFERENCE_MAX_CONNECTIONS (or its uid's share; both fronts count) gets
// one `too_many_connections` line and is closed (ConnectionLimits). The idle sweep gives
// freed heap memory back to the system after connections closed (malloc_trim).
//
// Thread safety: open() and run() from one thread; request_stop() from any thread.
#pragma once

#include <memory>
#include <optional>

#include <sys/signalfd.h>

#include <boost/asio.hpp>

#include "core/util/result.h"
#include "daemon/connection_manager.h"
#include "daemon/http/http_server.h"
#include "daemon/listener.h"
#include "daemon/model_runtime.h"
#include "daemon/request_handler.h"
#include "daemon/server_options.h"
#include "daemon/timer_clock.h"

namespace car::daemon {

class Server {
 public:
  /// `cache_clock`: the model cache's clock (tests advance a fake one); empty: the steady clock.
  /// `timer_clock`: the clock of the idle sweep, the shutdown grace and the sessions' line timers (tests
  /// pass one that jumps); it must outlive the server.
  Server(ServerOptions options, ModelRuntime& runtime, CacheClock cache_clock = {},
         const TimerClock& timer_clock = steady_timer_clock());
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Bind and listen (or adopt options.listen_fd). Errors name the socket path and the cause.
  Result<void> open();
  /// Serve until shut down. Returns the process exit code (0 = clean).
  int run();
  /// Begin a graceful shutdown as SIGTERM would (thread-safe).
  void request_stop();

  /// Block SIGTERM, SIGINT and SIGHUP in the calling thread, so that every thread it starts afterwards
  /// (workers, schedulers, compute and reader pools) inherits the mask. A process that lets the server
  /// handle its signals (ServerOptions::handle_signals) calls it first thing in main(), before any thread
  /// exists: the server reads the signals from a signalfd on its io thread, and a thread that did not
  /// block them would take them with the default action instead (the process dies). open() blocks them
  /// in its own thread as well.
  static void block_signals_in_new_threads();

  const ServerOptions& options() const { return options_; }
  /// The HTTP front's TCP port (after open(); 0 when off or on a Unix socket).
  uint16_t http_port() const { return http_ ? http_->port() : 0; }

 private:
  Result<void> open_ndjson();
  /// Start a session for a connection the listener admitted.
  void admit(Listener::Socket socket, const Listener::Peer& peer);
  /// Arm the idle sweep: its usual period, or sooner when a model's keep-alive ends in `next_due`.
  void arm_idle_timer(std::optional<std::chrono::nanoseconds> next_due = std::nullopt);
  void arm_watchdog(std::chrono::microseconds period);
  void register_signals();  // SIGTERM, SIGINT, SIGHUP into signal_fd_ (once; before the socket is bound)
  void wait_signals();
  void begin_shutdown(const char* why);
  /// Log a warning when the models directory is missing or holds no model.
  void warn_about_models_dir() const;
  void finish_shutdown();
  void update_status();
  void trim_after_closes();

  ServerOptions options_;
  ModelRuntime& runtime_;
  // Declared before everything that uses its executor. One thread runs it (hint 1): handlers posted from
  // that thread skip the scheduler's lock and wake-ups; workers still post to it safely.
  boost::asio::io_context io_{1};
  // SIGTERM/SIGINT/SIGHUP, read from a signalfd (blocked in every thread): no handler runs in signal
  // context, and no thread's system call is interrupted by them.
  boost::asio::posix::stream_descriptor signal_fd_;
  signalfd_siginfo signal_info_{};
  bool signals_registered_ = false;  // register_signals() ran
  const TimerClock& timer_clock_;
  Timer idle_timer_;
  boost::asio::steady_timer watchdog_timer_;
  Timer grace_timer_;  // the shutdown grace, then the flush before the forced close
  ConnectionManager connections_;  // before handler_, which reads its counts for `stats`
  Listener listener_;              // the NDJSON socket; admits against connections_.limits()
  std::unique_ptr<RequestHandler> handler_;
  std::unique_ptr<http::HttpFront> http_;  // the OpenAI-compatible HTTP front, when configured
  bool stopping_ = false;
  bool finished_ = false;
};

}  // namespace car::daemon
