#include "daemon/server.h"

#include <malloc.h>
#include <pthread.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "core/util/error_codes.h"
#include "daemon/model_resolver.h"
#include "daemon/protocol.h"
#include "daemon/session.h"
#include "daemon/systemd_notify.h"

namespace car::daemon {

namespace asio = boost::asio;
using namespace std::chrono_literals;

Server::Server(ServerOptions options, ModelRuntime& runtime, CacheClock cache_clock,
               const TimerClock& timer_clock)
    : options_(std::move(options)),
      runtime_(runtime),
      signal_fd_(io_),
      timer_clock_(timer_clock),
      idle_timer_(io_.get_executor(), timer_clock),
      watchdog_timer_(io_),
      grace_timer_(io_.get_executor(), timer_clock),
      connections_(options_.live),
      listener_(io_, connections_.limits(),
                Listener::Options{.log_prefix = "conn",
                                  .first_number = 1,
                                  .allowed_uids = options_.allowed_uids,
                                  .allowed_gids = options_.allowed_gids,
                                  .refusal =
                                      [](const std::string& why) {
                                        return protocol::error_line(
                                                   nullptr, protocol::code::kTooManyConnections, why) +
                                               "\n";
                                      }}),
      handler_(std::make_unique<RequestHandler>(io_, options_, runtime_, connections_.limits(),
                                                std::move(cache_clock))) {}

Server::~Server() {
  http_.reset();
  handler_.reset();  // joins the workers before the io_context goes away
}

Result<void> Server::open() {
  // Before listening: a supervisor (or test) that sees the socket answer may send SIGTERM at once. The
  // signals are blocked (main() blocked them before any thread started), so one that comes before run()
  // reads the signalfd stays pending, and is handled then.
  if (options_.handle_signals) register_signals();
  // Before listening: once a client can connect, the warning is already in the log.
  warn_about_models_dir();
  if (auto ok = open_ndjson(); !ok) return ok;
  if (!options_.http.address && !options_.http.listen_fd) return {};
  // The HTTP front shares the socket's models, allow-list and limits.
  http::HttpOptions h = options_.http;
  h.models_dir = options_.models_dir;
  h.socket_group = options_.socket_group;
  h.allowed_uids = options_.allowed_uids;
  h.allowed_gids = options_.allowed_gids;
  h.max_body_bytes = options_.max_line_bytes;
  // GET /metrics: the Prometheus page (io thread, as metrics_text() requires).
  if (!h.metrics) h.metrics = [this] { return handler_->metrics_text(); };
  http_ = std::make_unique<http::HttpFront>(io_, *handler_, connections_.limits(), std::move(h));
  if (auto ok = http_->open(); !ok) {
    http_.reset();
    listener_.remove_socket_file();
    return ok;
  }
  return {};
}

Result<void> Server::open_ndjson() {
  if (options_.listen_fd) {
    if (auto ok = listener_.adopt(*options_.listen_fd, "the socket"); !ok) return ok;
    if (!listener_.unix_socket()) {
      listener_.close();
      return make_error(errc::kListenFailed, "the socket passed by systemd is not a Unix socket");
    }
    spdlog::info("listening on the socket passed by systemd (fd {})", *options_.listen_fd);
    return {};
  }
  const std::string path = options_.socket_path.string();
  if (path.empty()) return make_error(errc::kListenFailed, "no socket path configured (CAR_INFERENCE_SOCKET)");
  if (auto ok = listener_.listen_unix(path, options_.socket_group, "the socket"); !ok) return ok;
  spdlog::info("listening on {} (mode 0660{}{})", path, options_.socket_group.empty() ? "" : ", group ",
               options_.socket_group);
  return {};
}

void Server::warn_about_models_dir() const {
  // Not fatal (models may be added later), but the first request would only say not_found.
  std::error_code ec;
  const auto& dir = options_.models_dir;
  if (!std::filesystem::is_directory(dir, ec)) {
    spdlog::warn(
        "the models directory {} does not exist (or is not a directory): every model id will be "
        "not_found until it is created (CAR_INFERENCE_MODELS_DIR)",
        dir.string());
    return;
  }
  auto models = list_models(dir);
  if (!models) {
    spdlog::warn("{}", models.error().message);
  } else if (models->empty()) {
    spdlog::warn("the models directory {} holds no models (<id>.gguf files) yet", dir.string());
  }
}

namespace {

sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

void Server::block_signals_in_new_threads() {
  const sigset_t set = shutdown_signals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int Server::run() {
  if (options_.handle_signals) {
    register_signals();  // a no-op after open()
    wait_signals();
  }
  listener_.start(
      [this](Listener::Socket socket, const Listener::Peer& peer) { admit(std::move(socket), peer); });
  if (http_) http_->start();
  arm_idle_timer();
  if (auto period = systemd::watchdog_interval()) arm_watchdog(*period);
  spdlog::info(
      "car-inferenced ready: models in {}, engine: {}, cache budget {} MiB, idle TTL {} s, {} worker(s)",
      options_.models_dir.string(), runtime_.name(), options_.live.cache_budget_bytes >> 20,
      options_.live.idle_ttl.count(), options_.workers);
  systemd::notify_ready();
  update_status();
  int code = 0;
  try {
    io_.run();
  } catch (const std::exception& e) {
    spdlog::critical("io loop failed: {}", e.what());
    code = 1;
  }
  handler_->run_shutdown_hooks();
  listener_.remove_socket_file();
  spdlog::info("car-inferenced stopped");
  return code;
}

void Server::request_stop() {
  asio::post(io_, [this] { begin_shutdown("stop requested"); });
}

void Server::admit(Listener::Socket socket, const Listener::Peer& peer) {
  // A Unix socket: the listener read the peer's credentials.
  connections_.start(std::make_shared<Session>(std::move(socket), *handler_, connections_, *peer.credentials,
                                               peer.number, options_.max_line_bytes, timer_clock_));
}

void Server::arm_idle_timer(std::optional<std::chrono::nanoseconds> next_due) {
  auto ttl = std::chrono::duration_cast<std::chrono::milliseconds>(options_.live.idle_ttl);
  // Sweep four times per TTL, so a model leaves within 1.25 TTL of its last use; at most every 5 s
  // otherwise (the sweep also refreshes systemd's STATUS=). Sooner when a model's own keep-alive ends
  // first (next_due, from the last sweep).
  std::chrono::milliseconds period =
      ttl.count() > 0 ? std::clamp(ttl / 4, std::chrono::milliseconds(50), std::chrono::milliseconds(5000))
                      : std::chrono::milliseconds(5000);
  if (next_due) {
    period = std::min(period, std::max(std::chrono::duration_cast<std::chrono::milliseconds>(*next_due) +
                                           std::chrono::milliseconds(1),
                                       std::chrono::milliseconds(50)));
  }
  idle_timer_.expires_after(period);
  idle_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || stopping_) return;
    std::optional<std::chrono::nanoseconds> due;
    if (handler_->evict_idle(&due) > 0) spdlog::debug("after idle sweep: {}", handler_->status_line());
    trim_after_closes();
    update_status();
    arm_idle_timer(due);
  });
}

