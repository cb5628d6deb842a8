// The server in-process, over a real Unix socket, with a scripted ModelRuntime: every op and error code,
// pipelining, streaming, cancel, disconnect, busy, the cache's budget and idle eviction, shutdown.
// The scripted backend is deterministic: it emits max_tokens tokens " w0", " w1", ... and, for the prompt
// "hold", then waits until it is cancelled - so tests synchronize on events, never on sleeps.
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

namespace car::daemon {
namespace {

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

class DaemonServerTest : public ::testing::Test {
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

TEST_F(DaemonServerTest, HealthListStatsAnswer) {
  start();
  auto conn = connect();
  json h = call(conn, {{"id", 1}, {"op", "health"}});
  EXPECT_EQ(h["ok"], true);
  EXPECT_EQ(h["result"]["status"], "ok");
  EXPECT_EQ(h["result"]["engine"], "scripted");

  json l = call(conn, {{"id", 2}, {"op", "list"}});
  ASSERT_EQ(l["ok"], true);
  std::vector<std::string> ids;
  for (const auto& m : l["result"]["models"]) {
    ids.push_back(m["model"]);
    EXPECT_EQ(m["loaded"], false);
  }
  // escape.gguf points outside the models directory: not listed.
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "broken", "c", "gated"}));

  json s = stats(conn);
  EXPECT_EQ(s["cache"]["entries"], 0);
  EXPECT_EQ(s["cache"]["budget_bytes"], 1ull << 30);
  EXPECT_TRUE(s["models"].is_array());
  EXPECT_TRUE(s.contains("uptime_s"));
}

