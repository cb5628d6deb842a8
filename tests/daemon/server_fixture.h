// The server in-process, over a real Unix socket, with a scripted ModelRuntime: what the session tests
// (session_test.cpp) and the request handler tests (request_handler_test.cpp) share.
// The scripted backend is deterministic: it emits max_tokens tokens " w0", " w1", ... and, for the prompt
// "hold", then waits until it is cancelled - so tests synchronize on events, never on sleeps. The cache and
// the server's timers run on a clock the test moves (ServerFixture::clock_).
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "daemon/protocol.h"
#include "daemon/server.h"
#include "tests/daemon/daemon_test_support.h"
#include "tests/test_support.h"

namespace car::daemon::server_test {

using car::testing::call;
using car::testing::error_code;
using car::testing::read_json;
using car::testing::TempDir;
using car::testing::wait_until;
using nlohmann::json;
using protocol::ClientConnection;
using namespace std::chrono_literals;

struct Script {
  std::atomic<int> loads{0};
  std::atomic<int> estimates{0};
  std::atomic<int> saves{0};
  std::atomic<int> cancelled_generations{0};
  std::atomic<int> live_backends{0};
  // "gated" loads block until the test opens the gate.
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool gate_open = false;
  void open_gate() {
    {
      std::lock_guard lock(gate_mutex);
      gate_open = true;
    }
    gate_cv.notify_all();
  }
};

class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend(Script& script, uint64_t bytes) : script_(script), bytes_(bytes) {
    ++script_.live_backends;
  }
  ~ScriptedBackend() override { --script_.live_backends; }

  Result<GenerateOutput> generate(const GenerateParams& params, const TokenSink& on_token,
                                  const std::atomic<bool>& cancelled) override {
    const std::string& prompt = params.generate.prompt;
    if (prompt == "throw") throw std::runtime_error("scripted exception");
    if (prompt == "overflow") return make_error("context_overflow", "prompt of 9999 tokens > context 128");
    GenerateOutput out;
    out.prompt_tokens = static_cast<int>(prompt.size());
    for (int i = 0; i < params.generate.max_tokens; ++i) {
      if (cancelled.load()) return finish_cancelled(out);
      std::string text = " w" + std::to_string(i);
      out.text += text;
      out.tokens.push_back(100 + i);
      if (on_token) on_token(protocol::TokenEvent{100 + i, text, std::nullopt});
    }
    if (prompt == "hold") {
      // Wait for cancellation (bounded, so a broken test cannot hang the suite).
      auto deadline = std::chrono::steady_clock::now() + 30s;
      while (!cancelled.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
      if (cancelled.load()) return finish_cancelled(out);
    }
    out.finish_reason = "length";
    return out;
  }
  uint64_t memory_bytes() const override { return bytes_; }
  bool streams_experts() const override { return false; }
  void save_state() override { ++script_.saves; }

 private:
  GenerateOutput finish_cancelled(GenerateOutput& out) {
    ++script_.cancelled_generations;
    out.finish_reason = "cancelled";
    return out;
  }
  Script& script_;
  uint64_t bytes_;
};

class ScriptedRuntime final : public ModelRuntime {
 public:
  explicit ScriptedRuntime(Script& script) : script_(script) {}
  Result<std::shared_ptr<Backend>> load(const std::filesystem::path& path) override {
    ++script_.loads;
    const std::string stem = path.stem().string();
    if (stem == "broken") return make_error("load_failed", "broken.gguf: tensor blk.0.attn_q.weight missing");
    if (stem == "gated") {
      std::unique_lock lock(script_.gate_mutex);
      script_.gate_cv.wait_for(lock, 30s, [&] { return script_.gate_open; });
    }
    // "grows" holds twice what its estimate said (the cache corrects the charge after loading).
    const uint64_t bytes = std::filesystem::file_size(path) * (stem == "grows" ? 2 : 1);
    return std::shared_ptr<Backend>(std::make_shared<ScriptedBackend>(script_, bytes));
  }
  Result<uint64_t> estimate_bytes(const std::filesystem::path& path, const LoadRequest&) override {
    ++script_.estimates;
    std::error_code ec;
    const uint64_t bytes = std::filesystem::file_size(path, ec);
    if (ec) return make_error("not_found", path.string() + ": " + ec.message());
    return bytes;
  }
  bool available() const override { return true; }
  std::string name() const override { return "scripted"; }

