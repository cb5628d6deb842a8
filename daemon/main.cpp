// car-inferenced: the daemon. Resolves Settings (defaults < config file < environment < flags), sets up
// logging to stderr (journald keeps it under systemd), adopts a socket-activation fd if systemd passed
// one, and runs the Server until SIGTERM/SIGINT. Exit codes: 0 clean shutdown, 1 runtime failure,
// 2 bad configuration.
#include <sys/resource.h>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "car_version.h"
#include "config/settings.h"
#include "core/tensor/kernels.h"
#include "core/util/error_codes.h"
#include "core/util/fault_guard.h"
#include "daemon/http/http_server.h"
#include "daemon/listener.h"
#include "daemon/model_resolver.h"
#include "daemon/model_runtime.h"
#include "daemon/server.h"
#include "daemon/systemd_notify.h"

namespace {

using car::daemon::LiveSettings;

LiveSettings live_of(const car::config::Settings& s) {
  LiveSettings live;
  live.cache_budget_bytes = s.cache_budget_bytes();
  live.idle_ttl = std::chrono::seconds(static_cast<std::chrono::seconds::rep>(s.idle_secs));
  live.max_keep_alive = std::chrono::seconds(static_cast<std::chrono::seconds::rep>(s.max_keep_alive_secs));
  live.pinned_models = s.pinned_models;
  live.log_level = std::string(car::config::to_string(s.log_level));
  live.max_connections = s.max_connections;
  live.max_connections_per_uid = s.max_connections_per_uid;
  live.line_timeout = std::chrono::seconds(static_cast<std::chrono::seconds::rep>(s.line_timeout_secs));
  live.max_pending_output_bytes =
      static_cast<std::size_t>(s.max_pending_output_mb * car::config::Settings::kMiB);
  return live;
}

/// CAR_INFERENCE_PIN_MODELS holds model ids: each must pass the same rule as an id on the socket.
car::Result<void> check_pinned(const car::config::Settings& s) {
  for (const auto& id : s.pinned_models) {
    if (auto ok = car::daemon::check_model_id(id); !ok) {
      return car::make_error(car::errc::kInvalidSetting, "CAR_INFERENCE_PIN_MODELS: " + ok.error().message);
    }
  }
  return {};
}

void setup_logging(const car::config::Settings& s) {
  auto logger = spdlog::stderr_logger_mt("car-inferenced");
  // journald timestamps lines itself; a terminal gets our own.
  const char* journal = std::getenv("JOURNAL_STREAM");
  logger->set_pattern(journal != nullptr && *journal != '\0' ? "<%^%l%$> %v" : "%Y-%m-%d %H:%M:%S.%e [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(std::string(car::config::to_string(s.log_level))));
  spdlog::flush_on(spdlog::level::info);
}

/// Raise the soft open-file limit to the hard one (systemd's default soft limit is 1024; LimitNOFILE= in the
/// unit sets both). The connection cap is then fitted below it (ConnectionLimits).
void raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("cannot raise the open-file limit from {}: {}", before, std::strerror(errno));
  } else {
    spdlog::debug("open-file limit raised from {} to {}", before, rl.rlim_cur);
  }
}

/// `car-inferenced --version`: version, the git commit built, and the kernels' instruction set.
void print_version() {
  std::printf("car-inferenced %s\ncommit %s\n", CAR_VERSION, CAR_GIT_COMMIT);
  std::printf("isa %s\n", std::string(car::tensor::isa_name(car::tensor::current_isa())).c_str());
}

/// CAR_INFERENCE_ISA: the kernels every load and request uses, chosen once before any engine work (the
/// kernels cap the choice at what the CPU supports; core reads no environment itself).
void apply_isa(car::config::Isa isa) {
  using car::config::Isa;
  namespace tensor = car::tensor;
  if (isa != Isa::automatic) {
    tensor::Isa chosen{};
    const bool known = tensor::parse_isa(car::config::to_string(isa), &chosen);
    CAR_CHECK(known);  // the settings accept exactly the kernels' names (tests/config)
    tensor::set_isa(chosen);
  }
  spdlog::info("kernels: {} (CAR_INFERENCE_ISA={}, the CPU supports {})", tensor::isa_name(tensor::current_isa()),
               car::config::to_string(isa), tensor::isa_name(tensor::detect_isa()));
}

}  // namespace