TEST_F(DaemonServerTest, EveryErrorCode) {
  start();
  auto conn = connect();
  auto code_of = [&](json req) { return error_code(call(conn, req)); };
  EXPECT_EQ(code_of({{"id", 1}, {"op", "frobnicate"}}), "unknown_op");
  EXPECT_EQ(code_of({{"id", 2}}), "bad_request");                                   // no op
  EXPECT_EQ(code_of({{"id", 3}, {"op", 7}}), "bad_request");                        // op not a string
  EXPECT_EQ(code_of({{"id", 4}, {"op", "load"}}), "bad_request");                   // no model
  EXPECT_EQ(code_of({{"id", 5}, {"op", "infer"}, {"model", "a"}}), "bad_request");  // no prompt
  EXPECT_EQ(code_of({{"id", 6}, {"op", "infer"}, {"model", "a"}, {"prompt", "x"}, {"max_tokens", -1}}),
            "bad_request");
  EXPECT_EQ(code_of({{"id", 7}, {"op", "infer"}, {"model", "a"}, {"prompt", "x"}, {"top_p", 2}}),
            "bad_request");
  EXPECT_EQ(code_of({{"id", 8}, {"op", "infer"}, {"model", "a"}, {"prompt", "x"}, {"stop", {1}}}),
            "bad_request");
  EXPECT_EQ(code_of({{"id", 9}, {"op", "cancel"}}), "bad_request");  // no target
  for (const std::string& bad_id :
       std::vector<std::string>{"../a", "a/b", "", ".hidden", "..", std::string("a\0b", 3), "x\\y"}) {
    EXPECT_EQ(code_of({{"id", 10}, {"op", "load"}, {"model", bad_id}}), "forbidden") << bad_id;
  }
  EXPECT_EQ(code_of({{"id", 11}, {"op", "load"}, {"model", "escape"}}), "forbidden");  // symlink out
  EXPECT_EQ(code_of({{"id", 12}, {"op", "invalidate"}, {"model", "../a"}}), "forbidden");
  EXPECT_EQ(code_of({{"id", 13}, {"op", "load"}, {"model", "missing"}}), "not_found");
  EXPECT_EQ(code_of({{"id", 14}, {"op", "infer"}, {"model", "missing"}, {"prompt", "x"}}), "not_found");
  json failed = call(conn, {{"id", 15}, {"op", "load"}, {"model", "broken"}});
  EXPECT_EQ(error_code(failed), "load_failed");
  EXPECT_NE(failed["error"]["message"].get<std::string>().find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_EQ(code_of({{"id", 16}, {"op", "infer"}, {"model", "a"}, {"prompt", "overflow"}}),
            "context_overflow");
  EXPECT_EQ(code_of({{"id", 17}, {"op", "infer"}, {"model", "a"}, {"prompt", "throw"}}), "internal");
  // The connection survived all of that.
  EXPECT_EQ(call(conn, {{"id", 18}, {"op", "health"}})["ok"], true);
}

TEST_F(DaemonServerTest, InvalidJsonAndOversizedLinesKeepTheConnection) {
  start();
  auto conn = connect();
  ASSERT_TRUE(conn.send_raw("{not json\n").ok());
  json r = read_json(conn);
  EXPECT_EQ(error_code(r), "bad_request");
  EXPECT_TRUE(r["id"].is_null());

  ASSERT_TRUE(conn.send_raw("[1,2]\n").ok());
  EXPECT_EQ(error_code(read_json(conn)), "bad_request");
  ASSERT_TRUE(conn.send_line(R"({"id": {"no": "objects"}, "op": "health"})").ok());
  EXPECT_EQ(error_code(read_json(conn)), "bad_request");

  // One byte over the limit, sent in pieces, then a good request on the same connection.
  std::string big(protocol::kMaxLineBytes + 1, 'x');
  ASSERT_TRUE(conn.send_raw(big.substr(0, 5000)).ok());
  ASSERT_TRUE(conn.send_raw(big.substr(5000)).ok());
  ASSERT_TRUE(conn.send_raw("\n").ok());
  json over = read_json(conn);
  EXPECT_EQ(error_code(over), "bad_request");
  EXPECT_NE(over["error"]["message"].get<std::string>().find("longer than"), std::string::npos);
  EXPECT_EQ(call(conn, {{"id", "after"}, {"op", "health"}})["ok"], true);

  // A line of exactly the limit is accepted.
  // (The padding is a field health does not know: "strict": false lets it by.)
  json exact = {{"id", "exact"}, {"op", "health"}, {"strict", false}, {"pad", ""}};
  std::size_t base = exact.dump().size();
  exact["pad"] = std::string(protocol::kMaxLineBytes - base, 'p');
  ASSERT_EQ(exact.dump().size(), protocol::kMaxLineBytes);
  EXPECT_EQ(call(conn, exact)["ok"], true);
}

TEST_F(DaemonServerTest, EveryRequestIsAnsweredOnceWhateverTheChunking) {
  // The reader peeks a chunk into a 1 KiB buffer, handles it, and only then takes it off the socket; a
  // chunk that fills the buffer is taken at once and followed by a read into a larger one. Lines of every
  // length around those sizes, sent in writes of every size around them, must each be answered exactly
  // once and in order - a chunk taken twice or not at all would show as a repeated or missing id.
  start();
  auto conn = connect();
  std::string stream;
  constexpr int kRequests = 240;
  for (int i = 0; i < kRequests; ++i) {
    json r = {{"id", i}, {"op", "health"}, {"strict", false}, {"pad", std::string((i * 37) % 2100, 'x')}};
    stream += r.dump() + "\n";
  }
  const std::size_t sizes[] = {1, 7, 1023, 1024, 1025, 2047, 2048, 2049, 5000, 65536};
  std::size_t off = 0;
  for (std::size_t k = 0; off < stream.size(); ++k) {
    const std::size_t n = std::min(sizes[k % std::size(sizes)], stream.size() - off);
    ASSERT_TRUE(conn.send_raw(stream.substr(off, n)).ok());
    off += n;
    if (k % 5 == 0) std::this_thread::sleep_for(1ms);  // let some writes arrive as chunks of their own
  }
  for (int i = 0; i < kRequests; ++i) {
    json j = read_json(conn);
    ASSERT_FALSE(j.is_null()) << "no reply for request " << i;
    ASSERT_EQ(j["id"], i);
    EXPECT_EQ(j["ok"], true);
  }
  // Nothing more: a chunk handled twice would have left a reply behind.
  EXPECT_EQ(call(conn, {{"id", "last"}, {"op", "health"}})["id"], "last");
  // One line at a time, each the whole chunk: lengths either side of the buffer's size.
  for (std::size_t len : {1000, 1022, 1023, 1024, 1025, 1026, 2047, 2048, 2049, 3000}) {
    json r = {{"id", len}, {"op", "health"}, {"strict", false}, {"pad", ""}};
    r["pad"] = std::string(len - r.dump().size(), 'y');  // the line is len bytes before its newline
    ASSERT_EQ(r.dump().size(), len);
    json reply = call(conn, r);
    EXPECT_EQ(reply["id"], len);
    EXPECT_EQ(reply["ok"], true) << reply.dump();
  }
  EXPECT_EQ(call(conn, {{"id", "after"}, {"op", "health"}})["id"], "after");
}

TEST_F(DaemonServerTest, PipelinedRequestsEchoTheirIds) {
  start();
  auto conn = connect();
  // A held infer, then quick ops with every kind of scalar id, in one write.
  std::string batch = json({{"id", "held"},
                            {"op", "infer"},
                            {"model", "a"},
                            {"prompt", "hold"},
                            {"max_tokens", 1},
                            {"stream", true}})
                          .dump() +
                      "\n" + R"({"id": -9223372036854775808, "op": "health"})" + "\n" +
                      R"({"id": true, "op": "list"})" + "\n" + R"({"op": "health"})" + "\n" +
                      R"({"id": null, "op": "health"})" + "\n";
  ASSERT_TRUE(conn.send_raw(batch).ok());
  std::vector<json> finals;
  bool got_token = false;
  while (finals.size() < 4) {
    json j = read_json(conn);
    ASSERT_FALSE(j.is_null());
    if (j.contains("event")) {
      EXPECT_EQ(j["id"], "held");
      got_token = true;
      continue;
    }
    finals.push_back(j);
  }
  // The quick ops answered while the infer is still running, each with its own id.
  EXPECT_EQ(finals[0]["id"], INT64_MIN);
  EXPECT_EQ(finals[1]["id"], true);
  EXPECT_TRUE(finals[2]["id"].is_null());
  EXPECT_TRUE(finals[3]["id"].is_null());
  for (const auto& f : finals) EXPECT_EQ(f["ok"], true);
  if (!got_token) {
    json ev = read_json(conn);
    EXPECT_EQ(ev["event"], "token");
  }
  json c = call(conn, {{"id", "c"}, {"op", "cancel"}, {"target", "held"}});
  EXPECT_EQ(c["result"]["cancelled"], true);
  json held = read_json(conn);
  EXPECT_EQ(held["id"], "held");
  EXPECT_EQ(held["result"]["finish_reason"], "cancelled");
}

TEST_F(DaemonServerTest, StreamingSendsEachTokenThenTheResult) {
  start();
  auto conn = connect();
  std::vector<json> events;
  json r = call(
      conn,
      {{"id", 1}, {"op", "infer"}, {"model", "a"}, {"prompt", "hi"}, {"max_tokens", 5}, {"stream", true}},
      &events);
  ASSERT_EQ(r["ok"], true) << r.dump();
  ASSERT_EQ(events.size(), 5u);
  std::string joined;
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["event"], "token");
    EXPECT_EQ(events[i]["token"], 100 + static_cast<int>(i));
    joined += events[i]["text"].get<std::string>();
  }
  EXPECT_EQ(joined, " w0 w1 w2 w3 w4");
  EXPECT_EQ(r["result"]["text"], joined);
  EXPECT_EQ(r["result"]["tokens"], json({100, 101, 102, 103, 104}));
  EXPECT_EQ(r["result"]["finish_reason"], "length");
  EXPECT_EQ(r["result"]["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r["result"]["usage"]["prompt_tokens"], 2);
  for (const char* t : {"load_ms", "queue_ms", "prompt_ms", "decode_ms", "ttft_ms"})
    EXPECT_TRUE(r["result"]["timings"].contains(t));

  // Without "stream", no events: the next line is the final reply.
  std::vector<json> none;
  json r2 =
      call(conn, {{"id", 2}, {"op", "infer"}, {"model", "a"}, {"prompt", "hi"}, {"max_tokens", 3}}, &none);
  EXPECT_EQ(r2["result"]["text"], " w0 w1 w2");
  EXPECT_TRUE(none.empty());
}

TEST_F(DaemonServerTest, CancelStopsAnInferWithinOneToken) {
  start();
  auto conn = connect();
  ASSERT_TRUE(conn.send_line(json({{"id", 7},
                                   {"op", "infer"},
                                   {"model", "a"},
                                   {"prompt", "hold"},
                                   {"max_tokens", 2},
                                   {"stream", true}})
                                 .dump())
                  .ok());
  EXPECT_EQ(read_json(conn)["event"], "token");
  EXPECT_EQ(read_json(conn)["event"], "token");
  json miss = call(conn, {{"id", 8}, {"op", "cancel"}, {"target", 12345}});
  EXPECT_EQ(miss["result"]["cancelled"], false);
  json c = call(conn, {{"id", 9}, {"op", "cancel"}, {"target", 7}});
  EXPECT_EQ(c["result"]["cancelled"], true);
  json r = read_json(conn);
  EXPECT_EQ(r["id"], 7);
  EXPECT_EQ(r["ok"], true);
  EXPECT_EQ(r["result"]["finish_reason"], "cancelled");
  EXPECT_EQ(r["result"]["tokens"].size(), 2u);
  EXPECT_EQ(script_.cancelled_generations.load(), 1);
}

TEST_F(DaemonServerTest, DisconnectCancelsInFlightRequests) {
  start();
  auto observer = connect();
  {
    auto conn = connect();
    hold(conn, 1, "a");
    EXPECT_EQ(stats(observer)["requests"]["in_flight"], 1);
  }  // closes the connection
  EXPECT_TRUE(wait_until([&] { return script_.cancelled_generations.load() == 1; }));
  EXPECT_TRUE(wait_until([&] { return stats(observer)["requests"]["in_flight"] == 0; }));
}

TEST_F(DaemonServerTest, BusyWhenTheQueueIsFull) {
  options_.workers = 1;
  options_.queue_capacity = 1;
  start();
  auto conn = connect();
  ASSERT_NO_FATAL_FAILURE(hold_worker_and_queue(conn));
  json busy = call(conn, {{"id", "third"}, {"op", "load"}, {"model", "b"}});
  EXPECT_EQ(error_code(busy), "busy");
  EXPECT_EQ(stats(conn)["requests"]["busy_rejections"], 1);
  // Cancel the queued one first: while "running" holds the only worker it cannot have started. (The other
  // order raced: the freed worker could pick "queued" up before its cancel arrived.)
  ASSERT_TRUE(conn.send_line(R"({"id": "c2", "op": "cancel", "target": "queued"})").ok());
  ASSERT_TRUE(conn.send_line(R"({"id": "c1", "op": "cancel", "target": "running"})").ok());
  std::map<std::string, json> done;
  ASSERT_TRUE(collect_replies(conn, done, 4));
  EXPECT_EQ(done["c1"]["result"]["cancelled"], true);
  EXPECT_EQ(done["c2"]["result"]["cancelled"], true);
  EXPECT_EQ(done["running"]["result"]["finish_reason"], "cancelled");
  // The queued one was cancelled before it ran: an error, not a result.
  EXPECT_EQ(error_code(done["queued"]), "cancelled");
}

TEST_F(DaemonServerTest, CancelReachesARequestWaitingForItsModel) {
  options_.workers = 2;
  start();
  auto conn = connect();
  json hold = {{"op", "infer"}, {"model", "a"}, {"prompt", "hold"}, {"max_tokens", 1}, {"stream", true}};
  hold["id"] = "first";
  ASSERT_TRUE(conn.send_line(hold.dump()).ok());
  EXPECT_EQ(read_json(conn)["event"], "token");  // "first" holds model a
  hold["id"] = "second";
  ASSERT_TRUE(conn.send_line(hold.dump()).ok());  // a free worker takes it; it waits for a's lock
  auto observer = connect();
  ASSERT_TRUE(wait_until([&] { return stats(observer)["requests"]["in_flight"] == 2; }));
  ASSERT_TRUE(conn.send_line(R"({"id": "c2", "op": "cancel", "target": "second"})").ok());
  std::map<std::string, json> done;
  ASSERT_TRUE(collect_replies(conn, done, 2));
  EXPECT_EQ(done["c2"]["result"]["cancelled"], true);
  EXPECT_EQ(error_code(done["second"]), "cancelled") << "cancelled while the first request still runs";
  EXPECT_EQ(stats(observer)["requests"]["in_flight"], 1);
  ASSERT_TRUE(conn.send_line(R"({"id": "c1", "op": "cancel", "target": "first"})").ok());
  ASSERT_TRUE(collect_replies(conn, done, 4));
  EXPECT_EQ(done["c1"]["result"]["cancelled"], true);
  EXPECT_EQ(done["first"]["result"]["finish_reason"], "cancelled");
}

TEST_F(DaemonServerTest, LoadReportsHitsAndSingleFlight) {
  start();
  auto conn = connect();
  json first = call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}});
  ASSERT_EQ(first["ok"], true);
  EXPECT_EQ(first["result"]["cached"], false);
  EXPECT_EQ(first["result"]["size_bytes"], 1000);
  EXPECT_EQ(first["result"]["streaming"], false);
  json second = call(conn, {{"id", 2}, {"op", "load"}, {"model", "a"}});
  EXPECT_EQ(second["result"]["cached"], true);
  EXPECT_EQ(script_.loads.load(), 1);

  // Two loads of one model at once run one loader.
  ASSERT_TRUE(conn.send_line(R"({"id": "g1", "op": "load", "model": "gated"})").ok());
  ASSERT_TRUE(conn.send_line(R"({"id": "g2", "op": "load", "model": "gated"})").ok());
  auto observer = connect();
  EXPECT_TRUE(wait_until([&] { return stats(observer)["cache"]["coalesced"] == 1; }));
  script_.open_gate();
  json a = read_json(conn);
  json b = read_json(conn);
  EXPECT_EQ(a["ok"], true);
  EXPECT_EQ(b["ok"], true);
  EXPECT_NE(a["result"]["waited"], b["result"]["waited"]);
  EXPECT_EQ(script_.loads.load(), 2);  // a once, gated once
}

