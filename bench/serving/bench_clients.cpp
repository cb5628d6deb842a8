// bench_clients: N concurrent clients streaming from one model through car-inferenced's Unix socket - what a
// server's users see of continuous batching (issue #25). Beside `car bench --parallel N`, which submits N
// requests to the engine's scheduler in process, this adds the socket, the sessions, the request handler
// and the token events, measured at the client.
//
// For each N of --clients, --repeat rounds of: N connections (opened before the clock starts) each send at
// once one `infer` with `"stream": true`, a one-word prompt, `max_tokens` = -n, greedy, ignore_eos;
// then (with --probe, the default) a round where N streams of 4 x n tokens run and, once every one of them
// has its first token, a new connection sends a short request (prompt "Hi", 4 tokens): its time to first
// token is the "new request under load" figure. Reported per N:
//   agg tok/s      N x n / (last final reply - first send), the median round (car bench's definition)
//   stream tok/s   one stream's decode rate, (tokens - 1) / (last token - first token), mean over all streams
//   ttft p50/p99   client-side send -> first token event, over all streams of all rounds (nearest rank: with
//                  few streams p99 is their maximum)
//   step ms        1000 / stream tok/s: the time of one batched step at that N
//   probe ttft     the new request's send -> first token, median of the rounds, and that in steps
//   cpu ms/tok     (the daemon this bench started) the daemon's CPU time over the N-client rounds divided by
//                  the tokens they generated: the work per token, which others' load on the machine changes
//                  far less than the wall-clock rates (compare `car bench` run under `time` the same way)
//
// Usage:
//   bench_clients --model FILE [--daemon PATH/car-inferenced] [--threads 2] [--context 512]
//                 [--clients 1,2,4,8] [-n 32] [--repeat 3] [--no-probe]
//       starts the daemon itself on a temporary socket, models directory = FILE's folder (read only),
//       CAR_INFERENCE_PARALLEL = max N + 1 (room for the probe), and stops it at the end;
//   bench_clients --socket PATH --model NAME [...]
//       uses a running daemon (its own PARALLEL and THREADS settings apply).
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/client.h"

namespace {

namespace fs = std::filesystem;
using car::protocol::ClientConnection;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Flags {
  std::string socket;
  std::string model;  // a file (the bench starts the daemon) or a model name (--socket)
  std::string daemon = std::string(CAR_BINARY_DIR) + "/daemon/car-inferenced";
  int threads = 2;
  int context = 512;
  std::vector<int> clients = {1, 2, 4, 8};
  int n_gen = 32;
  int repeat = 3;
  bool probe = true;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "bench_clients: %s\nusage: bench_clients --model FILE [--daemon BIN] [--threads T] [--context C]\n"
               "                     [--clients 1,2,4,8] [-n N] [--repeat R] [--no-probe]\n"
               "       bench_clients --socket PATH --model NAME [...]\n",
               what.c_str());
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 0 || n > 1'000'000) usage_error(a + ": not a count: " + v);
      return static_cast<int>(n);
    };
    if (a == "--socket") {
      f.socket = value();
    } else if (a == "--model") {
      f.model = value();
    } else if (a == "--daemon") {
      f.daemon = value();
    } else if (a == "--threads") {
      f.threads = number();
    } else if (a == "--context") {
      f.context = number();
    } else if (a == "-n") {
      f.n_gen = number();
    } else if (a == "--repeat") {
      f.repeat = number();
    } else if (a == "--no-probe") {
      f.probe = false;
    } else if (a == "--clients") {
      f.clients.clear();
      std::stringstream ss(value());
      for (std::string item; std::getline(ss, item, ',');) {
        const int n = std::atoi(item.c_str());
        if (n < 1 || n > 256) usage_error("--clients: not a client count: " + item);
        f.clients.push_back(n);
      }
    } else {
      usage_error("unknown argument " + a);
    }
  }
  if (f.model.empty()) usage_error("--model is required");
  if (f.clients.empty() || f.n_gen < 2 || f.repeat < 1) usage_error("need clients, -n >= 2, --repeat >= 1");
  return f;
}