void Server::arm_watchdog(std::chrono::microseconds period) {
  systemd::notify_watchdog();
  watchdog_timer_.expires_after(period / 2);
  watchdog_timer_.async_wait([this, period](boost::system::error_code ec) {
    if (ec || finished_) return;
    arm_watchdog(period);
  });
}

void Server::register_signals() {
  if (signals_registered_) return;
  signals_registered_ = true;
  // A signalfd rather than a handler (asio's signal_set): the signals stay blocked in every thread, the
  // kernel queues them, and the io thread reads them like any other event. With a handler, a signal lands
  // on whichever thread does not block it, interrupts its system call, and (under ThreadSanitizer, which
  // defers a handler until the thread next enters its runtime) a SIGTERM sent during start-up was lost.
  block_signals_in_new_threads();
  const sigset_t set = shutdown_signals();
  const int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    // Not expected on Linux; without it the daemon still serves, and SIGTERM (blocked) would be queued
    // unread: restore the default actions so that it still stops the process.
    spdlog::error("signalfd: {}; SIGTERM, SIGINT and SIGHUP take their default actions",
                  std::strerror(errno));
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    return;
  }
  signal_fd_.assign(fd);
}

void Server::wait_signals() {
  if (!signal_fd_.is_open()) return;
  signal_fd_.async_read_some(asio::buffer(&signal_info_, sizeof signal_info_),
                             [this](boost::system::error_code ec, std::size_t n) {
    if (ec) return;
    if (n != sizeof signal_info_) {  // the kernel reads whole records; anything else is not a signal
      if (!finished_) wait_signals();
      return;
    }
    const int signo = static_cast<int>(signal_info_.ssi_signo);
    if (signo == SIGHUP) {
      if (options_.reload) {
        auto live = options_.reload();
        if (live) {
          options_.live = *live;
          handler_->apply_live(*live);
          connections_.apply_live(*live);
          idle_timer_.cancel();
          if (!stopping_) arm_idle_timer();
        } else {
          spdlog::error("SIGHUP: settings not reloaded: {}", live.error().message);
        }
      } else {
        spdlog::info("SIGHUP: nothing to reload");
      }
      update_status();
    } else {
      begin_shutdown(signo == SIGTERM ? "SIGTERM" : "SIGINT");
    }
    if (!finished_) wait_signals();
  });
}

