// bench_socket: request round trips through car-inferenced's server (in process, on a Unix socket) against
// a raw Unix-socket echo server that answers each request line with the same reply bytes, measured in the
// same run, on 1 and 16 connections (one client thread per connection, one request in flight on each).
//   BM_Health/threads:N   `health` through the daemon's server (session, JSON parse, dispatch, reply)
//   BM_Echo/threads:N     the same request and reply bytes through a thread-per-connection echo server
//   BM_InferWarm          `infer` of one token from a warm synthetic model; counter load_ms is the reply's
//                         timings.load_ms (the time to get the cached model)
// items_per_second is the total round-trip rate over all connections. BM_Health's io_cpu_us is the CPU
// time the daemon's io thread spent per round trip (a steadier figure than the rate on a loaded machine);
// csw_per_trip counts the process's context switches per round trip.
// Usage: bench_socket [--benchmark_filter=Health|Echo] [--benchmark_min_time=1]
#include <benchmark/benchmark.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/synth/synth_model.h"
#include "daemon/model_runtime.h"
#include "daemon/server.h"

namespace {

namespace fs = std::filesystem;
using car::daemon::ServerOptions;

int connect_to(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

/// Reads newline-terminated lines from a socket.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  bool next(std::string& line) {
    for (;;) {
      if (auto nl = buf_.find('\n', start_); nl != std::string::npos) {
        line.assign(buf_, start_, nl - start_);
        start_ = nl + 1;
        if (start_ == buf_.size()) {
          buf_.clear();
          start_ = 0;
        }
        return true;
      }
      char tmp[65536];
      ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) return false;
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
  std::size_t start_ = 0;
};

/// The daemon's server on a temporary socket, with the real runtime and a tiny synthetic model.
struct Daemon {
  fs::path dir;
  ServerOptions options;
  std::unique_ptr<car::daemon::ModelRuntime> runtime;
  std::unique_ptr<car::daemon::Server> server;
  std::thread thread;

  Daemon() {
    spdlog::set_level(spdlog::level::warn);  // one info line per request would dominate
    std::random_device rd;
    dir = fs::temp_directory_path() / ("car-bench-socket-" + std::to_string(rd()));
    fs::create_directories(dir / "models");
    car::synth::SynthSpec spec = car::synth::tiny_spec("llama");
    auto written = car::synth::write_synth_model(spec, (dir / "models" / "tiny.gguf").string());
    if (!written.ok()) {
      std::fprintf(stderr, "bench_socket: cannot write the synthetic model: %s\n",
                   written.error().message.c_str());
      std::abort();
    }
    options.socket_path = dir / "d.sock";
    options.models_dir = dir / "models";
    options.state_dir = dir;
    options.live.idle_ttl = std::chrono::seconds(0);
    options.live.log_level = "warn";
    options.handle_signals = false;
    car::daemon::RuntimeOptions ro;
    ro.threads = 1;
    runtime = car::daemon::make_default_runtime(ro);
    server = std::make_unique<car::daemon::Server>(options, *runtime);
    if (!server->open().ok()) std::abort();
    thread = std::thread([this] { server->run(); });
  }
  ~Daemon() {
    server->request_stop();
    thread.join();
    server.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

/// Answers every line with `reply` (one thread per connection, blocking reads and writes).
struct EchoServer {
  fs::path path;
  std::string reply;
  int listen_fd = -1;
  std::thread acceptor;
  std::mutex mu;
  std::vector<std::thread> conns;

  EchoServer(fs::path p, std::string r) : path(std::move(p)), reply(std::move(r)) {
    listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd, 64) != 0) {
      std::abort();
    }
    acceptor = std::thread([this] {
      for (;;) {
        int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        std::lock_guard lock(mu);
        conns.emplace_back([this, fd] {
          LineReader lines(fd);
          std::string line;
          while (lines.next(line)) {
            if (!write_all(fd, reply)) break;
          }
          ::close(fd);
        });
      }
    });
  }
  ~EchoServer() {
    ::shutdown(listen_fd, SHUT_RDWR);
    ::close(listen_fd);
    acceptor.join();
    for (auto& t : conns) t.join();  // every client closed its connection already
    ::unlink(path.c_str());
  }
};

/// CPU time consumed so far by `thread` (a running std::thread), in nanoseconds.
int64_t thread_cpu_ns(std::thread& thread) {
  clockid_t clock{};
  timespec ts{};
  if (pthread_getcpuclockid(thread.native_handle(), &clock) != 0 || clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

Daemon* g_daemon = nullptr;
EchoServer* g_echo = nullptr;
const std::string kHealth = R"({"id":1,"op":"health"})"
                            "\n";

void round_trips(benchmark::State& state, const fs::path& socket, const std::string& request) {
  int fd = connect_to(socket);
  if (fd < 0) {
    state.SkipWithError("connect failed");
    for (auto _ : state) {
    }
    return;
  }
  LineReader reader(fd);
  std::string line;
  for (auto _ : state) {
    if (!write_all(fd, request) || !reader.next(line)) {
      state.SkipWithError("connection lost");
      break;
    }
  }
  ::close(fd);
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(request.size() + line.size() + 1));
}

/// Context switches so far of every thread of the process (clients, server and echo alike).
int64_t context_switches() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_nvcsw) + static_cast<int64_t>(ru.ru_nivcsw);
}

