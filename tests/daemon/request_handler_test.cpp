// The request handler behind the socket: every op and error code, cancel, busy, waiting for a model,
// loads and single flight, the cache's budget, idle eviction, keep-alive and pins, invalidate, shutdown and
// its grace, ids, log quoting, and the metrics it records. The server runs in-process with a scripted
// runtime (server_fixture.h).
#include <gtest/gtest.h>

#include "tests/daemon/server_fixture.h"

namespace car::daemon {
namespace {

using namespace server_test;  // the fixture and the helpers it brings (call, read_json, ...)

class DaemonHandlerTest : public ServerFixture {};

TEST_F(DaemonHandlerTest, HealthListStatsAnswer) {
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

TEST_F(DaemonHandlerTest, EveryErrorCode) {
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

TEST_F(DaemonHandlerTest, CancelStopsAnInferWithinOneToken) {
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

TEST_F(DaemonHandlerTest, BusyWhenTheQueueIsFull) {
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

TEST_F(DaemonHandlerTest, CancelReachesARequestWaitingForItsModel) {
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

// deadline_ms cancels a request as `cancel` would, wherever it stands: one generating ends with
// finish_reason "deadline" and its tokens so far, one still waiting for its model with deadline_exceeded.
TEST_F(DaemonHandlerTest, ADeadlineEndsARunningRequestAndOneThatHadNotStarted) {
  options_.workers = 2;
  start();
  auto conn = connect();
  json hold = {{"id", "first"}, {"op", "infer"}, {"model", "a"}, {"prompt", "hold"}, {"max_tokens", 1},
               {"stream", true}, {"deadline_ms", 400}};
  ASSERT_TRUE(conn.send_line(hold.dump()).ok());
  EXPECT_EQ(read_json(conn)["event"], "token");  // "first" is generating, and holds model a
  hold["id"] = "second";
  hold["deadline_ms"] = 100;  // waits for a's lock and passes its deadline there
  ASSERT_TRUE(conn.send_line(hold.dump()).ok());
  std::map<std::string, json> done;
  ASSERT_TRUE(collect_replies(conn, done, 2));
  EXPECT_EQ(error_code(done["second"]), "deadline_exceeded") << done["second"].dump();
  EXPECT_NE(done["second"]["error"]["message"].get<std::string>().find("deadline_ms 100"), std::string::npos);
  EXPECT_EQ(done["first"]["ok"], true) << done["first"].dump();
  EXPECT_EQ(done["first"]["result"]["finish_reason"], "deadline");
  EXPECT_GE(done["first"]["result"]["tokens"].size(), 1u);
  // A deadline that does not pass changes nothing.
  json quick = call(conn, {{"id", "q"}, {"op", "infer"}, {"model", "a"}, {"prompt", "x"}, {"max_tokens", 2},
                           {"deadline_ms", 60000}});
  EXPECT_EQ(quick["ok"], true) << quick.dump();
  EXPECT_NE(quick["result"]["finish_reason"], "deadline");
  EXPECT_EQ(error_code(call(conn, {{"id", "z"}, {"op", "infer"}, {"model", "a"}, {"prompt", "x"},
                                   {"deadline_ms", 0}})),
            "bad_request");
}

TEST_F(DaemonHandlerTest, LoadReportsHitsAndSingleFlight) {
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

TEST_F(DaemonHandlerTest, BudgetEvictsTheLeastRecentlyUsedOfThreeModels) {
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

TEST_F(DaemonHandlerTest, BudgetIsACapAndLoadAndStatsReportOneSize) {
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

TEST_F(DaemonHandlerTest, ZeroBudgetLoadsEveryRequestAndRefusesNothing) {
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

TEST_F(DaemonHandlerTest, IdleEvictionWithAOneSecondTtlSparesModelsInUse) {
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

TEST_F(DaemonHandlerTest, KeepAliveZeroUnloadsAfterTheRequestLoadAndInfer) {
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

TEST_F(DaemonHandlerTest, KeepAliveZeroSparesAModelAnotherRequestIsUsing) {
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

TEST_F(DaemonHandlerTest, KeepAliveIsCutToTheAdminMaximumAndOutlivesTheIdleTtl) {
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

TEST_F(DaemonHandlerTest, AKeepAliveWorksWithIdleEvictionOff) {
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

TEST_F(DaemonHandlerTest, PinnedModelsAreNeverIdleEvictedAndShownInStatsAndList) {
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
TEST_F(DaemonHandlerTest, InvalidateEvictsAndReportsWhetherCached) {
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

TEST_F(DaemonHandlerTest, ShutdownAnswersShuttingDownThenCancelsAfterTheGrace) {
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

TEST_F(DaemonHandlerTest, ADuplicateIdInFlightIsABadRequest) {
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

TEST_F(DaemonHandlerTest, NumericIdsOutsideTheIntegerRangesAreRejectedNotChanged) {
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

TEST_F(DaemonHandlerTest, ClientStringsInTheLogAreQuotedAndEscaped) {
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

TEST_F(DaemonHandlerTest, MetricsCountLoadsHitsMissesFailuresEvictionsAndTokens) {
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

TEST_F(DaemonHandlerTest, MetricsCountBusyRejectionsAndShowRequestsInFlight) {
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