int main(int argc, char** argv) {
  // Before the settings: --version needs no configuration and must work with a broken environment file.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      print_version();
      return 0;
    }
  }
  // Before any thread starts, so every thread inherits the mask: the server reads SIGTERM/SIGINT/SIGHUP
  // from a signalfd on its io thread (Server::block_signals_in_new_threads).
  car::daemon::Server::block_signals_in_new_threads();
  auto settings = car::config::load_settings(argc, argv, car::config::current_environment());
  if (!settings) {
    if (settings.error().code == car::errc::kHelp) {
      std::fputs(settings.error().message.c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "car-inferenced: %s\n", settings.error().message.c_str());
    return 2;
  }
  if (auto pins = check_pinned(*settings); !pins) {
    std::fprintf(stderr, "car-inferenced: %s: %s\n", pins.error().code.c_str(), pins.error().message.c_str());
    return 2;
  }
  setup_logging(*settings);
  spdlog::info("car-inferenced {} (commit {})", CAR_VERSION, CAR_GIT_COMMIT);
  // Process-wide, so the owner of main installs it: a model file truncated or rewritten in place while
  // mapped fails the requests using it (io_error) instead of killing the daemon with SIGBUS.
  if (auto guard = car::fault_guard::install(); !guard) {
    spdlog::warn("{}: a model file truncated while in use will crash the daemon", guard.error().message);
  }
  for (const auto& w : settings->warnings) spdlog::warn("{}", w);
  raise_fd_limit();
  apply_isa(settings->isa);
  spdlog::debug("settings:\n{}", settings->describe());
  if (settings->cache_mb_origin != "set") {
    spdlog::info("model cache budget {} MiB: {} (set CAR_INFERENCE_MODEL_CACHE_MB to choose)",
                 settings->cache_mb, settings->cache_mb_origin);
  }

  auto listen_fds = car::daemon::systemd::take_listen_fds();
  if (!listen_fds) {
    spdlog::critical("{}", listen_fds.error().message);
    return 2;
  }

  car::daemon::ServerOptions options;
  options.socket_path = settings->socket_path;
  options.listen_fd = listen_fds->socket;
  // The OpenAI-compatible HTTP front (docs/http.md): CAR_INFERENCE_HTTP or a socket named http.
  options.http.address = settings->http;
  options.http.listen_fd = listen_fds->http;
  if (!settings->http_api_key_file.empty()) {
    auto key = car::daemon::http::read_api_key(settings->http_api_key_file);
    if (!key) {
      spdlog::critical("{}", key.error().message);
      return 2;
    }
    options.http.api_key = std::move(*key);
  }
  // A configuration the HTTP front would refuse is a configuration error (exit 2), found before anything
  // is bound: a non-loopback address (set, or passed by systemd) without an API key.
  if (options.http.address || options.http.listen_fd) {
    auto address = options.http.listen_fd ? car::daemon::listening_address(*options.http.listen_fd)
                                           : car::Result<car::config::HttpAddress>(*options.http.address);
    if (!address) {
      spdlog::critical("{}", address.error().message);
      return 2;
    }
    if (!address->loopback() && options.http.api_key.empty()) {
      spdlog::critical("refusing to serve HTTP on {}, which is not a loopback address, without an API key: set "
                       "CAR_INFERENCE_HTTP_API_KEY_FILE, or listen on 127.0.0.1, [::1] or a unix: path",
                       address->to_string());
      return 2;
    }
  }
  options.models_dir = settings->models_dir;
  options.build = {CAR_VERSION, CAR_GIT_COMMIT, std::string(car::tensor::isa_name(car::tensor::current_isa()))};
  options.state_dir = settings->state_dir;
  options.live = live_of(*settings);
  options.socket_group = settings->socket_group;
  options.allowed_uids = settings->allow_uids;
  options.allowed_gids = settings->allow_gids;
  options.workers = settings->workers;
  options.queue_capacity = settings->queue_depth;
  options.shutdown_grace = std::chrono::seconds(static_cast<std::chrono::seconds::rep>(settings->shutdown_grace_secs));
  auto current = std::make_shared<car::config::Settings>(*settings);
  // What runs: the settings that are not live keep their start-up values until a restart.
  auto running = std::make_shared<const car::config::Settings>(*settings);
  options.reload = [current, running, argc, argv]() -> car::Result<LiveSettings> {
    auto next = car::config::reload_settings(*current, argc, argv, car::config::current_environment());
    if (!next) return next.error();
    if (auto pins = check_pinned(*next); !pins) return pins.error();
    auto plan = car::config::plan_reload(*current, *next, running.get());
    for (const auto& name : plan.needs_restart) spdlog::warn("SIGHUP: {} changed; it takes effect on restart", name);
    *current = *next;
    return live_of(*next);
  };

  car::daemon::RuntimeOptions runtime_options;
  runtime_options.threads = static_cast<int>(settings->threads);
  runtime_options.stream_experts = settings->stream_experts;
  runtime_options.expert_ram_gb = settings->expert_ram_gb.value_or(0.0);
  runtime_options.state_dir = settings->state_dir.string();
  runtime_options.context_length = static_cast<int>(settings->context);
  // The default KV pool (min(parallel, 4) full contexts) takes at most a quarter of the memory-derived cache
  // budget (MemTotal less the reserve), whatever CAR_INFERENCE_MODEL_CACHE_MB says: a small budget refuses a
  // model rather than shrinking its context. CAR_INFERENCE_KV_POOL_MB sets the pool (and so the default context).
  const uint64_t budget =
      car::config::default_cache_mb(car::config::SystemFacts::current().mem_total_bytes) * car::config::kMiB;
  runtime_options.context_memory_bytes = budget / 4;
  runtime_options.kv_pool_bytes = settings->kv_pool_mb * car::config::kMiB;
  runtime_options.parallel = static_cast<int>(settings->parallel);
  runtime_options.step_tokens = settings->step_tokens;
  runtime_options.max_queued = static_cast<int>(settings->queue_depth);
  auto runtime = car::daemon::make_default_runtime(runtime_options);
  if (!runtime->available()) {
    spdlog::warn("built without the inference engine: load and infer will answer load_failed");
  }

  car::daemon::Server server(std::move(options), *runtime);
  if (auto ok = server.open(); !ok) {
    spdlog::critical("{}", ok.error().message);
    return 1;
  }
  return server.run();
}