TEST_F(DaemonServerTest, BudgetEvictsTheLeastRecentlyUsedOfThreeModels) {
  options_.live.cache_budget_bytes = 2500;  // room for two 1000-byte models
  start();
  auto conn = connect();
  for (const char* m : {"a", "b", "c"})
    ASSERT_EQ(call(conn, {{"id", m}, {"op", "load"}, {"model", m}})["ok"], true);
  json s = stats(conn);
  EXPECT_EQ(s["cache"]["entries"], 2);
  EXPECT_EQ(s["cache"]["total_bytes"], 2000);
  EXPECT_EQ(s["cache"]["evictions_by_cause"]["capacity"], 1);
  auto loaded = [&] {
    std::map<std::string, bool> out;
    json reply = call(conn, {{"id", "l"}, {"op", "list"}});  // keep the reply alive over the loop
    for (const auto& m : reply["result"]["models"])
      out[m["model"].get<std::string>()] = m["loaded"].get<bool>();
    return out;
  };
  auto l = loaded();
  EXPECT_FALSE(l["a"]);
  EXPECT_TRUE(l["b"]);
  EXPECT_TRUE(l["c"]);
  // Touch b, then load a: c is now the least recently used.
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "load"}, {"model", "b"}})["result"]["cached"], true);
  EXPECT_EQ(call(conn, {{"id", 2}, {"op", "load"}, {"model", "a"}})["result"]["cached"], false);
  l = loaded();
  EXPECT_TRUE(l["a"]);
  EXPECT_TRUE(l["b"]);
  EXPECT_FALSE(l["c"]);
  // Evicted backends were released (nobody holds them).
  EXPECT_TRUE(wait_until([&] { return script_.live_backends.load() == 2; }));
}

TEST_F(DaemonServerTest, BudgetIsACapAndLoadAndStatsReportOneSize) {
  options_.live.cache_budget_bytes = 2500;
  write_file(models_ / "huge.gguf", 4000);   // larger than the whole budget
  write_file(models_ / "grows.gguf", 1000);  // estimated at 1000, holds 2000
  start();
  auto conn = connect();
  auto check = [&](const json& reply) {
    json s = stats(conn);
    EXPECT_LE(s["cache"]["total_bytes"].get<uint64_t>(), 2500u) << s.dump();
    uint64_t sum = 0;
    for (const auto& m : s["models"]) {
      sum += m["size_bytes"].get<uint64_t>();
      if (m["model"] == reply["result"]["model"]) {
        EXPECT_EQ(m["size_bytes"], reply["result"]["size_bytes"]) << s.dump();
      }
    }
    EXPECT_EQ(sum, s["cache"]["total_bytes"].get<uint64_t>());
  };
  for (const char* m : {"a", "b", "grows", "c", "a", "grows", "b"}) {
    json r = call(conn, {{"id", m}, {"op", "load"}, {"model", m}});
    ASSERT_EQ(r["ok"], true) << r.dump();
    EXPECT_EQ(r["result"]["size_bytes"], std::string(m) == "grows" ? 2000 : 1000);
    check(r);
    json i = call(conn, {{"id", "i"}, {"op", "infer"}, {"model", m}, {"prompt", "x"}, {"max_tokens", 2}});
    ASSERT_EQ(i["ok"], true) << i.dump();
  }
  const int loads = script_.loads.load();
  const int estimates = script_.estimates.load();
  EXPECT_EQ(estimates, loads) << "one estimate per load, none on a hit";
  json refused = call(conn, {{"id", "h"}, {"op", "load"}, {"model", "huge"}});
  EXPECT_EQ(error_code(refused), "load_failed");
  const std::string message = refused["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("4000 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("2500 bytes"), std::string::npos) << message;
  EXPECT_EQ(script_.loads.load(), loads) << "refused before loading";
  json s = stats(conn);
  EXPECT_EQ(s["cache"]["refused"], 1);
  EXPECT_LE(s["cache"]["total_bytes"].get<uint64_t>(), 2500u);
  EXPECT_GE(s["cache"]["entries"].get<int>(), 1) << "the refusal evicted nothing it did not have to";
}

