// RequestHandler::metrics_text(): the pushed metrics (daemon/metrics.h) plus the state read from its owners
// at render time - the requests in flight and queued, the backend cache, the connections, and each cached
// MoE model's expert cache. docs/metrics.md lists every family.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "daemon/request_handler.h"

namespace car::daemon {

namespace {

/// A value from a JSON object of counters, 0 when absent.
double number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

/// The process_* families every Prometheus client library exports (their names and meanings), read from
/// getrusage, /proc/self and the file limit at render time.
void process_metrics(metrics::Writer& w, std::chrono::system_clock::time_point started) {
  const auto gauge = [&](const char* name, const char* help, double value) {
    w.family(name, help, "gauge");
    w.sample(name, value);
  };
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) {
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
    w.family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter");
    w.sample("process_cpu_seconds_total", seconds(ru.ru_utime) + seconds(ru.ru_stime));
  }
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) {
      gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", static_cast<double>(size) * page);
      gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
            static_cast<double>(resident) * page);
    }
    std::fclose(f);
  }
  if (DIR* d = ::opendir("/proc/self/fd")) {
    double open = 0;
    while (const dirent* e = ::readdir(d)) open += e->d_name[0] != '.';
    ::closedir(d);
    gauge("process_open_fds", "Number of open file descriptors.", open - 1);  // less opendir's own
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    gauge("process_max_fds", "Maximum number of open file descriptors.", static_cast<double>(rl.rlim_cur));
  }
  if (FILE* f = std::fopen("/proc/self/stat", "r")) {
    // Field 20 is num_threads; the command name (field 2) may hold spaces, so count from its closing ')'.
    char buf[1024];
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    if (const char* p = std::strrchr(buf, ')')) {
      long threads = 0;
      if (std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %ld",
                      &threads) == 1) {
        gauge("process_threads", "Number of OS threads in the process.", static_cast<double>(threads));
      }
    }
  }
  gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
        std::chrono::duration<double>(started.time_since_epoch()).count());
}

}  // namespace