/// Round trips, with counter csw_per_trip: the process's context switches per round trip (a client blocked
/// in read that is woken for nothing shows here).
void counted_round_trips(benchmark::State& state, const fs::path& socket) {
  const int64_t csw_start = state.thread_index() == 0 ? context_switches() : 0;
  round_trips(state, socket, kHealth);
  if (state.thread_index() == 0) {
    const double trips = static_cast<double>(state.iterations()) * state.threads();
    state.counters["csw_per_trip"] =
        benchmark::Counter(static_cast<double>(context_switches() - csw_start) / std::max(1.0, trips));
  }
}

void BM_Health(benchmark::State& state) {
  // The io thread serves every connection: its CPU time over the run, per round trip of all threads.
  const int64_t io_start = state.thread_index() == 0 ? thread_cpu_ns(g_daemon->thread) : 0;
  counted_round_trips(state, g_daemon->options.socket_path);
  if (state.thread_index() == 0) {
    const double trips = static_cast<double>(state.iterations()) * state.threads();
    state.counters["io_cpu_us"] =
        benchmark::Counter(static_cast<double>(thread_cpu_ns(g_daemon->thread) - io_start) / 1000.0 /
                           std::max(1.0, trips));
  }
}
void BM_Echo(benchmark::State& state) {
  counted_round_trips(state, g_echo->path);
}

void BM_InferWarm(benchmark::State& state) {
  int fd = connect_to(g_daemon->options.socket_path);
  LineReader reader(fd);
  std::string line;
  const std::string req =
      R"({"id":2,"op":"infer","model":"tiny","prompt":"hello","max_tokens":1,"temperature":0,"ignore_eos":true})"
      "\n";
  write_all(fd, req);  // warm: the first call loads
  reader.next(line);
  double load_ms = 0;
  for (auto _ : state) {
    write_all(fd, req);
    if (!reader.next(line)) break;
    load_ms += nlohmann::json::parse(line)["result"]["timings"]["load_ms"].get<double>();
  }
  ::close(fd);
  state.counters["load_ms"] =
      benchmark::Counter(load_ms / static_cast<double>(std::max<int64_t>(1, state.iterations())));
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_Health)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_Echo)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_InferWarm)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Daemon daemon;
  g_daemon = &daemon;
  // The echo answers with the daemon's own health reply, so both move the same bytes.
  int fd = connect_to(daemon.options.socket_path);
  LineReader reader(fd);
  std::string reply;
  if (fd < 0 || !write_all(fd, kHealth) || !reader.next(reply)) return 1;
  ::close(fd);
  EchoServer echo(daemon.dir / "echo.sock", reply + "\n");
  g_echo = &echo;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