TEST_F(DaemonServerTest, ZeroBudgetLoadsEveryRequestAndRefusesNothing) {
  options_.live.cache_budget_bytes = 0;
  write_file(models_ / "huge.gguf", 4000);
  start();
  auto conn = connect();
  for (int i = 0; i < 2; ++i) {
    json r = call(conn, {{"id", i}, {"op", "load"}, {"model", "huge"}});
    ASSERT_EQ(r["ok"], true) << r.dump();
    EXPECT_EQ(r["result"]["cached"], false);
    EXPECT_EQ(r["result"]["retained"], false);
    EXPECT_EQ(r["result"]["size_bytes"], 4000);
  }
  EXPECT_EQ(script_.loads.load(), 2);
  EXPECT_EQ(script_.estimates.load(), 0) << "nothing to make room in";
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);
}

TEST_F(DaemonServerTest, IdleEvictionWithAOneSecondTtlSparesModelsInUse) {
  options_.live.idle_ttl = 1s;  // the idle sweep runs every 250 ms (a quarter of the TTL)
  start();
  auto conn = connect();
  // b is in use for the whole test (a held infer); a is loaded and left alone.
  hold(conn, "hold", "b");
  ASSERT_EQ(call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}})["ok"], true);
  auto observer = connect();
  // Sweeps pass while the clock says less than the TTL went by: nothing is evicted.
  advance_and_settle(300ms, observer);
  advance_and_settle(300ms, observer);
  EXPECT_EQ(stats(observer)["cache"]["evictions_by_cause"]["idle"], 0);
  EXPECT_EQ(stats(observer)["models"].size(), 2u);
  // Two seconds later by the clock, the next sweep evicts `a`, idle past its TTL, and spares `b`.
  clock_.advance(2s);
  EXPECT_TRUE(wait_until([&] { return stats(observer)["cache"]["evictions_by_cause"]["idle"] == 1; }, 5s));
  json s = stats(observer);
  ASSERT_EQ(s["models"].size(), 1u);
  EXPECT_EQ(s["models"][0]["model"], "b");
  EXPECT_EQ(s["models"][0]["in_use"], true);
  EXPECT_EQ(call(conn, {{"id", 2}, {"op", "cancel"}, {"target", "hold"}})["result"]["cancelled"], true);
}

TEST_F(DaemonServerTest, KeepAliveZeroUnloadsAfterTheRequestLoadAndInfer) {
  start();
  auto conn = connect();
  // Ollama's idiom: `load` with keep_alive 0 loads (checking the model) and unloads right after.
  json r = call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}, {"keep_alive", 0}});
  ASSERT_EQ(r["ok"], true) << r;
  EXPECT_EQ(r["result"]["retained"], false);
  EXPECT_EQ(r["result"]["keep_alive_s"], 0);
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);
  // An infer with keep_alive 0 answers, then its model is gone; one without it stays.
  r = call(conn, {{"id", 2}, {"op", "infer"}, {"model", "b"}, {"prompt", "x"}, {"keep_alive", 0}});
  ASSERT_EQ(r["ok"], true) << r;
  EXPECT_EQ(r["result"]["keep_alive_s"], 0);
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);
  ASSERT_EQ(call(conn, {{"id", 3}, {"op", "infer"}, {"model", "b"}, {"prompt", "x"}})["ok"], true);
  EXPECT_EQ(stats(conn)["models"].size(), 1u);
  EXPECT_EQ(stats(conn)["cache"]["evictions_by_cause"]["idle"], 2);
  // Bad values are named.
  r = call(conn, {{"id", 4}, {"op", "load"}, {"model", "a"}, {"keep_alive", "5m"}});
  EXPECT_EQ(error_code(r), "bad_request");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("keep_alive"), std::string::npos) << r;
  EXPECT_EQ(error_code(call(conn, {{"id", 5}, {"op", "load"}, {"model", "a"}, {"keep_alive", -1}})),
            "bad_request");
}

TEST_F(DaemonServerTest, KeepAliveZeroSparesAModelAnotherRequestIsUsing) {
  start();
  auto conn = connect();
  hold(conn, "hold", "a");
  auto other = connect();
  json r = call(other, {{"id", 1}, {"op", "load"}, {"model", "a"}, {"keep_alive", 0}});
  ASSERT_EQ(r["ok"], true) << r;
  EXPECT_EQ(r["result"]["retained"], true) << "in use by the held request";
  EXPECT_EQ(stats(other)["cache"]["entries"], 1);
  EXPECT_EQ(call(conn, {{"id", 2}, {"op", "cancel"}, {"target", "hold"}})["result"]["cancelled"], true);
}

TEST_F(DaemonServerTest, KeepAliveIsCutToTheAdminMaximumAndOutlivesTheIdleTtl) {
  options_.live.idle_ttl = 1s;  // sweeps every 250 ms
  options_.live.max_keep_alive = 60s;
  start();
  auto conn = connect();
  json r = call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}, {"keep_alive", 100000}});
  ASSERT_EQ(r["ok"], true) << r;
  EXPECT_EQ(r["result"]["keep_alive_s"], 60) << "cut to CAR_INFERENCE_MAX_KEEP_ALIVE_SECS";
  ASSERT_EQ(call(conn, {{"id", 2}, {"op", "load"}, {"model", "b"}})["result"]["keep_alive_s"], 1.0);
  json m = stats(conn)["models"];
  ASSERT_EQ(m.size(), 2u);
  for (const auto& row : m) {
    if (row["model"] == "a") {
      EXPECT_EQ(row["keep_alive_s"], 60.0);
      EXPECT_EQ(row["idle_ttl_s"], 60.0);
    } else {
      EXPECT_TRUE(row["keep_alive_s"].is_null()) << row;
      EXPECT_EQ(row["idle_ttl_s"], 1.0);
    }
  }
  // Ten seconds on by the cache's clock: b (the 1 s TTL) goes, a (kept alive 60 s) stays.
  clock_.advance(10s);
  ASSERT_TRUE(wait_until([&] { return stats(conn)["cache"]["evictions_by_cause"]["idle"] == 1; }, 5s));
  m = stats(conn)["models"];
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["model"], "a");
  // Past its keep-alive it goes too.
  clock_.advance(60s);
  EXPECT_TRUE(wait_until([&] { return stats(conn)["cache"]["entries"] == 0; }, 5s));
}

TEST_F(DaemonServerTest, AKeepAliveWorksWithIdleEvictionOff) {
  // No cache TTL: the sweep still ends a request's keep-alive (the timer runs at its due time).
  options_.live.idle_ttl = 0s;
  start();
  auto conn = connect();
  ASSERT_EQ(call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}, {"keep_alive", 2}})["ok"], true);
  ASSERT_EQ(call(conn, {{"id", 2}, {"op", "load"}, {"model", "b"}})["result"]["keep_alive_s"], nullptr);
  clock_.advance(5s);
  ASSERT_TRUE(wait_until([&] { return stats(conn)["cache"]["entries"] == 1; }, 10s));
  EXPECT_EQ(stats(conn)["models"][0]["model"], "b") << "no TTL: b is never idle-evicted";
}