std::string RequestHandler::metrics_text() const {
  metrics::Writer w;
  metrics_.render(w);

  const auto gauge = [&](const char* name, const char* help, double value) {
    w.family(name, help, "gauge");
    w.sample(name, value);
  };
  const auto counter = [&](const char* name, const char* help, double value) {
    w.family(name, help, "counter");
    w.sample(name, value);
  };

  // The cached models' schedulers: their sequences running and requests waiting.
  const CacheStats s = cache_.stats();
  struct Sequences {
    std::string model;
    engine::SchedulerStats stats;
  };
  std::vector<Sequences> sequences;
  double running = 0, waiting = 0;
  for (const auto& item : s.items) {
    if (auto handle = cache_.peek(item.key)) {
      if (auto st = handle->backend()->scheduler_stats()) {
        running += st->active;
        waiting += st->queued;
        sequences.push_back({item.key, *st});
      }
    }
  }

  // Requests. A request runs on a worker (a load, a chat rendering, a runtime without a scheduler) or as a
  // sequence of its model; it waits for a worker or in its model's queue.
  gauge("car_inference_requests_in_flight", "Load and infer requests accepted and not yet answered.",
        static_cast<double>(in_flight_));
  gauge("car_inference_requests_queued", "Requests waiting for a worker or for a sequence of their model.",
        static_cast<double>(pool_.queued()) + waiting);
  gauge("car_inference_requests_running", "Requests running on a worker or as a sequence of their model.",
        static_cast<double>(pool_.running()) + running);
  gauge("car_inference_workers", "Worker threads.", static_cast<double>(pool_.threads()));
  const auto per_model_sequences = [&](const char* name, const char* help, const char* type, auto value) {
    w.family(name, help, type);
    for (const auto& q : sequences) w.sample(name, "model", q.model, static_cast<double>(value(q.stats)));
  };
  per_model_sequences("car_inference_model_sequences_running", "Sequences running, per cached model.", "gauge",
                      [](const engine::SchedulerStats& q) { return q.active; });
  per_model_sequences("car_inference_model_requests_waiting",
                      "Requests waiting for a sequence of the model, per cached model.", "gauge",
                      [](const engine::SchedulerStats& q) { return q.queued; });
  per_model_sequences("car_inference_model_kv_tokens_used",
                      "KV pool positions taken (running requests' reservations, idle sequences' prefixes), per "
                      "cached model.",
                      "gauge", [](const engine::SchedulerStats& q) { return q.kv_tokens_used; });
  per_model_sequences("car_inference_model_kv_tokens_capacity", "KV pool positions, per cached model.", "gauge",
                      [](const engine::SchedulerStats& q) { return q.kv_tokens_capacity; });
  per_model_sequences("car_inference_model_kv_bytes_resident",
                      "Bytes of KV cache pages the model's sequences hold now, per cached model.", "gauge",
                      [](const engine::SchedulerStats& q) { return q.kv_bytes_resident; });
  per_model_sequences("car_inference_model_generated_tokens_per_second",
                      "Tokens generated per second over the last 10 s, per cached model.", "gauge",
                      [](const engine::SchedulerStats& q) { return q.tokens_per_s; });

  // The backend cache.
  gauge("car_inference_cache_bytes", "Bytes charged by the cached models.",
        static_cast<double>(s.total_bytes));
  gauge("car_inference_cache_budget_bytes", "The cache's byte budget (0: caching off).",
        static_cast<double>(s.budget_bytes));
  gauge("car_inference_cache_entries", "Models in the cache.", static_cast<double>(s.entries));
  gauge("car_inference_cache_loading", "Model loads in progress.", static_cast<double>(s.loading));
  gauge("car_inference_cache_reserved_bytes", "Bytes kept free for the loads in progress (their estimates).",
        static_cast<double>(s.reserved_bytes));
  gauge("car_inference_cache_evicted_held_bytes",
        "Bytes of evicted models that requests still hold (freed when they finish).",
        static_cast<double>(s.evicted_held_bytes));
  counter("car_inference_cache_hits_total", "Model lookups served from the cache.",
          static_cast<double>(s.hits));
  counter("car_inference_cache_misses_total", "Model lookups that did not find the model cached.",
          static_cast<double>(s.misses));
  counter("car_inference_cache_coalesced_total",
          "Misses that waited for another request's load of the model.", static_cast<double>(s.coalesced));
  counter("car_inference_cache_loads_total", "Model loads started.", static_cast<double>(s.loads));
  counter("car_inference_cache_load_failures_total", "Model loads that failed.",
          static_cast<double>(s.load_failures));
  counter("car_inference_cache_refused_total", "Loads refused because the model is larger than the budget.",
          static_cast<double>(s.refused));
  w.family("car_inference_cache_evictions_total", "Models that left the cache, by cause.", "counter");
  for (auto [cause, n] : {std::pair{EvictionCause::capacity, s.evictions_capacity},
                          std::pair{EvictionCause::idle, s.evictions_idle},
                          std::pair{EvictionCause::invalidate, s.evictions_invalidate},
                          std::pair{EvictionCause::clear, s.evictions_clear}}) {
    w.sample("car_inference_cache_evictions_total", "cause", eviction_cause_name(cause),
             static_cast<double>(n));
  }

  // Connections (the NDJSON socket).
  const nlohmann::json c = connections_.stats();
  gauge("car_inference_connections", "Open client connections.", number(c, "open"));
  counter("car_inference_connections_refused_total", "Connections refused past the connection caps.",
          number(c, "refused"));
  counter("car_inference_connections_output_overflows_total",
          "Streamed requests cancelled because the client left their output unread (socket and HTTP).",
          number(c, "output_overflows"));

  // Expert caches of the cached MoE models (their counters start at the model's load).
  struct Experts {
    std::string model;
    nlohmann::json stats;
  };
  std::vector<Experts> experts;
  for (const auto& item : s.items) {
    if (auto handle = cache_.peek(item.key)) {
      nlohmann::json e = handle->backend()->expert_stats();
      if (e.is_object()) experts.push_back({item.key, std::move(e)});
    }
  }
  const auto per_model = [&](const char* name, const char* help, const char* type, const char* key) {
    w.family(name, help, type);
    for (const auto& e : experts) w.sample(name, "model", e.model, number(e.stats, key));
  };
  per_model("car_inference_expert_cache_hits_total",
            "Expert demands served without a disk read, per cached model (since it was loaded).", "counter",
            "hits");
  per_model("car_inference_expert_cache_misses_total",
            "Expert demands that read the disk, per cached model (since it was loaded).", "counter",
            "misses");
  per_model("car_inference_expert_read_bytes_total",
            "Bytes of experts read from disk (demand and prefetch), per cached model (since it was loaded).",
            "counter", "bytes_read");
  per_model("car_inference_expert_prefetch_issued_total", "Expert prefetch reads started, per cached model.",
            "counter", "prefetch_issued");
  per_model("car_inference_expert_cache_resident_bytes", "Expert slot memory held now, per cached model.",
            "gauge", "resident_bytes");
  per_model("car_inference_expert_cache_budget_bytes", "This model's share of the expert cache budget.",
            "gauge", "cache_bytes");

  gauge("car_inference_uptime_seconds", "Seconds since car-inferenced started.",
        std::chrono::duration<double>(Clock::now() - started_).count());
  w.family("car_inference_build_info", "Always 1; the labels say what runs: version, git commit, kernels.",
           "gauge");
  w.sample("car_inference_build_info", {"version", "commit", "isa"},
           {options_.build.version, options_.build.commit, options_.build.isa}, 1);
  // The start time on the wall clock: now less the (steady) time since the handler started.
  const auto since = std::chrono::duration_cast<std::chrono::system_clock::duration>(Clock::now() - started_);
  process_metrics(w, std::chrono::system_clock::now() - since);
  return w.take();
}

}  // namespace car::daemon