void Server::begin_shutdown(const char* why) {
  if (stopping_) return;
  stopping_ = true;
  systemd::notify_stopping();
  listener_.close();
  // The HTTP front keeps accepting while requests drain, so a load balancer's /ready probe gets its 503
  // (and new work a 503 shutting_down) instead of a refused connection; it closes in finish_shutdown.
  idle_timer_.cancel();
  spdlog::info("{}: shutting down ({} request(s) in flight, grace {} ms)", why, handler_->in_flight(),
               options_.shutdown_grace.count());
  update_status();
  grace_timer_.expires_after(options_.shutdown_grace);
  grace_timer_.async_wait([this](boost::system::error_code wait_ec) {
    if (wait_ec || finished_) return;
    spdlog::warn("grace period over: cancelling {} request(s)", handler_->in_flight());
    connections_.cancel_all();
    if (http_) http_->cancel_all();
  });
  handler_->begin_shutdown([this] { finish_shutdown(); });
}

void Server::finish_shutdown() {
  finished_ = true;
  grace_timer_.cancel();
  idle_timer_.cancel();
  watchdog_timer_.cancel();
  if (signal_fd_.is_open()) {
    boost::system::error_code ignored;
    signal_fd_.cancel(ignored);
  }
  // Flush what is queued to each client, but do not wait for a client that stopped reading.
  grace_timer_.expires_after(1s);
  grace_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    connections_.close_all(/*graceful=*/false, nullptr);
    if (http_) http_->close_all(/*graceful=*/false);
  });
  if (http_) {
    http_->stop_accepting();
    http_->close_all(/*graceful=*/true);
  }
  connections_.close_all(/*graceful=*/true, [this] { grace_timer_.cancel(); });
}

void Server::trim_after_closes() {
  // glibc keeps freed heap memory in its arenas. Connections that closed since the last sweep freed their
  // sessions, coroutine frames and reply queues: give that memory back to the system.
  if (connections_.limits().take_closed() > 0) ::malloc_trim(0);
}

void Server::update_status() {
  systemd::notify_status(handler_->status_line());
}

}  // namespace car::daemon