TEST_F(DaemonServerTest, PinnedModelsAreNeverIdleEvictedAndShownInStatsAndList) {
  options_.live.idle_ttl = 1s;
  options_.live.pinned_models = {"a"};
  start();
  auto conn = connect();
  json r = call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}, {"keep_alive", 0}});
  ASSERT_EQ(r["ok"], true) << r;
  EXPECT_EQ(r["result"]["pinned"], true);
  EXPECT_EQ(r["result"]["retained"], true) << "keep_alive 0 does not unload a pinned model";
  EXPECT_TRUE(r["result"]["keep_alive_s"].is_null());
  ASSERT_EQ(call(conn, {{"id", 2}, {"op", "load"}, {"model", "b"}})["result"]["pinned"], false);
  clock_.advance(3600s);
  ASSERT_TRUE(wait_until([&] { return stats(conn)["cache"]["evictions_by_cause"]["idle"] == 1; }, 5s));
  json m = stats(conn)["models"];
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["model"], "a");
  EXPECT_EQ(m[0]["pinned"], true);
  EXPECT_TRUE(m[0]["idle_ttl_s"].is_null());
  json list = call(conn, {{"id", 3}, {"op", "list"}})["result"]["models"];
  bool seen = false;
  for (const auto& row : list) {
    if (row["model"] != "a") {
      EXPECT_EQ(row["pinned"], false) << row;
      continue;
    }
    seen = true;
    EXPECT_EQ(row["pinned"], true);
    EXPECT_EQ(row["loaded"], true);
    EXPECT_TRUE(row["idle_eviction_s"].is_null()) << row;
  }
  EXPECT_TRUE(seen) << list;
}
TEST_F(DaemonServerTest, InvalidateEvictsAndReportsWhetherCached) {
  start();
  auto conn = connect();
  ASSERT_EQ(call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}})["ok"], true);
  json r = call(conn, {{"id", 2}, {"op", "invalidate"}, {"model", "a"}});
  EXPECT_EQ(r["result"]["evicted"], true);
  EXPECT_EQ(call(conn, {{"id", 3}, {"op", "invalidate"}, {"model", "a"}})["result"]["evicted"], false);
  EXPECT_EQ(stats(conn)["cache"]["evictions_by_cause"]["invalidate"], 1);
  EXPECT_EQ(call(conn, {{"id", 4}, {"op", "load"}, {"model", "a"}})["result"]["cached"], false);
  EXPECT_EQ(script_.loads.load(), 2);
}

TEST_F(DaemonServerTest, ShutdownAnswersShuttingDownThenCancelsAfterTheGrace) {
  options_.shutdown_grace = 60s;  // on the test's clock, moved past it below
  start();
  auto conn = connect();
  ASSERT_EQ(call(conn, {{"id", 0}, {"op", "load"}, {"model", "c"}})["ok"], true);
  hold(conn, "long", "a");
  auto late = connect();
  ASSERT_EQ(call(late, {{"id", "early"}, {"op", "health"}})["ok"], true);  // accepted before the stop
  server_->request_stop();
  // New requests are refused while the held one runs out its grace period.
  EXPECT_TRUE(wait_until([&] {
    return error_code(call(late, {{"id", "late"}, {"op", "health"}})) == "shutting_down";
  }));
  // The stop armed the grace timer before it refused anything; past the grace the held request is cancelled.
  clock_.advance(61s);
  json r;
  do {
    r = read_json(conn);
  } while (r.is_object() && r["id"] != "long");
  EXPECT_EQ(r["result"]["finish_reason"], "cancelled");
  thread_.join();
  EXPECT_EQ(exit_code_, 0);
  EXPECT_FALSE(std::filesystem::exists(options_.socket_path));
  EXPECT_EQ(script_.saves.load(), 2);  // the shutdown hook saved both cached models
  EXPECT_EQ(script_.live_backends.load(), 0);
}

TEST_F(DaemonServerTest, SocketIs0660AndAStaleSocketIsReplaced) {
  // A stale socket file: bound, then its owner went away.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options_.socket_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  start();
  struct stat st {};
  ASSERT_EQ(::stat(options_.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  auto conn = connect();
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "health"}})["ok"], true);

  // A second server on the same live socket refuses to start.
  Script other_script;
  ScriptedRuntime other_runtime(other_script);
  Server second(options_, other_runtime);
  auto opened = second.open();
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.error().message.find("already listening"), std::string::npos);
}

TEST_F(DaemonServerTest, RefusesToReplaceANonSocketFile) {
  write_file(options_.socket_path, 3);
  Server server(options_, runtime_);
  auto opened = server.open();
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.error().message.find("not a socket"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(options_.socket_path));
}

TEST_F(DaemonServerTest, AllowListRejectsOtherPeers) {
  options_.allowed_uids = {::getuid() + 4242};
  start();
  auto conn = connect();
  // The daemon may already have closed the connection: the write can fail (EPIPE) or succeed.
  (void)conn.send_line(R"({"id": 1, "op": "health"})");
  auto line = conn.read_line(5s);
  ASSERT_FALSE(line.ok()) << "a peer outside the allow-list got an answer";
  EXPECT_EQ(line.error().code, "closed");
}

TEST_F(DaemonServerTest, AllowListAdmitsListedPeers) {
  options_.allowed_gids = {::getgid()};
  start();
  auto conn = connect();
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "health"}})["ok"], true);
}

// --- Hardening against slow and greedy clients ------------------------------------------------------

/// Resident memory of this process (the server runs in it), from /proc/self/statm.
std::size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

/// The one line a refused connection gets, then end of file.
json refusal_of(ClientConnection& conn) {
  json r = read_json(conn, 5s);
  auto after = conn.read_line(5s);
  EXPECT_FALSE(after.ok()) << "the refused connection stays open";
  if (!after.ok()) {
    EXPECT_EQ(after.error().code, "closed");
  }
  return r;
}

TEST_F(DaemonServerTest, ConnectionsPastTheCapsGetOneErrorLineAndAreClosed) {
  options_.live.max_connections = 3;
  options_.live.max_connections_per_uid = 2;
  start();
  auto a = connect();
  auto b = connect();
  ASSERT_EQ(call(a, {{"id", 1}, {"op", "health"}})["ok"], true);
  ASSERT_EQ(call(b, {{"id", 1}, {"op", "health"}})["ok"], true);
  // Every test connection has this process's uid: the third is past the per-uid share.
  auto c = connect();
  json r = refusal_of(c);
  EXPECT_EQ(error_code(r), "too_many_connections");
  EXPECT_TRUE(r["id"].is_null());
  EXPECT_NE(r["error"]["message"].get<std::string>().find("CAR_INFERENCE_MAX_CONNECTIONS_PER_UID=2"),
            std::string::npos);
  json s = stats(a);
  EXPECT_EQ(s["connections"]["open"], 2);
  EXPECT_EQ(s["connections"]["refused"], 1);
  // Closing one makes room again (the server sees the close asynchronously).
  b.close();
  ASSERT_TRUE(wait_until([&] { return stats(a)["connections"]["open"] == 1; }));
  auto d = connect();
  EXPECT_EQ(call(d, {{"id", 2}, {"op", "health"}})["ok"], true);
}

TEST_F(DaemonServerTest, TheTotalCapRefusesWhateverTheUid) {
  options_.live.max_connections = 2;
  options_.live.max_connections_per_uid = 100;
  start();
  auto a = connect();
  auto b = connect();
  ASSERT_EQ(call(b, {{"id", 1}, {"op", "health"}})["ok"], true);
  auto c = connect();
  json r = refusal_of(c);
  EXPECT_EQ(error_code(r), "too_many_connections");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("CAR_INFERENCE_MAX_CONNECTIONS=2"),
            std::string::npos);
  EXPECT_EQ(call(a, {{"id", 2}, {"op", "health"}})["ok"], true) << "the admitted ones are unaffected";
}