/// The daemon this bench started: a child process on a temporary socket, stopped (SIGTERM) at the end.
class OwnDaemon {
 public:
  OwnDaemon(const Flags& f, int parallel) {
    dir_ = fs::temp_directory_path() / ("bench_clients." + std::to_string(::getpid()));
    fs::create_directories(dir_);
    socket_ = (dir_ / "car.sock").string();
    const fs::path model = fs::absolute(f.model);
    std::vector<std::string> env = {
        "CAR_INFERENCE_SOCKET=" + socket_,
        "CAR_INFERENCE_MODELS_DIR=" + model.parent_path().string(),
        "CAR_INFERENCE_STATE_DIR=" + dir_.string(),
        "CAR_INFERENCE_THREADS=" + std::to_string(f.threads),
        "CAR_INFERENCE_PARALLEL=" + std::to_string(parallel),
        "CAR_INFERENCE_CONTEXT=" + std::to_string(f.context),
        "CAR_INFERENCE_LOG_LEVEL=warn",
    };
    if (const char* path = std::getenv("PATH")) env.push_back(std::string("PATH=") + path);
    const std::string log = (dir_ / "daemon.log").string();
    pid_ = ::fork();
    if (pid_ == 0) {
      if (std::FILE* out = std::freopen(log.c_str(), "w", stderr)) (void)out;
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      char* argv[] = {const_cast<char*>(f.daemon.c_str()), nullptr};
      ::execve(f.daemon.c_str(), argv, envp.data());
      ::_exit(127);
    }
    const auto deadline = Clock::now() + 30s;
    while (!ClientConnection::connect(socket_).ok()) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_ || Clock::now() > deadline) {
        pid_ = -1;
        std::fprintf(stderr, "bench_clients: %s did not come up (log: %s)\n", f.daemon.c_str(), log.c_str());
        std::exit(1);
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  ~OwnDaemon() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  OwnDaemon(const OwnDaemon&) = delete;
  OwnDaemon& operator=(const OwnDaemon&) = delete;
  const std::string& socket() const { return socket_; }
  /// The daemon's CPU time so far (user + system, all threads), in seconds; from /proc/PID/stat.
  double cpu_seconds() const {
    char buf[1024];
    const int fd = ::open(("/proc/" + std::to_string(pid_) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t n = fd >= 0 ? ::read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) ::close(fd);
    if (n <= 0) return 0;
    const std::string stat(buf, static_cast<size_t>(n));
    if (stat.rfind(')') == std::string::npos) return 0;
    // Fields after the command (which may hold spaces) start past its closing parenthesis: utime and stime
    // are fields 14 and 15, the 12th and 13th after it.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i >= 14) ticks += std::stod(field);
    }
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

 private:
  fs::path dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// One streamed request as its client saw it.
struct Stream {
  Clock::time_point sent, first, last, done;
  int tokens = 0;
  std::string error;
  double ttft_ms() const { return ms_between(sent, first); }
  double decode_tps() const {
    const double ms = ms_between(first, last);
    return tokens > 1 && ms > 0 ? (tokens - 1) * 1000.0 / ms : 0;
  }
};

/// A prompt of one word (BOS and a token or two), as `car bench` decodes after one token: the rounds measure
/// decode, not prompts. Consecutive clients get different words.
std::string one_word_prompt(int i) {
  static const char* const kWords[] = {"Once", "The", "Hello", "It", "One", "She", "They", "We", "You", "This", "He"};
  return kWords[static_cast<size_t>(i) % std::size(kWords)];
}

json infer_request(const std::string& model, const std::string& prompt, int max_tokens) {
  return {{"id", 1},          {"op", "infer"},          {"model", model},      {"prompt", prompt},
          {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
}

/// Send `request` on `conn` and read its stream to the final reply. `on_first` runs at the first token.
Stream run_stream(ClientConnection& conn, const json& request, const std::function<void()>& on_first = {}) {
  Stream s;
  s.sent = Clock::now();
  if (auto sent = conn.send_line(request.dump()); !sent.ok()) {
    s.error = sent.error().message;
    return s;
  }
  for (;;) {
    auto line = conn.read_line(600s);
    const auto now = Clock::now();
    if (!line.ok() || !line.value()) {
      s.error = line.ok() ? "no reply within 600 s" : line.error().message;
      return s;
    }
    const json j = json::parse(**line, nullptr, false);
    if (j.is_discarded()) {
      s.error = "not JSON: " + **line;
      return s;
    }
    if (j.contains("event")) {
      if (j.value("token", -1) < 0) continue;  // the held-back text at the end
      if (s.tokens == 0) {
        s.first = now;
        if (on_first) on_first();
      }
      s.last = now;
      ++s.tokens;
      continue;
    }
    s.done = now;
    if (!j.value("ok", false)) s.error = j.dump();
    return s;
  }
}

ClientConnection connect_or_die(const std::string& socket) {
  auto c = ClientConnection::connect(socket);
  if (!c.ok()) {
    std::fprintf(stderr, "bench_clients: %s\n", c.error().message.c_str());
    std::exit(1);
  }
  return std::move(c.value());
}

void die_on_error(const Stream& s) {
  if (s.error.empty()) return;
  std::fprintf(stderr, "bench_clients: request failed: %s\n", s.error.c_str());
  std::exit(1);
}

/// One round of N clients: every stream, and the aggregate rate.
std::vector<Stream> clients_round(const std::string& socket, const std::string& model, int n, int n_gen, int round,
                                  double& aggregate_tps) {
  std::vector<ClientConnection> conns;
  for (int i = 0; i < n; ++i) conns.push_back(connect_or_die(socket));
  std::vector<Stream> streams(static_cast<size_t>(n));
  std::latch go(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string prompt = one_word_prompt(round * 8 + i);
      go.arrive_and_wait();
      streams[static_cast<size_t>(i)] = run_stream(conns[static_cast<size_t>(i)], infer_request(model, prompt, n_gen));
    });
  }
  for (auto& t : threads) t.join();
  Clock::time_point first = streams[0].sent, last = streams[0].done;
  for (const Stream& s : streams) {
    die_on_error(s);
    if (s.tokens != n_gen) {
      std::fprintf(stderr, "bench_clients: a stream got %d of %d tokens\n", s.tokens, n_gen);
      std::exit(1);
    }
    first = std::min(first, s.sent);
    last = std::max(last, s.done);
  }
  aggregate_tps = n * n_gen * 1000.0 / ms_between(first, last);
  return streams;
}

/// N streams of 4 x n_gen tokens; once each has its first token, a short request on a new connection. Returns
/// its time to first token (ms). The long streams are then cut short by closing their connections.
double probe_round(const std::string& socket, const std::string& model, int n, int n_gen, int round) {
  std::vector<ClientConnection> conns;
  for (int i = 0; i < n; ++i) conns.push_back(connect_or_die(socket));
  std::latch started(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string prompt = one_word_prompt(round * 8 + i);
      // A stream cut by the close below ends with a read error: expected, not reported.
      run_stream(conns[static_cast<size_t>(i)], infer_request(model, prompt, 4 * n_gen), [&] { started.count_down(); });
    });
  }
  started.wait();
  ClientConnection probe = connect_or_die(socket);
  const Stream s = run_stream(probe, infer_request(model, "Hi", 4));
  die_on_error(s);
  for (auto& c : conns) ::shutdown(c.fd(), SHUT_RDWR);  // disconnect: the daemon cancels the long streams
  for (auto& t : threads) t.join();
  return s.ttft_ms();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double median(std::vector<double> v) { return percentile(std::move(v), 50); }

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv);
  std::optional<OwnDaemon> own;
  std::string socket = f.socket;
  std::string model = f.model;
  if (socket.empty()) {
    own.emplace(f, *std::max_element(f.clients.begin(), f.clients.end()) + 1);
    socket = own->socket();
    model = fs::path(f.model).stem().string();
  }
  {
    ClientConnection conn = connect_or_die(socket);
    const auto t0 = Clock::now();
    die_on_error(run_stream(conn, infer_request(model, "Warm up", 4)));  // loads the model
    std::printf("model %s: loaded and warmed up in %.0f ms; -n %d, %d round(s) per N\n\n", model.c_str(),
                ms_between(t0, Clock::now()), f.n_gen, f.repeat);
  }
  std::printf("| N | agg tok/s | stream tok/s | ttft p50 ms | ttft p99 ms | step ms | probe ttft ms | probe steps | "
              "cpu ms/tok |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int round = 0;
  for (int n : f.clients) {
    std::vector<double> aggregates, ttfts, rates, probes;
    const double cpu0 = own ? own->cpu_seconds() : 0;
    for (int r = 0; r < f.repeat; ++r) {
      double agg = 0;
      for (const Stream& s : clients_round(socket, model, n, f.n_gen, ++round, agg)) {
        ttfts.push_back(s.ttft_ms());
        rates.push_back(s.decode_tps());
      }
      aggregates.push_back(agg);
    }
    const double cpu_ms_per_token =
        own ? (own->cpu_seconds() - cpu0) * 1000.0 / (static_cast<double>(n) * f.n_gen * f.repeat) : 0;
    if (f.probe) {
      for (int r = 0; r < f.repeat; ++r) probes.push_back(probe_round(socket, model, n, f.n_gen, ++round));
    }
    double rate = 0;
    for (double x : rates) rate += x / static_cast<double>(rates.size());
    const double step_ms = rate > 0 ? 1000.0 / rate : 0;
    std::printf("| %d | %.1f | %.1f | %.0f | %.0f | %.1f |", n, median(aggregates), rate, percentile(ttfts, 50),
                percentile(ttfts, 99), step_ms);
    if (f.probe) {
      const double p = median(probes);
      std::printf(" %.0f | %.1f |", p, step_ms > 0 ? p / step_ms : 0);
    } else {
      std::printf(" - | - |");
    }
    if (own) {
      std::printf(" %.1f |\n", cpu_ms_per_token);
    } else {
      std::printf(" - |\n");
    }
    std::fflush(stdout);
  }
  return 0;
}