 private:
  Script& script_;
};

class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    spdlog::set_level(spdlog::level::warn);
    models_ = tmp_ / "models";
    std::filesystem::create_directories(models_);
    for (const char* name : {"a", "b", "c", "broken", "gated"})
      write_file(models_ / (std::string(name) + ".gguf"), 1000);
    write_file(tmp_ / "outside.gguf", 1000);
    std::filesystem::create_symlink(tmp_ / "outside.gguf", models_ / "escape.gguf");
    options_.socket_path = tmp_ / "d.sock";
    options_.models_dir = models_;
    options_.state_dir = tmp_.path();
    options_.live.cache_budget_bytes = 1ull << 30;
    options_.live.idle_ttl = 0s;
    options_.handle_signals = false;
    options_.shutdown_grace = 5000ms;
  }

  void TearDown() override { stop(); }

  static void write_file(const std::filesystem::path& p, std::size_t bytes) {
    std::ofstream(p) << std::string(bytes, 'x');
  }

  void start() {
    // The cache and the server's timers read a clock the test moves forward (idle eviction, keep-alives and
    // line timeouts without waiting real seconds).
    server_ = std::make_unique<Server>(
        options_, runtime_, [this] { return clock_.now(); }, clock_);
    auto ok = server_->open();
    ASSERT_TRUE(ok.ok()) << ok.error().message;
    thread_ = std::thread([this] { exit_code_ = server_->run(); });
  }

  int stop() {
    if (thread_.joinable()) {
      server_->request_stop();
      thread_.join();
    }
    return exit_code_;
  }

  /// With one worker and a queue of one: "running" holds the worker (its first token was read), "queued"
  /// fills the queue, both streaming the `hold` prompt until cancelled.
  void hold_worker_and_queue(ClientConnection& conn) {
    json hold = {{"op", "infer"}, {"model", "a"}, {"prompt", "hold"}, {"max_tokens", 1}, {"stream", true}};
    hold["id"] = "running";
    ASSERT_TRUE(conn.send_line(hold.dump()).ok());
    ASSERT_EQ(read_json(conn)["event"], "token");  // the only worker is busy with it
    hold["id"] = "queued";
    ASSERT_TRUE(conn.send_line(hold.dump()).ok());  // fills the queue
  }

  ClientConnection connect() {
    auto c = ClientConnection::connect(options_.socket_path.string());
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    return std::move(c.value());
  }

  json stats(ClientConnection& conn) { return call(conn, {{"id", "stats"}, {"op", "stats"}})["result"]; }

  /// Start a streamed infer of `model` that the fake runtime holds (prompt "hold": it runs until cancelled)
  /// and wait for its first token, so the model is in use from here on.
  static void hold(ClientConnection& conn, const json& id, const std::string& model) {
    ASSERT_TRUE(conn.send_line(json({{"id", id},
                                     {"op", "infer"},
                                     {"model", model},
                                     {"prompt", "hold"},
                                     {"max_tokens", 1},
                                     {"stream", true}})
                                   .dump())
                    .ok());
    EXPECT_EQ(read_json(conn)["event"], "token");
  }

  /// Read lines until `done` holds `n` final replies (token events skipped), keyed by id; false when the
  /// connection ends or times out first.
  static bool collect_replies(ClientConnection& conn, std::map<std::string, json>& done, std::size_t n) {
    while (done.size() < n) {
      json j = read_json(conn);
      if (j.is_null()) return false;
      if (!j.contains("event")) done[j["id"].get<std::string>()] = j;
    }
    return true;
  }

  TempDir tmp_;
  std::filesystem::path models_;
  ServerOptions options_;
  Script script_;
  ScriptedRuntime runtime_{script_};
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int exit_code_ = -1;
  /// The steady clock plus a skew the test adds to. Timers on it wait in 1 ms slices, so an advance reaches
  /// them at once; real time passing still counts, so waits on it end as they would in production.
  struct SkewedClock final : TimerClock {
    time_point now() const override { return std::chrono::steady_clock::now() + duration(skew.load()); }
    duration poll_interval() const override { return 1ms; }
    void advance(duration d) { skew += d.count(); }
    std::atomic<duration::rep> skew{0};
  };
  SkewedClock clock_;

  /// Move the clock on and let the io thread act on it: a timer due by then has fired (its slice ends
  /// within a millisecond) and its handler has run before `conn`'s round trip through the io thread returns.
  void advance_and_settle(std::chrono::nanoseconds d, ClientConnection& conn) {
    clock_.advance(std::chrono::duration_cast<TimerClock::duration>(d));
    std::this_thread::sleep_for(5ms);
    ASSERT_EQ(call(conn, {{"id", "settle"}, {"op", "health"}})["ok"], true);
  }
};

}  // namespace car::daemon::server_test