TEST_F(DaemonServerTest, AnIncompleteLineTimesOutAnIdleConnectionDoesNot) {
  options_.live.line_timeout = 60s;  // on the test's clock, moved on below; real time never gets there
  start();
  auto idle = connect();
  auto slow = connect();
  auto dribble = connect();
  // Each partial line follows a complete request in the same write: once that one's reply is back and a
  // round trip on another connection has passed the io thread, the session has armed its line timer.
  ASSERT_TRUE(slow.send_raw(R"({"id": 0, "op": "health"})"
                            "\n"
                            R"({"id": 1, "op": "hea)")
                  .ok());
  ASSERT_TRUE(dribble
                  .send_raw(R"({"id": 0, "op": "health"})"
                            "\n"
                            R"({"id": 2,)")
                  .ok());
  EXPECT_EQ(read_json(slow)["ok"], true);
  EXPECT_EQ(read_json(dribble)["ok"], true);
  EXPECT_EQ(call(idle, {{"id", 0}, {"op", "health"}})["ok"], true);
  advance_and_settle(30s, idle);
  // Dribbling bytes does not extend the time: it counts from the line's first byte.
  ASSERT_TRUE(dribble.send_raw(R"( "op":)").ok());
  EXPECT_EQ(stats(idle)["connections"]["line_timeouts"], 0) << "30 s of 60 s";
  clock_.advance(31s);
  json r = read_json(slow, 10s);
  EXPECT_EQ(error_code(r), "line_timeout");
  EXPECT_TRUE(r["id"].is_null());
  auto closed = slow.read_line(5s);
  ASSERT_FALSE(closed.ok());
  EXPECT_EQ(closed.error().code, "closed");
  EXPECT_EQ(error_code(read_json(dribble, 10s)), "line_timeout");
  // The idle connection (no partial line) outlived the timeout and still works; so does a line completed
  // within it.
  EXPECT_EQ(call(idle, {{"id", 3}, {"op", "health"}})["ok"], true);
  ASSERT_TRUE(idle.send_raw(R"({"id": 4, "op")").ok());
  clock_.advance(30s);
  ASSERT_TRUE(idle.send_raw(R"(: "health"})"
                            "\n")
                  .ok());
  EXPECT_EQ(read_json(idle)["ok"], true);
  EXPECT_EQ(stats(idle)["connections"]["line_timeouts"], 2);
}

TEST_F(DaemonServerTest, AClientThatNeverReadsHoldsBoundedOutput) {
  // The measurement: streamed requests pipelined without reading. The daemon stops reading the
  // connection's requests past the bound and cancels streams past twice the bound.
  constexpr std::size_t kBound = 64 * 1024;
  constexpr int kRequests = 480;
  options_.live.max_pending_output_bytes = kBound;
  options_.queue_capacity = 1000;
  start();
  auto greedy = connect();
  auto observer = connect();
  std::string batch;
  for (int i = 0; i < kRequests; ++i) {
    // Long prompts: the requests span several of the daemon's reads, as a real batch would. The first
    // stream alone outgrows the socket's buffer plus twice the bound (20,000 token lines of ~40 bytes), so
    // the cancel past twice the bound is reached whatever the timing of the daemon's reads; the rest are
    // short, so the ones read after the client starts reading finish quickly.
    batch += json({{"id", "r" + std::to_string(i)},
                   {"op", "infer"},
                   {"model", "a"},
                   {"prompt", std::string(1000, 'p')},
                   {"max_tokens", i == 0 ? 20000 : 200},
                   {"stream", true}})
                 .dump() +
             "\n";
  }
  std::thread writer([&] { (void)greedy.send_raw(batch); });  // blocks once the daemon stops reading
  struct Joiner {
    std::thread& thread;
    int fd;
    ~Joiner() {
      if (!thread.joinable()) return;
      ::shutdown(fd, SHUT_RDWR);  // a failed test: unblock the writer
      thread.join();
    }
  } joiner{writer, greedy.fd()};
  // Wait until the daemon has nothing left to do for it: no request in flight and the queue not moving.
  std::size_t queued = 0;
  int observer_calls = 0;  // `requests.total` counts the observer's own stats requests too
  ASSERT_TRUE(wait_until(
      [&] {
        json s = stats(observer);
        ++observer_calls;
        if (s["requests"]["in_flight"] != 0) return false;
        std::size_t now = s["connections"]["queued_bytes"];
        bool settled = now == queued && now > 0;
        queued = now;
        return settled;
      },
      20s));
  json s = stats(observer);
  ++observer_calls;
  EXPECT_GT(s["connections"]["output_overflows"].get<int>(), 0);
  const int n_read = s["requests"]["total"].get<int>() - observer_calls;
  EXPECT_LT(n_read, kRequests) << "the daemon kept reading requests";
  // Now the client reads: every request gets exactly one final reply - a result, or output_overflow for
  // the streams it let pile up - and the daemon reads the rest of its requests as the queue drains.
  std::map<std::string, json> done;
  ASSERT_TRUE(collect_replies(greedy, done, kRequests));
  writer.join();
  int overflowed = 0;
  for (const auto& [id, reply] : done) {
    if (error_code(reply) == "output_overflow") {
      ++overflowed;
      EXPECT_NE(reply["error"]["message"].get<std::string>().find("unread"), std::string::npos);
    } else {
      EXPECT_EQ(reply["ok"], true) << reply.dump();
    }
  }
  EXPECT_GT(overflowed, 0);
  EXPECT_LT(overflowed, kRequests) << "a client that reads gets its results";
  // What docs/protocol.md promises: twice the bound, plus one final reply and at most one token line already
  // on its way when the cancel landed for each request the daemon had read (how many it read before it
  // stopped depends on its reads' timing, so the allowance is computed from them, not fixed).
  std::size_t allowance = 0;
  for (int i = 0; i < n_read; ++i) {
    auto it = done.find("r" + std::to_string(i));
    if (it != done.end()) allowance += it->second.dump().size() + 1;
  }
  allowance += static_cast<std::size_t>(n_read) * 128;  // a token line: {"id":"rN","event":"token",...}
  EXPECT_LE(queued, 2 * kBound + allowance)
      << "unread output beyond twice the bound (plus final lines), " << n_read << " requests read";
  EXPECT_TRUE(wait_until([&] { return stats(observer)["connections"]["queued_bytes"] == 0; }));
}

TEST_F(DaemonServerTest, MemoryOfAThousandConnectionsIsSmallAndReturnedAfterClose) {
  constexpr int kConnections = 1000;
  options_.live.max_connections = 5000;
  options_.live.max_connections_per_uid = 5000;
  options_.live.idle_ttl = 1s;  // the idle sweep (every 250 ms) gives freed memory back
  start();
  auto observer = connect();
  ASSERT_EQ(call(observer, {{"id", 0}, {"op", "health"}})["ok"], true);
  const std::size_t before = rss_bytes();
  // Two rounds of 1000: what the first leaves behind (a page a connection at most, see
  // bench/e2e/connection_memory.py) must be reused by the second, not added to.
  std::size_t during = 0;
  std::size_t after[2] = {0, 0};
  for (int round = 0; round < 2; ++round) {
    std::vector<ClientConnection> conns;
    conns.reserve(kConnections);
    for (int i = 0; i < kConnections; ++i) conns.push_back(connect());
    // Each one asked something once, so its reader ran.
    for (auto& c : conns) ASSERT_TRUE(c.send_line(R"({"id": 1, "op": "health"})").ok());
    for (auto& c : conns) ASSERT_EQ(read_json(c)["ok"], true);
    ASSERT_EQ(stats(observer)["connections"]["open"], kConnections + 1);
    if (round == 0) during = rss_bytes();
    conns.clear();
    ASSERT_TRUE(wait_until([&] { return stats(observer)["connections"]["open"] == 1; }));
    // The idle sweep (every 250 ms here) trims the heap after closes.
    advance_and_settle(300ms, observer);
    after[round] = rss_bytes();
    std::printf(
        "round %d: RSS before %zu KiB, with %d connections %zu KiB (%zu bytes each), after closing %zu KiB\n",
        round, before >> 10, kConnections, during >> 10, (during - std::min(during, before)) / kConnections,
        after[round] >> 10);
  }
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (Sanitizers add their own memory per allocation and hold freed memory back: no figures there.)
  // Before the fix each idle connection held a 64 KiB read buffer (64 MB for 1000) that stayed after close.
  EXPECT_LT(during, before + kConnections * 16 * 1024) << "per-connection memory";
  EXPECT_LT(after[0], before + kConnections * 8 * 1024) << "memory kept after the connections closed";
  EXPECT_LT(after[1], after[0] + 1024 * 1024) << "a second round grew memory instead of reusing it";
#endif
}

