// The NDJSON front: framing (invalid and oversized lines, any chunking), pipelining and streaming order,
// disconnects, the socket file (mode, stale and foreign files), the allow-list, and the hardening against
// slow and greedy clients (connection caps, line timeouts, bounded output, memory per connection). The
// server runs in-process with a scripted runtime (server_fixture.h).
#include <gtest/gtest.h>

#include "tests/daemon/server_fixture.h"

namespace car::daemon {
namespace {

using namespace server_test;  // the fixture and the helpers it brings (call, read_json, ...)

class DaemonSessionTest : public ServerFixture {};

TEST_F(DaemonSessionTest, InvalidJsonAndOversizedLinesKeepTheConnection) {
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

TEST_F(DaemonSessionTest, EveryRequestIsAnsweredOnceWhateverTheChunking) {
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

TEST_F(DaemonSessionTest, PipelinedRequestsEchoTheirIds) {
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

TEST_F(DaemonSessionTest, StreamingSendsEachTokenThenTheResult) {
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

TEST_F(DaemonSessionTest, DisconnectCancelsInFlightRequests) {
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

TEST_F(DaemonSessionTest, SocketIs0660AndAStaleSocketIsReplaced) {
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

TEST_F(DaemonSessionTest, RefusesToReplaceANonSocketFile) {
  write_file(options_.socket_path, 3);
  Server server(options_, runtime_);
  auto opened = server.open();
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.error().message.find("not a socket"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(options_.socket_path));
}

TEST_F(DaemonSessionTest, AllowListRejectsOtherPeers) {
  options_.allowed_uids = {::getuid() + 4242};
  start();
  auto conn = connect();
  // The daemon may already have closed the connection: the write can fail (EPIPE) or succeed.
  (void)conn.send_line(R"({"id": 1, "op": "health"})");
  auto line = conn.read_line(5s);
  ASSERT_FALSE(line.ok()) << "a peer outside the allow-list got an answer";
  EXPECT_EQ(line.error().code, "closed");
}

TEST_F(DaemonSessionTest, AllowListAdmitsListedPeers) {
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

TEST_F(DaemonSessionTest, ConnectionsPastTheCapsGetOneErrorLineAndAreClosed) {
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

TEST_F(DaemonSessionTest, TheTotalCapRefusesWhateverTheUid) {
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

TEST_F(DaemonSessionTest, AnIncompleteLineTimesOutAnIdleConnectionDoesNot) {
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

TEST_F(DaemonSessionTest, AClientThatNeverReadsHoldsBoundedOutput) {
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

TEST_F(DaemonSessionTest, MemoryOfAThousandConnectionsIsSmallAndReturnedAfterClose) {
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

TEST_F(DaemonSessionTest, AFailedStartUpAfterBindingLeavesNoSocketFile) {
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

}  // namespace
}  // namespace car::daemon