TEST_F(DaemonServerTest, ADuplicateIdInFlightIsABadRequest) {
  start();
  auto conn = connect();
  json hold = {{"id", "h"},        {"op", "infer"},   {"model", "a"},
               {"prompt", "hold"}, {"max_tokens", 1}, {"stream", true}};
  ASSERT_TRUE(conn.send_line(hold.dump()).ok());
  EXPECT_EQ(read_json(conn)["event"], "token");
  json dup = call(conn, hold);
  EXPECT_EQ(error_code(dup), "bad_request");
  EXPECT_NE(dup["error"]["message"].get<std::string>().find("already used by a request in flight"),
            std::string::npos);
  json quick = call(conn, {{"id", "h"}, {"op", "health"}});
  EXPECT_EQ(error_code(quick), "bad_request") << "a quick op may not reuse an id in flight either";
  EXPECT_EQ(stats(conn)["requests"]["in_flight"], 1) << "the duplicate did not start";
  // Cancel reaches the one request; after it finished, the id is free again.
  EXPECT_EQ(call(conn, {{"id", "c"}, {"op", "cancel"}, {"target", "h"}})["result"]["cancelled"], true);
  json held = read_json(conn);
  EXPECT_EQ(held["id"], "h");
  EXPECT_EQ(held["result"]["finish_reason"], "cancelled");
  EXPECT_EQ(call(conn, {{"id", "h"}, {"op", "health"}})["ok"], true);
  // Null ids cannot be cancelled and are never duplicates.
  ASSERT_TRUE(conn.send_line(R"({"op": "infer", "model": "a", "prompt": "hi", "max_tokens": 1})").ok());
  ASSERT_TRUE(conn.send_line(R"({"op": "infer", "model": "b", "prompt": "hi", "max_tokens": 1})").ok());
  EXPECT_EQ(read_json(conn)["ok"], true);
  EXPECT_EQ(read_json(conn)["ok"], true);
}

TEST_F(DaemonServerTest, NumericIdsOutsideTheIntegerRangesAreRejectedNotChanged) {
  start();
  auto conn = connect();
  for (const char* raw : {"18446744073709551615", "-9223372036854775808", "0"}) {
    ASSERT_TRUE(conn.send_line(std::string(R"({"op": "health", "id": )") + raw + "}").ok());
    auto line = conn.read_line(5s);
    ASSERT_TRUE(line.ok() && line.value());
    EXPECT_NE(line.value()->find(std::string("\"id\":") + raw + ","), std::string::npos) << **line;
  }
  for (const char* raw : {"-0", "18446744073709551616", "-9223372036854775809", "2.5", "1e2"}) {
    ASSERT_TRUE(conn.send_line(std::string(R"({"op": "health", "id": )") + raw + "}").ok());
    json r = read_json(conn);
    EXPECT_EQ(error_code(r), "bad_request") << raw;
    EXPECT_TRUE(r["id"].is_null()) << raw;
  }
}

TEST_F(DaemonServerTest, ClientStringsInTheLogAreQuotedAndEscaped) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto logger = std::make_shared<spdlog::logger>("capture", sink);
  logger->set_pattern("%v");
  logger->set_level(spdlog::level::info);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  start();
  auto conn = connect();
  // An id, op and model crafted to forge a second log line and to reorder what a terminal shows.
  const std::string forged = "x\nconn=1 id=1 op=load model=tiny outcome=ok ms=1";
  EXPECT_EQ(error_code(call(conn, {{"id", forged}, {"op", "health\n" + forged}})), "unknown_op");
  EXPECT_EQ(error_code(call(conn, {{"id",
                                    "\xe2\x80\xae"
                                    "rlo"},
                                   {"op", "load"},
                                   {"model",
                                    "a\xe2\x80\xa8"
                                    "b"}})),
            "forbidden");
  EXPECT_EQ(error_code(call(conn, {{"id", 5},
                                   {"op", "load"},
                                   {"model",
                                    "bidi\xe2\x81\xa6"
                                    "x"}})),
            "forbidden");
  EXPECT_EQ(error_code(call(conn, {{"id", 6},
                                   {"op", "load"},
                                   {"model",
                                    "c1\xc2\x9b"
                                    "x"}})),
            "forbidden");
  stop();
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  EXPECT_EQ(text.find("\nconn=1 id=1"), std::string::npos) << "a forged line:\n" << text;
  EXPECT_NE(
      text.find(
          R"(id="x\u000Aconn=1 id=1 op=load model=tiny outcome=ok ms=1" op="health\u000Ax\u000Aconn=1)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(id="\u202Erlo" op="load" model="a\u2028b" outcome=forbidden)"), std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(model="bidi\u2066x")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(model="c1\u009Bx")"), std::string::npos) << text;
  for (const char* raw : {"\xe2\x80\xae", "\xe2\x80\xa8", "\xe2\x81\xa6", "\xc2\x9b"}) {
    EXPECT_EQ(text.find(raw), std::string::npos) << "a raw control/bidi character in the log";
  }
}

TEST_F(DaemonServerTest, AFailedStartUpAfterBindingLeavesNoSocketFile) {
  options_.socket_group = "no-such-group-car";
  {
    Server server(options_, runtime_);
    auto opened = server.open();
    ASSERT_FALSE(opened.ok());
    EXPECT_NE(opened.error().message.find("no-such-group-car"), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(options_.socket_path)) << "left behind by a failed start-up";
  // A group that exists but that a non-root daemon may not chown to fails after binding: also cleaned up.
  if (::geteuid() != 0) {
    options_.socket_group = "0";
    Server server(options_, runtime_);
    auto opened = server.open();
    ASSERT_FALSE(opened.ok());
    EXPECT_NE(opened.error().message.find("chown"), std::string::npos) << opened.error().message;
    EXPECT_FALSE(std::filesystem::exists(options_.socket_path));
  }
}

// ---- metrics (docs/metrics.md) ----

/// The `metrics` op's page as {series: value}, e.g. {"car_inference_cache_hits_total", 3}; the page must be
/// well formed (a HELP and TYPE line before each family's samples).
std::map<std::string, double> scrape(ClientConnection& conn) {
  json r = call(conn, {{"id", "m"}, {"op", "metrics"}});
  EXPECT_EQ(r["ok"], true) << r.dump();
  std::map<std::string, double> out;
  std::istringstream in(r["result"]["text"].get<std::string>());
  std::set<std::string> typed;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      typed.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    const std::string series = line.substr(0, space);
    std::string family = series.substr(0, series.find('{'));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (!typed.count(family) && family.size() > s.size() && family.ends_with(s)) {
        family.resize(family.size() - s.size());
      }
    }
    EXPECT_TRUE(typed.count(family)) << "no TYPE line before " << line;
    EXPECT_FALSE(out.count(series)) << "twice: " << series;
    out[series] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST_F(DaemonServerTest, MetricsCountLoadsHitsMissesFailuresEvictionsAndTokens) {
  options_.live.cache_budget_bytes = 2500;  // room for two 1000-byte models
  start();
  auto conn = connect();
  const auto before = scrape(conn);
  EXPECT_EQ(before.at("car_inference_cache_budget_bytes"), 2500);
  EXPECT_EQ(before.at("car_inference_cache_entries"), 0);
  ASSERT_EQ(call(conn, {{"id", 1}, {"op", "load"}, {"model", "a"}})["ok"], true);  // miss, load
  json i =
      call(conn, {{"id", 2}, {"op", "infer"}, {"model", "a"}, {"prompt", "xy"}, {"max_tokens", 3}});  // hit
  ASSERT_EQ(i["ok"], true) << i.dump();
  ASSERT_EQ(call(conn, {{"id", 3}, {"op", "load"}, {"model", "b"}})["ok"], true);  // miss, load
  clock_.advance(120s);  // a and b are 2 minutes old
  ASSERT_EQ(call(conn, {{"id", 4}, {"op", "load"}, {"model", "c"}})["ok"], true);  // miss, load, evicts a
  ASSERT_EQ(call(conn, {{"id", 5}, {"op", "invalidate"}, {"model", "b"}})["result"]["evicted"], true);
  EXPECT_EQ(error_code(call(conn, {{"id", 6}, {"op", "load"}, {"model", "broken"}})), "load_failed");
  EXPECT_EQ(error_code(call(conn, {{"id", 7}, {"op", "no\"such"}})), "unknown_op");
  const auto after = scrape(conn);

  auto moved = [&](const std::string& series) {
    const double b = before.count(series) ? before.at(series) : 0.0;
    EXPECT_TRUE(after.count(series)) << series << " missing";
    return after.count(series) ? after.at(series) - b : -1.0;
  };
  EXPECT_EQ(moved("car_inference_cache_hits_total"), 1);
  EXPECT_EQ(moved("car_inference_cache_misses_total"), 4);
  EXPECT_EQ(moved("car_inference_cache_loads_total"), 4);
  EXPECT_EQ(moved("car_inference_cache_load_failures_total"), 1);
  EXPECT_EQ(moved("car_inference_cache_evictions_total{cause=\"capacity\"}"), 1);
  EXPECT_EQ(moved("car_inference_cache_evictions_total{cause=\"invalidate\"}"), 1);
  EXPECT_EQ(moved("car_inference_cache_evictions_total{cause=\"idle\"}"), 0);
  EXPECT_EQ(after.at("car_inference_cache_entries"), 1);
  EXPECT_EQ(after.at("car_inference_cache_bytes"), 1000);
  // Both evicted models were about 120 s old by the cache's clock: in the le=300 bucket, not le=60.
  for (const char* cause : {"capacity", "invalidate"}) {
    const std::string labels = std::string("cause=\"") + cause + "\"";
    EXPECT_EQ(after.at("car_inference_cache_eviction_age_seconds_bucket{" + labels + ",le=\"60\"}"), 0)
        << cause;
    EXPECT_EQ(after.at("car_inference_cache_eviction_age_seconds_bucket{" + labels + ",le=\"300\"}"), 1)
        << cause;
    EXPECT_EQ(after.at("car_inference_cache_eviction_age_seconds_count{" + labels + "}"), 1) << cause;
    EXPECT_GE(after.at("car_inference_cache_eviction_age_seconds_sum{" + labels + "}"), 120) << cause;
  }
  EXPECT_EQ(moved("car_inference_model_load_seconds_count"), 4) << "every loader run, the failed one too";
  EXPECT_EQ(moved("car_inference_request_queue_wait_seconds_count"), 5) << "four loads and one infer";
  EXPECT_EQ(moved("car_inference_requests_total{op=\"load\",outcome=\"ok\"}"), 3);
  EXPECT_EQ(moved("car_inference_requests_total{op=\"load\",outcome=\"load_failed\"}"), 1);
  EXPECT_EQ(moved("car_inference_requests_total{op=\"infer\",outcome=\"ok\"}"), 1);
  EXPECT_EQ(moved("car_inference_requests_total{op=\"invalidate\",outcome=\"ok\"}"), 1);
  EXPECT_EQ(moved("car_inference_requests_total{op=\"unknown\",outcome=\"unknown_op\"}"), 1)
      << "the client's op text is never a label value";
  EXPECT_EQ(moved("car_inference_requests_total{op=\"metrics\",outcome=\"ok\"}"), 1) << "the first scrape";
  EXPECT_EQ(moved("car_inference_prompt_tokens_total"), 2);
  EXPECT_EQ(moved("car_inference_completion_tokens_total"), 3);
  EXPECT_EQ(moved("car_inference_generations_total{finish_reason=\"length\"}"), 1);
  EXPECT_EQ(moved("car_inference_prompt_seconds_count"), 1);
  EXPECT_EQ(moved("car_inference_decode_seconds_per_token_count"), 1);
  EXPECT_EQ(after.at("car_inference_requests_in_flight"), 0);
  EXPECT_EQ(after.at("car_inference_connections"), 1);
  // What `stats` reports agrees.
  json st = stats(conn);
  EXPECT_EQ(st["cache"]["hits"].get<double>(), after.at("car_inference_cache_hits_total"));
  EXPECT_EQ(st["cache"]["loads"].get<double>(), after.at("car_inference_cache_loads_total"));
}

TEST_F(DaemonServerTest, MetricsCountBusyRejectionsAndShowRequestsInFlight) {
  options_.workers = 1;
  options_.queue_capacity = 1;
  start();
  auto conn = connect();
  ASSERT_NO_FATAL_FAILURE(hold_worker_and_queue(conn));
  EXPECT_EQ(error_code(call(conn, {{"id", "third"}, {"op", "load"}, {"model", "b"}})), "busy");
  auto observer = connect();
  auto m = scrape(observer);
  EXPECT_EQ(m.at("car_inference_requests_in_flight"), 2);
  EXPECT_EQ(m.at("car_inference_requests_running"), 1);
  EXPECT_EQ(m.at("car_inference_requests_queued"), 1);
  EXPECT_EQ(m.at("car_inference_requests_total{op=\"load\",outcome=\"busy\"}"), 1);
  EXPECT_EQ(m.at("car_inference_connections"), 2);
  // Cancel the queued one first (see BusyWhenTheQueueIsFull), then the running one.
  ASSERT_TRUE(conn.send_line(R"({"id": "c2", "op": "cancel", "target": "queued"})").ok());
  ASSERT_TRUE(conn.send_line(R"({"id": "c1", "op": "cancel", "target": "running"})").ok());
  std::map<std::string, json> done;
  ASSERT_TRUE(collect_replies(conn, done, 4));
  m = scrape(observer);
  EXPECT_EQ(m.at("car_inference_requests_in_flight"), 0);
  EXPECT_EQ(m.at("car_inference_requests_total{op=\"infer\",outcome=\"cancelled\"}"), 1);
  EXPECT_EQ(m.at("car_inference_generations_total{finish_reason=\"cancelled\"}"), 1);
}

}  // namespace
}  // namespace car::daemon
