// The real car-inferenced binary, started on a temporary socket and models directory and driven over the
// socket: every op and error code, SIGTERM (clean exit, socket removed), socket activation (an inherited
// listening fd, LISTEN_FDS=1, LISTEN_PID = the child's pid), bad configuration. With the engine built in,
// also streaming, cancel, disconnect, context overflow, idle and budget eviction and SIGTERM during a long
// infer, on synthetic models (core/synth); without it those tests skip.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/synth/synth_model.h"
#include "tests/daemon/daemon_process.h"
#include "tests/daemon/daemon_test_support.h"
#include "tests/test_support.h"

namespace car {
namespace {

using car::testing::call;
using car::testing::error_code;
using car::testing::read_json;
using car::testing::TempDir;
using car::testing::wait_until;
using nlohmann::json;
using protocol::ClientConnection;
using namespace std::chrono_literals;

using car::testing::DaemonProcess;
using car::testing::kBinary;

/// A listening Unix socket bound at `path` (for socket activation); -1 on failure.
int listening_socket(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}


class DaemonBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kBinary.c_str(), X_OK), 0) << kBinary << " is not built";
    models_ = tmp_ / "models";
    std::filesystem::create_directories(models_);
    std::ofstream(models_ / "garbage.gguf") << "this is not a GGUF file";
    socket_ = (tmp_ / "car.sock").string();
    env_ = {{"CAR_INFERENCE_SOCKET", socket_},
            {"CAR_INFERENCE_MODELS_DIR", models_.string()},
            {"CAR_INFERENCE_STATE_DIR", tmp_.path().string()},
            {"CAR_INFERENCE_THREADS", "1"},
            {"CAR_INFERENCE_LOG_LEVEL", "debug"},
            {"CAR_INFERENCE_SHUTDOWN_GRACE_SECS", "10"}};
  }

  /// Start the daemon and wait until it answers on the socket.
  void start(int activation_fd = -1) {
    daemon_ = std::make_unique<DaemonProcess>(env_, (tmp_ / "daemon.log").string(), activation_fd);
    bool up = wait_until(
        [&] {
          auto c = ClientConnection::connect(socket_);
          return c.ok();
        },
        20s);
    ASSERT_TRUE(up) << "car-inferenced did not come up; log:\n" << daemon_->log();
  }

  ClientConnection connect() {
    auto c = ClientConnection::connect(socket_);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    return std::move(c.value());
  }

  json stats(ClientConnection& conn) { return call(conn, {{"id", "stats"}, {"op", "stats"}})["result"]; }

  TempDir tmp_;
  std::filesystem::path models_;
  std::string socket_;
  std::map<std::string, std::string> env_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(DaemonBinaryTest, AnswersEveryOpAndErrorCode) {
  start();
  auto conn = connect();
  json h = call(conn, {{"id", 1}, {"op", "health"}});
  ASSERT_EQ(h["ok"], true);
  EXPECT_EQ(h["result"]["status"], "ok");
  EXPECT_EQ(h["result"]["engine"], "engine");
  json l = call(conn, {{"id", 2}, {"op", "list"}});
  ASSERT_EQ(l["result"]["models"].size(), 1u);
  EXPECT_EQ(l["result"]["models"][0]["model"], "garbage");
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);
  EXPECT_EQ(call(conn, {{"id", 3}, {"op", "invalidate"}, {"model", "garbage"}})["result"]["evicted"], false);
  EXPECT_EQ(error_code(call(conn, {{"id", 15}, {"op", "invalidate"}, {"model", "absent"}})), "not_found");
  EXPECT_EQ(call(conn, {{"id", 4}, {"op", "cancel"}, {"target", 99}})["result"]["cancelled"], false);

  EXPECT_EQ(error_code(call(conn, {{"id", 5}, {"op", "nope"}})), "unknown_op");
  EXPECT_EQ(error_code(call(conn, {{"id", 6}, {"op", "load"}})), "bad_request");
  EXPECT_EQ(error_code(call(conn, {{"id", 7}, {"op", "load"}, {"model", "../etc"}})), "forbidden");
  EXPECT_EQ(error_code(call(conn, {{"id", 8}, {"op", "load"}, {"model", "absent"}})), "not_found");
  // A file that is not a model: the engine rejects it.
  json bad = call(conn, {{"id", 9}, {"op", "load"}, {"model", "garbage"}});
  EXPECT_EQ(error_code(bad), "load_failed") << bad.dump();
  EXPECT_EQ(error_code(call(conn, {{"id", 10}, {"op", "infer"}, {"model", "garbage"}, {"prompt", "hi"}})),
            "load_failed");
  // Strict schema: a misspelt field is named (with a suggestion), not ignored; "strict": false lets it by.
  json typo =
      call(conn, {{"id", 12}, {"op", "infer"}, {"model", "garbage"}, {"prompt", "hi"}, {"tempreature", 0}});
  EXPECT_EQ(error_code(typo), "bad_request");
  EXPECT_NE(typo.dump().find("unknown field 'tempreature' for op 'infer' (did you mean 'temperature'?)"),
            std::string::npos)
      << typo.dump();
  EXPECT_EQ(typo["id"], 12);
  EXPECT_EQ(error_code(call(conn, {{"id", 13}, {"op", "health"}, {"verbose", true}})), "bad_request");
  EXPECT_EQ(call(conn, {{"id", 14}, {"op", "health"}, {"verbose", true}, {"strict", false}})["ok"], true);
  ASSERT_TRUE(conn.send_raw("{{{\n").ok());
  EXPECT_EQ(error_code(read_json(conn)), "bad_request");
  ASSERT_TRUE(conn.send_raw(std::string((1u << 20) + 100, ' ') + "\n").ok());
  EXPECT_EQ(error_code(read_json(conn)), "bad_request");
  EXPECT_EQ(call(conn, {{"id", 11}, {"op", "health"}})["ok"], true);

  // The log has one info line per request with op and outcome.
  EXPECT_NE(daemon_->log().find(R"(op="load" model="absent" outcome=not_found)"), std::string::npos) << daemon_->log();
  EXPECT_NE(daemon_->log().find("accepted peer pid="), std::string::npos);
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
}

TEST_F(DaemonBinaryTest, SigtermExitsCleanlyAndRemovesTheSocket) {
  start();
  struct stat st {};
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  auto conn = connect();
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "health"}})["ok"], true);
  auto code = daemon_->terminate();
  ASSERT_TRUE(code.has_value()) << "no exit after SIGTERM; log:\n" << daemon_->log();
  EXPECT_EQ(*code, 0) << daemon_->log();
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

TEST_F(DaemonBinaryTest, SigtermTheMomentTheSocketFileAppearsStillExitsCleanly) {
  // The signal handlers are installed before the socket is bound: a supervisor that sees the socket and
  // stops the daemon at once gets a clean exit (0, socket removed), not the default action's 143.
  for (int round = 0; round < 5; ++round) {
    daemon_ = std::make_unique<DaemonProcess>(env_, (tmp_ / "daemon.log").string());
    struct stat st {};
    ASSERT_TRUE(wait_until([&] { return ::stat(socket_.c_str(), &st) == 0; }, 20s, 0ms))
        << "no socket; log:\n" << daemon_->log();
    auto code = daemon_->terminate();
    ASSERT_TRUE(code.has_value()) << "no exit after SIGTERM; log:\n" << daemon_->log();
    ASSERT_EQ(*code, 0) << "round " << round << "; log:\n" << daemon_->log();
    EXPECT_FALSE(std::filesystem::exists(socket_));
  }
}

TEST_F(DaemonBinaryTest, SocketActivationUsesTheInheritedSocketAndLeavesIt) {
  int fd = listening_socket(socket_);
  ASSERT_GE(fd, 0);
  env_["CAR_INFERENCE_SOCKET"] = (tmp_ / "unused.sock").string();  // ignored when activated
  daemon_ = std::make_unique<DaemonProcess>(env_, (tmp_ / "daemon.log").string(), fd);
  ::close(fd);  // the child holds it now
  // The socket is listening already (the kernel queues the connection); the daemon answers once it runs.
  auto conn = connect();
  json h = call(conn, {{"id", 1}, {"op", "health"}});
  EXPECT_EQ(h["ok"], true) << daemon_->log();
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "unused.sock"));
  EXPECT_NE(daemon_->log().find("socket passed by systemd"), std::string::npos) << daemon_->log();
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  EXPECT_TRUE(std::filesystem::exists(socket_));  // systemd owns it: not unlinked
}

TEST_F(DaemonBinaryTest, BadConfigurationStopsStartUpNamingTheVariable) {
  env_["CAR_INFERENCE_MODEL_CACHE_MB"] = "lots";
  DaemonProcess p(env_, (tmp_ / "bad.log").string());
  auto code = p.wait_exit(20s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(p.log().find("CAR_INFERENCE_MODEL_CACHE_MB"), std::string::npos) << p.log();
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

// A configuration the HTTP front refuses is a configuration error like any other: exit 2, found before
// the Unix socket (or anything else) is bound.
TEST_F(DaemonBinaryTest, NonLoopbackHttpWithoutAKeyIsAConfigurationError) {
  env_["CAR_INFERENCE_HTTP"] = "0.0.0.0:1";
  DaemonProcess p(env_, (tmp_ / "bad.log").string());
  auto code = p.wait_exit(20s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(p.log().find("CAR_INFERENCE_HTTP_API_KEY_FILE"), std::string::npos) << p.log();
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

TEST_F(DaemonBinaryTest, IsaSettingPicksTheKernels) {
  // CAR_INFERENCE_ISA reaches the kernels before any load; scalar exists on every CPU.
  env_["CAR_INFERENCE_ISA"] = "scalar";
  start();
  EXPECT_NE(daemon_->log().find("kernels: scalar (CAR_INFERENCE_ISA=scalar"), std::string::npos)
      << daemon_->log();
  EXPECT_EQ(daemon_->terminate(), 0) << daemon_->log();

  env_["CAR_INFERENCE_ISA"] = "mmx";
  DaemonProcess bad(env_, (tmp_ / "bad-isa.log").string());
  auto code = bad.wait_exit(20s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(bad.log().find("CAR_INFERENCE_ISA=mmx: not one of auto, scalar, avx2, avx512 (from environment)"),
            std::string::npos)
      << bad.log();
}

/// Run `car ARGS` (a shell command line); returns {exit code, stdout+stderr}.
/// Standard output of a shell command line.
std::string run_shell_env(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  ::pclose(p);
  return out;
}

std::pair<int, std::string> run_car(const std::string& args) {
  const std::string cmd = std::string(CAR_BINARY_DIR) + "/tools/car " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST_F(DaemonBinaryTest, WarnsAtStartUpAboutAMissingOrEmptyModelsDirectory) {
  start();  // "garbage.gguf" counts as a model file: no warning
  EXPECT_EQ(daemon_->log().find("holds no models"), std::string::npos) << daemon_->log();
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  std::filesystem::remove(models_ / "garbage.gguf");
  start();
  EXPECT_NE(daemon_->log().find("holds no models"), std::string::npos) << daemon_->log();
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  env_["CAR_INFERENCE_MODELS_DIR"] = (tmp_ / "nowhere").string();
  start();
  EXPECT_NE(daemon_->log().find("does not exist"), std::string::npos) << daemon_->log();
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
}

TEST_F(DaemonBinaryTest, CarClientCommandsTalkToTheDaemon) {
  start();
  const std::string sock = " --socket " + socket_;
  auto [hc, health] = run_car("health" + sock);
  EXPECT_EQ(hc, 0) << health;
  EXPECT_EQ(health.rfind("ok (engine: ", 0), 0u) << health;
  auto [lc, list] = run_car("list --json" + sock);
  ASSERT_EQ(lc, 0) << list;
  json l = json::parse(list, nullptr, false);
  ASSERT_FALSE(l.is_discarded()) << list;
  EXPECT_EQ(l["result"]["models"][0]["model"], "garbage");
  EXPECT_TRUE(l["result"]["models"][0]["arch"].is_null());  // not a GGUF file
  EXPECT_TRUE(l["result"]["models"][0]["idle_eviction_s"].is_null());
  auto [sc, stats_out] = run_car("stats" + sock);
  EXPECT_EQ(sc, 0);
  EXPECT_NE(stats_out.find("cache: "), std::string::npos) << stats_out;
  auto [ic, inv] = run_car("invalidate garbage" + sock);
  EXPECT_EQ(ic, 0);
  EXPECT_NE(inv.find("was not loaded"), std::string::npos) << inv;
  auto [xc, absent] = run_car("invalidate absent" + sock);  // no such model: not "was not loaded"
  EXPECT_EQ(xc, 1) << absent;
  EXPECT_NE(absent.find("not_found"), std::string::npos) << absent;
  // Errors: the daemon's code and message, exit 1; no daemon at all, exit 3.
  auto [nc, missing] = run_car("load absent" + sock);
  EXPECT_EQ(nc, 1);
  EXPECT_NE(missing.find("not_found"), std::string::npos) << missing;
  auto [fc, forbidden] = run_car("infer ../x hello" + sock);
  EXPECT_EQ(fc, 1);
  EXPECT_NE(forbidden.find("forbidden"), std::string::npos) << forbidden;
  auto [uc, unreachable] = run_car("health --socket " + (tmp_ / "nobody.sock").string());
  EXPECT_EQ(uc, 3) << unreachable;
  EXPECT_NE(unreachable.find("cannot connect"), std::string::npos) << unreachable;
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
}

// ---- with the engine --------------------------------------------------------------------------------------

// n_layer 0: the model of the streaming/cancel tests - big enough that ~1900 tokens take a good fraction
// of a second, so a cancel or a disconnect lands while it still generates.
void write_model(const std::filesystem::path& path, uint64_t seed, uint32_t n_layer = 0,
                 const std::string& chat_template = "") {
  synth::SynthSpec spec = synth::tiny_spec("llama");
  spec.seed = seed;
  spec.chat_template = chat_template;
  if (n_layer == 0) {
    spec.n_layer = 4;
    spec.n_embd = 128;
    spec.n_ff = 384;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.head_dim = 0;
    spec.n_vocab = 512;
    spec.weight_type = "f16";
  } else {
    spec.n_layer = n_layer;
  }
  spec.n_ctx = 2048;
  auto ok = synth::write_synth_model(spec, path.string());
  ASSERT_TRUE(ok.ok()) << ok.error().message;
}

class DaemonBinaryEngineTest : public DaemonBinaryTest {
 protected:
  void SetUp() override {
    DaemonBinaryTest::SetUp();
    write_model(models_ / "tiny.gguf", 1);
  }
  json infer_request(json id, int max_tokens, bool stream) {
    return {{"id", id},          {"op", "infer"},          {"model", "tiny"},     {"prompt", "Hello world"},
            {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
  }
};

// `car show/run/bench ID` look a model id up where a running daemon serves its models, when neither
// --models-dir nor CAR_INFERENCE_MODELS_DIR says otherwise (the models directory here is the test's own).
TEST_F(DaemonBinaryEngineTest, OfflineCommandsFindModelIdsWhereTheDaemonServes) {
  start();
  const std::string env = "env -u CAR_INFERENCE_MODELS_DIR CAR_INFERENCE_SOCKET=" + socket_ + " ";
  auto run = [&](const std::string& args) {
    const std::string cmd = env + std::string(CAR_BINARY_DIR) + "/tools/car " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (p != nullptr) {
      const std::size_t n = std::fread(buf, 1, sizeof(buf), p);
      if (n == 0) break;
      out.append(buf, n);
    }
    const int st = p != nullptr ? ::pclose(p) : -1;
    return std::pair<int, std::string>(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  auto [sc, show] = run("show tiny --json");
  EXPECT_EQ(sc, 0) << show;
  EXPECT_NE(show.find((models_ / "tiny.gguf").string()), std::string::npos) << show;
  auto [rc, ran] = run("run tiny hello -n 2 --temperature 0");
  EXPECT_EQ(rc, 0) << ran;
  auto [bc, bench] = run("bench tiny -p 4 -n 2 -r 1");
  EXPECT_EQ(bc, 0) << bench;
  auto [nc, none] = run("run absent hello");
  EXPECT_EQ(nc, 2) << none;
  EXPECT_NE(none.find("the running daemon's models directory"), std::string::npos) << none;
  // Bash completion offers the daemon's model ids after the commands that take a model.
  std::ofstream(models_ / "other.gguf") << "not a model, but listed";
  auto complete = [&](const std::string& words, int cword) {
    const std::string script = "source " + std::string(CAR_SOURCE_DIR) +
                               "/packaging/completion/car.bash; COMP_WORDS=(" + words + "); COMP_CWORD=" +
                               std::to_string(cword) + "; _car; for c in \"${COMPREPLY[@]}\"; do echo \"$c\"; done | sort";
    return run_shell_env("env -u CAR_INFERENCE_MODELS_DIR CAR_INFERENCE_SOCKET=" + socket_ + " PATH=" +
                         std::string(CAR_BINARY_DIR) + "/tools:$PATH bash -c '" + script + "'");
  };
  EXPECT_EQ(complete("car infer ''", 2), "garbage\nother\ntiny\n");
  EXPECT_EQ(complete("car load t", 2), "tiny\n");
  EXPECT_EQ(complete("car invalidate o", 2), "other\n");
}

TEST_F(DaemonBinaryEngineTest, StreamsTokensThenTheResult) {
  start();
  auto conn = connect();
  json load = call(conn, {{"id", "l"}, {"op", "load"}, {"model", "tiny"}});
  ASSERT_EQ(load["ok"], true) << load.dump() << daemon_->log();
  EXPECT_EQ(load["result"]["cached"], false);
  EXPECT_GT(load["result"]["size_bytes"].get<uint64_t>(), 0u);
  std::vector<json> events;
  json r = call(conn, infer_request(1, 12, true), &events);
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["result"]["finish_reason"], "length");
  EXPECT_EQ(r["result"]["tokens"].size(), 12u);
  std::string joined;
  std::size_t real_tokens = 0;
  for (const auto& e : events) {
    EXPECT_EQ(e["event"], "token");
    joined += e["text"].get<std::string>();
    if (e["token"] != -1) ++real_tokens;  // -1: held-back text flushed at the end
  }
  EXPECT_EQ(real_tokens, 12u);
  EXPECT_EQ(joined, r["result"]["text"].get<std::string>());
  // Greedy decoding is deterministic: the same request gives the same tokens, from the cache.
  json again = call(conn, infer_request(2, 12, false));
  EXPECT_EQ(again["result"]["tokens"], r["result"]["tokens"]);
  EXPECT_EQ(stats(conn)["cache"]["loads"], 1);
}

TEST_F(DaemonBinaryEngineTest, MessagesAreRenderedWithTheModelsOrTheRequestsTemplate) {
  const std::string tpl =
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}";
  synth::SynthSpec spec = synth::tiny_spec("llama");
  spec.seed = 5;
  spec.chat_template = tpl;
  ASSERT_TRUE(synth::write_synth_model(spec, (models_ / "chatty.gguf").string()).ok());
  start();
  auto conn = connect();
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hello world"}}});
  auto infer = [&](const std::string& model, json fields) {
    json req = {{"id", "c"}, {"op", "infer"}, {"model", model}, {"max_tokens", 6}, {"temperature", 0}};
    req.update(fields);
    return call(conn, req);
  };
  json r = infer("chatty", {{"messages", messages}});
  ASSERT_EQ(r["ok"], true) << r.dump() << daemon_->log();
  EXPECT_EQ(r["result"]["chat_template"], "model");
  // The rendered conversation holds no special-token text, so as a plain prompt it gives the same tokens.
  json plain = infer("chatty", {{"prompt", "system: Be brief.\nuser: Hello world\nassistant:"}});
  ASSERT_EQ(plain["ok"], true) << plain.dump();
  EXPECT_FALSE(plain["result"].contains("chat_template"));
  EXPECT_EQ(r["result"]["usage"]["prompt_tokens"], plain["result"]["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["result"]["tokens"], plain["result"]["tokens"]);
  json no_opening = infer("chatty", {{"messages", messages}, {"add_generation_prompt", false}});
  ASSERT_EQ(no_opening["ok"], true) << no_opening.dump();
  EXPECT_LT(no_opening["result"]["usage"]["prompt_tokens"].get<int>(),
            r["result"]["usage"]["prompt_tokens"].get<int>());
  // A template in the request renders for a model without one, and is named as the one used.
  json over = infer("tiny", {{"messages", messages}, {"chat_template", "{{ messages[1].content }}"}});
  ASSERT_EQ(over["ok"], true) << over.dump();
  EXPECT_EQ(over["result"]["chat_template"], "request");
  json same = infer("tiny", {{"prompt", "Hello world"}});
  EXPECT_EQ(over["result"]["tokens"], same["result"]["tokens"]);
  // Clear errors, and the daemon keeps serving.
  json none = infer("tiny", {{"messages", messages}});
  EXPECT_EQ(none["error"]["code"], "bad_request") << none.dump();
  EXPECT_NE(none["error"]["message"].get<std::string>().find("no chat template"), std::string::npos);
  // The socket's own way to give one (HTTP and car chat name theirs).
  EXPECT_NE(none["error"]["message"].get<std::string>().find("the request's \"chat_template\" field"),
            std::string::npos)
      << none.dump();
  json broken = infer("tiny", {{"messages", messages}, {"chat_template", "{% for m in messages %}{{ m.role }"}});
  EXPECT_EQ(broken["error"]["code"], "bad_request") << broken.dump();
  EXPECT_NE(broken["error"]["message"].get<std::string>().find("chat template"), std::string::npos);
  json rejected = infer("tiny", {{"messages", messages}, {"chat_template", "{{ raise_exception('user turns only') }}"}});
  EXPECT_EQ(rejected["error"]["code"], "bad_request") << rejected.dump();
  EXPECT_NE(rejected["error"]["message"].get<std::string>().find("user turns only"), std::string::npos);
  json both = infer("chatty", {{"messages", messages}, {"prompt", "x"}});
  EXPECT_EQ(both["error"]["code"], "bad_request");
  EXPECT_EQ(infer("chatty", {{"messages", messages}})["result"]["tokens"], r["result"]["tokens"]);
}

// Issue #23: a request's template or conversation cannot crash the daemon or hold a worker. Each of these
// killed car-inferenced (stack overflow) or kept a worker for 17-18 s after a cancel.
TEST_F(DaemonBinaryEngineTest, HostileChatRequestsAreRefusedAndCancellable) {
  start();
  auto conn = connect();
  const json messages = json::array({{{"role", "user"}, {"content", "Hello world"}}});
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  auto infer = [&](const json& id, const std::string& tpl) {
    return call(conn, {{"id", id},
                       {"op", "infer"},
                       {"model", "tiny"},
                       {"max_tokens", 2},
                       {"messages", messages},
                       {"chat_template", tpl}});
  };
  for (const std::string& tpl :
       {"{{ 1" + repeat("+1", 9999) + " }}", "{{ messages" + repeat(".a", 30000) + " }}",
        "{{ messages" + repeat("|e", 60000) + " }}"}) {
    json r = infer("t", tpl);
    EXPECT_EQ(error_code(r), "bad_request") << r.dump().substr(0, 300) << daemon_->log();
    EXPECT_NE(r.dump().find("nests deeper than"), std::string::npos) << r.dump().substr(0, 300);
  }
  // A message nested 30,000 deep: refused before it is parsed, with its id echoed. (Sent as text: the
  // test's own json::dump recurses.)
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  ASSERT_TRUE(
      conn.send_line(
              R"({"id":"d","op":"infer","model":"tiny","max_tokens":2,"chat_template":"{{ messages[0].content }}","messages":[{"role":"user","content":)" +
              deep + "}]}")
          .ok());
  json r = read_json(conn);
  EXPECT_EQ(r["id"], "d") << r.dump().substr(0, 300);
  EXPECT_EQ(error_code(r), "bad_request") << r.dump().substr(0, 300);
  EXPECT_NE(r.dump().find("nests deeper than 128"), std::string::npos) << r.dump().substr(0, 300);
  // A template that would loop for a billion steps: `cancel` stops the render, answered as cancelled.
  const std::string loops =
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}"
      "{% endfor %}";
  ASSERT_TRUE(conn.send_line(json({{"id", "slow"},
                                   {"op", "infer"},
                                   {"model", "tiny"},
                                   {"max_tokens", 2},
                                   {"messages", messages},
                                   {"chat_template", loops}})
                                 .dump())
                  .ok());
  {
    // The render is under way once the model is loaded and the request holds it (it renders next).
    auto observer = connect();
    ASSERT_TRUE(wait_until(
        [&] {
          const json m = stats(observer)["models"];
          return m.is_array() && m.size() == 1 && m[0].value("in_use", false);
        },
        30s))
        << daemon_->log();
  }
  const auto cancel_at = std::chrono::steady_clock::now();
  json c = call(conn, {{"id", "c"}, {"op", "cancel"}, {"target", "slow"}});
  EXPECT_EQ(c["result"]["cancelled"], true) << c.dump();
  r = read_json(conn, 10s);
  EXPECT_EQ(r["id"], "slow") << r.dump();
  EXPECT_EQ(error_code(r), "cancelled") << r.dump();
  EXPECT_NE(r.dump().find("while its chat template rendered"), std::string::npos) << r.dump();
  EXPECT_LT(std::chrono::steady_clock::now() - cancel_at, 3s);
  // The daemon still answers.
  EXPECT_EQ(call(conn, {{"id", "h"}, {"op", "health"}})["ok"], true);
  json ok = infer("ok", "{{ messages[0].content }}");
  EXPECT_EQ(ok["ok"], true) << ok.dump();
}

TEST_F(DaemonBinaryEngineTest, CarChatKeepsTheConversationResetsAndCancelsAnAnswer) {
  // The streaming model's shape (an answer of ~2000 tokens takes a while) with a template.
  write_model(models_ / "chatty.gguf", 7, 0,
              "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
              "{% if add_generation_prompt %}a:{% endif %}");
  start();
  auto conn = connect();
  auto answer = [&](const json& messages) {
    json r = call(conn, {{"id", "a"}, {"op", "infer"}, {"model", "chatty"}, {"messages", messages},
                         {"max_tokens", 4}, {"temperature", 0}});
    EXPECT_EQ(r["ok"], true) << r.dump();
    return r["result"]["text"].get<std::string>();
  };
  const std::string a1 = answer({{{"role", "user"}, {"content", "Hello"}}});
  const std::string a2 = answer({{{"role", "user"}, {"content", "Hello"}},
                                 {{"role", "assistant"}, {"content", a1}},
                                 {{"role", "user"}, {"content", "And then?"}}});
  const std::string a3 = answer({{{"role", "user"}, {"content", "Fresh start"}}});
  const std::string sock = " --socket " + socket_;
  const std::string input = (tmp_.path() / "turns.txt").string();
  {
    std::ofstream(input) << "Hello\nAnd then?\n/reset\nFresh start\n";
  }
  auto [cc, out] = run_car("chat chatty -n 4 --temperature 0" + sock + " < " + input);
  ASSERT_EQ(cc, 0) << out;
  const auto p1 = out.find(a1 + "\n"), p2 = out.find(a2 + "\n", p1 + a1.size());
  const auto reset = out.find("[conversation reset]"), p3 = out.find(a3 + "\n", reset);
  EXPECT_NE(p1, std::string::npos) << out;
  EXPECT_NE(p2, std::string::npos) << out;
  EXPECT_NE(reset, std::string::npos) << out;
  EXPECT_NE(p3, std::string::npos) << out;
  // A model without a template: the daemon's reason, exit 1.
  auto [nc, none] = run_car("chat tiny" + sock + " < " + input);
  EXPECT_EQ(nc, 1) << none;
  EXPECT_NE(none.find("no chat template"), std::string::npos) << none;
  EXPECT_EQ(none.find("car chat:"), 0u) << "a refusal before any answer text prints no empty line first: " << none;
  // Ctrl-C while an answer streams stops that answer, not the program: it goes on reading turns.
  const std::string text_out = (tmp_.path() / "chat.out").string();
  const std::string pidfile = (tmp_.path() / "chat.pid").string();
  const std::string cmd =
      "sh -c '" + std::string(CAR_BINARY_DIR) + "/tools/car chat chatty -n 2000 --temperature 0" + sock +
      " > " + text_out + " 2> " + text_out + ".err < " + (tmp_.path() / "fifo").string() + " & echo $! > " +
      pidfile + "; wait $!'";
  ASSERT_EQ(::mkfifo((tmp_.path() / "fifo").c_str(), 0600), 0);
  FILE* runner = ::popen(cmd.c_str(), "r");
  ASSERT_NE(runner, nullptr);
  {
    std::ofstream fifo(tmp_.path() / "fifo");  // opens once car has the read end
    fifo << "Tell a long story\n" << std::flush;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    std::error_code ec;
    while (std::filesystem::file_size(text_out, ec) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    std::string pid_text;
    while (pid_text.empty() && std::chrono::steady_clock::now() < deadline) {
      std::ifstream(pidfile) >> pid_text;
      if (pid_text.empty()) std::this_thread::sleep_for(5ms);
    }
    ASSERT_FALSE(pid_text.empty());
    ASSERT_EQ(::kill(static_cast<pid_t>(std::stol(pid_text)), SIGINT), 0);
    // The next turn goes in once car has stopped the answer (it says so on stderr).
    ASSERT_TRUE(wait_until(
        [&] {
          std::ostringstream err;
          err << std::ifstream(text_out + ".err").rdbuf();
          return err.str().find("[cancelled]") != std::string::npos;
        },
        30s));
    fifo << "/reset\n" << std::flush;  // the program still reads turns
  }  // closing the fifo: end of input, car leaves
  const int st = ::pclose(runner);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  std::ostringstream err, text;
  err << std::ifstream(text_out + ".err").rdbuf();
  text << std::ifstream(text_out).rdbuf();
  const auto cancelled = err.str().find("[cancelled]");
  EXPECT_NE(cancelled, std::string::npos) << err.str();
  EXPECT_NE(err.str().find("[conversation reset]", cancelled), std::string::npos) << err.str();
  EXPECT_FALSE(text.str().empty());
}

TEST_F(DaemonBinaryEngineTest, SeedIsReturnedAndLogprobsComeWithEachToken) {
  start();
  auto conn = connect();
  // No seed: a fresh one per request, returned; sending it back reproduces the sampled answer.
  auto sampled = [&](json id, std::optional<uint64_t> seed) {
    json req = {{"id", id},
                {"op", "infer"},
                {"model", "tiny"},
                {"prompt", "Hello world"},
                {"max_tokens", 16},
                {"temperature", 1.5},
                {"top_k", 0},
                {"top_p", 1},
                {"min_p", 0},
                {"ignore_eos", true},
                {"repeat_penalty", 1.1},
                {"repeat_last_n", 8}};
    if (seed) req["seed"] = *seed;
    json r = call(conn, req);
    EXPECT_EQ(r["ok"], true) << r.dump();
    return r["result"];
  };
  json a = sampled(1, std::nullopt);
  json b = sampled(2, std::nullopt);
  ASSERT_TRUE(a["seed"].is_number_unsigned()) << a.dump();
  EXPECT_NE(a["seed"], b["seed"]);
  json a_again = sampled(3, a["seed"].get<uint64_t>());
  EXPECT_EQ(a_again["seed"], a["seed"]);
  EXPECT_EQ(a_again["tokens"], a["tokens"]);
  EXPECT_EQ(sampled(4, 42)["seed"], 42);

  // logprobs / top_logprobs: one entry per generated token in the result, the same on each token event.
  json req = infer_request(5, 6, true);
  req["top_logprobs"] = 3;
  std::vector<json> events;
  json r = call(conn, req, &events);
  ASSERT_EQ(r["ok"], true) << r.dump();
  const json& lps = r["result"]["logprobs"];
  ASSERT_EQ(lps.size(), 6u) << r.dump();
  std::size_t i = 0;
  for (const auto& e : events) {
    if (e["token"] == -1) {
      EXPECT_FALSE(e.contains("logprob"));
      continue;
    }
    ASSERT_LT(i, lps.size());
    const json& lp = lps[i];
    EXPECT_EQ(lp["token"], r["result"]["tokens"][i]);
    EXPECT_TRUE(lp["text"].is_string());
    EXPECT_LE(lp["logprob"].get<double>(), 0.0);
    ASSERT_EQ(lp["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one, with the same logprob.
    EXPECT_EQ(lp["top_logprobs"][0]["token"], lp["token"]);
    EXPECT_EQ(lp["top_logprobs"][0]["logprob"], lp["logprob"]);
    EXPECT_GE(lp["top_logprobs"][1]["logprob"].get<double>(), lp["top_logprobs"][2]["logprob"].get<double>());
    EXPECT_TRUE(lp["top_logprobs"][1]["text"].is_string());
    EXPECT_EQ(e["logprob"], lp["logprob"]);
    EXPECT_EQ(e["top_logprobs"], lp["top_logprobs"]);
    ++i;
  }
  EXPECT_EQ(i, 6u);
  // Without them: no logprobs key, events without logprob.
  json plain = call(conn, infer_request(6, 2, false));
  EXPECT_FALSE(plain["result"].contains("logprobs"));
  json only = infer_request(7, 2, false);
  only["logprobs"] = true;
  json o = call(conn, only);
  ASSERT_EQ(o["result"]["logprobs"].size(), 2u);
  EXPECT_TRUE(o["result"]["logprobs"][0]["top_logprobs"].empty());
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
}

TEST_F(DaemonBinaryEngineTest, CarInferStreamsAndLoadReports) {
  start();
  const std::string sock = " --socket " + socket_;
  auto [lc, load] = run_car("load tiny" + sock);
  EXPECT_EQ(lc, 0) << load;
  EXPECT_NE(load.find("tiny: loaded"), std::string::npos) << load;
  auto [jc, json_out] = run_car("infer tiny Hello -n 6 --temperature 0 --json" + sock);
  ASSERT_EQ(jc, 0) << json_out;
  json r = json::parse(json_out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << json_out;
  // list: one row per model with column headers, what its header says, and whether it is loaded.
  auto [lsc, listing] = run_car("list" + sock);
  ASSERT_EQ(lsc, 0) << listing;
  EXPECT_NE(listing.find("MODEL"), std::string::npos) << listing;
  EXPECT_NE(listing.find("IDLE EVICTION"), std::string::npos) << listing;
  const auto row_start = listing.find("  tiny ");
  ASSERT_NE(row_start, std::string::npos) << listing;
  const std::string row = listing.substr(row_start, listing.find('\n', row_start) - row_start);
  EXPECT_NE(row.find("llama"), std::string::npos) << row;
  EXPECT_NE(row.find(" yes "), std::string::npos) << row;
  EXPECT_NE(row.find(" in "), std::string::npos) << row;  // idle eviction countdown (default TTL 300 s)
  auto [ljc, list_json] = run_car("list --json" + sock);
  ASSERT_EQ(ljc, 0) << list_json;
  json lj;
  const json listed = json::parse(list_json);
  for (const auto& m : listed["result"]["models"]) {
    if (m["model"] == "tiny") lj = m;  // "garbage" (not GGUF) sorts first
  }
  ASSERT_TRUE(lj.is_object()) << list_json;
  EXPECT_EQ(lj["arch"], "llama");
  EXPECT_GT(lj["params"].get<uint64_t>(), 0u);
  EXPECT_TRUE(lj["quant"].is_string());
  EXPECT_EQ(lj["context_length"], 2048);
  EXPECT_GT(lj["idle_eviction_s"].get<double>(), 250.0);
  // stats: headers, and the size the load reply gave.
  auto [sc, stats_text] = run_car("stats" + sock);
  ASSERT_EQ(sc, 0) << stats_text;
  EXPECT_NE(stats_text.find("SIZE"), std::string::npos) << stats_text;
  auto [sjc, stats_json] = run_car("stats --json" + sock);
  auto [ljc2, load_json] = run_car("load tiny --json" + sock);
  ASSERT_EQ(ljc2, 0) << load_json;
  const json loaded = json::parse(load_json)["result"];
  EXPECT_EQ(json::parse(stats_json)["result"]["models"][0]["size_bytes"], loaded["size_bytes"]);  // only tiny is cached
  EXPECT_EQ(loaded["context_length"], 2048);  // the trained context (it fits the memory cap)
  auto [ic, text] = run_car("infer tiny Hello -n 6 --temperature 0" + sock);
  EXPECT_EQ(ic, 0) << text;
  // The streamed text, then a newline, then the summary line (stderr, merged here).
  EXPECT_EQ(text.rfind(r["result"]["text"].get<std::string>() + "\n[", 0), 0u) << text;
  EXPECT_NE(text.find("finish: "), std::string::npos);
}

TEST_F(DaemonBinaryEngineTest, CarInferSendsTheSamplerAndLogprobOptions) {
  start();
  const std::string sock = " --socket " + socket_;
  // --ignore-eos: exactly -n tokens; --top-logprobs 2: an entry per token with two alternatives. The other
  // options in range are accepted by the daemon's strict parser (an unknown field would be bad_request).
  auto [jc, out] = run_car("infer tiny Hello -n 5 --temperature 0 --ignore-eos --top-logprobs 2 --min-p 0.01 "
                           "--repeat-penalty 1.1 --repeat-last-n 8 --num-ctx 256 --json" + sock);
  ASSERT_EQ(jc, 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;
  EXPECT_EQ(r["result"]["finish_reason"], "length") << out;
  EXPECT_EQ(r["result"]["tokens"].size(), 5u) << out;
  ASSERT_EQ(r["result"]["logprobs"].size(), 5u) << out;
  EXPECT_EQ(r["result"]["logprobs"][0]["top_logprobs"].size(), 2u) << out;
  // Without --json: the text, then one table row per token (the token quoted, its logprob, alternatives).
  auto [tc, table] = run_car("infer tiny Hello -n 3 --temperature 0 --ignore-eos --logprobs" + sock);
  ASSERT_EQ(tc, 0) << table;
  EXPECT_NE(table.find("TOKEN"), std::string::npos) << table;
  EXPECT_NE(table.find("LOGPROB"), std::string::npos) << table;
  std::size_t rows = 0;
  for (std::size_t at = table.find("\n\""); at != std::string::npos; at = table.find("\n\"", at + 1)) ++rows;
  EXPECT_EQ(rows, 3u) << table;
  // --num-ctx reaches the daemon: a window too small for the prompt and -n is the daemon's error (exit 1).
  auto [nc, narrow] = run_car("infer tiny Hello -n 8 --num-ctx 4" + sock);
  EXPECT_EQ(nc, 1) << narrow;
  EXPECT_NE(narrow.find("context_overflow"), std::string::npos) << narrow;
  // Out of range: refused before connecting, exit 2, the option named as typed.
  auto [mc, bad_min_p] = run_car("infer tiny Hello --min-p 2" + sock);
  EXPECT_EQ(mc, 2) << bad_min_p;
  EXPECT_NE(bad_min_p.find("--min-p must be in [0, 1]"), std::string::npos) << bad_min_p;
  auto [kc, bad_top] = run_car("infer tiny Hello --top-logprobs 21" + sock);
  EXPECT_EQ(kc, 2) << bad_top;
  EXPECT_NE(bad_top.find("--top-logprobs"), std::string::npos) << bad_top;
  auto [pc, bad_penalty] = run_car("infer tiny Hello --repeat-penalty 0" + sock);
  EXPECT_EQ(pc, 2) << bad_penalty;
  EXPECT_NE(bad_penalty.find("--repeat-penalty must be > 0"), std::string::npos) << bad_penalty;
  auto [ka, bad_keep_alive] = run_car("infer tiny Hello --keep-alive -5" + sock);
  EXPECT_EQ(ka, 2) << bad_keep_alive;
  EXPECT_NE(bad_keep_alive.find("--keep-alive"), std::string::npos) << bad_keep_alive;
  // --keep-alive reaches the daemon: 0 unloads the model after the request, a number is shown back.
  auto [lc, kept] = run_car("load tiny --keep-alive 60" + sock);
  ASSERT_EQ(lc, 0) << kept;
  EXPECT_NE(kept.find("unloaded after 60 s unused"), std::string::npos) << kept;
  auto conn = connect();
  EXPECT_EQ(stats(conn)["models"][0]["keep_alive_s"], 60.0);
  auto [uc, unloaded] = run_car("infer tiny Hello -n 1 --keep-alive 0" + sock);
  ASSERT_EQ(uc, 0) << unloaded;
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);
  auto [zc, not_kept] = run_car("load tiny --keep-alive 0" + sock);
  ASSERT_EQ(zc, 0) << not_kept;
  EXPECT_NE(not_kept.find("not kept loaded"), std::string::npos) << not_kept;
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);
}

/// Accepts one connection on `path`, reads one request line into `request`, answers `reply` and closes: a
/// stand-in daemon for checking exactly what `car` sends.
std::thread record_one_request(const std::string& path, std::string& request, const std::string& reply) {
  ::unlink(path.c_str());  // the previous recorder's socket file
  int fd = listening_socket(path);
  EXPECT_GE(fd, 0) << "cannot listen on " << path;
  return std::thread([fd, &request, reply] {
    if (fd < 0) return;
    int conn = ::accept(fd, nullptr, nullptr);
    char c = 0;
    while (conn >= 0 && ::read(conn, &c, 1) == 1 && c != '\n') request += c;
    if (conn >= 0) {
      const std::string line = reply + "\n";
      (void)!::write(conn, line.data(), line.size());
      ::close(conn);
    }
    ::close(fd);
  });
}

TEST_F(DaemonBinaryTest, CarInferAndLoadSendEachOptionAsItsField) {
  const std::string path = (tmp_ / "recorder.sock").string();
  std::string request;
  std::thread daemon = record_one_request(
      path, request,
      R"({"id":1,"ok":true,"result":{"text":"","tokens":[],"finish_reason":"length","timings":{}}})");
  auto [ic, out] = run_car(
      "infer m hi -n 7 --temperature 0.5 --top-k 3 --top-p 0.9 --min-p 0.1 --repeat-penalty 1.2 "
      "--repeat-last-n 16 --seed 9 --stop x --ignore-eos --logprobs --top-logprobs 4 --num-ctx 128 "
      "--keep-alive 30 --no-stream --socket " + path);
  daemon.join();
  EXPECT_EQ(ic, 0) << out;
  const json req = json::parse(request, nullptr, false);
  ASSERT_TRUE(req.is_object()) << request;
  const json expected = {{"op", "infer"},        {"id", 1},          {"model", "m"},          {"prompt", "hi"},
                         {"max_tokens", 7},      {"temperature", 0.5}, {"top_k", 3},          {"top_p", 0.9},
                         {"min_p", 0.1},         {"repeat_penalty", 1.2}, {"repeat_last_n", 16}, {"seed", 9},
                         {"stop", {"x"}},        {"ignore_eos", true}, {"logprobs", true},    {"top_logprobs", 4},
                         {"num_ctx", 128},       {"keep_alive", 30},   {"stream", false}};
  EXPECT_EQ(req, expected) << request;
  // Options not given are not sent: the daemon's defaults apply.
  request.clear();
  daemon = record_one_request(
      path, request,
      R"({"id":1,"ok":true,"result":{"text":"","tokens":[],"finish_reason":"length","timings":{}}})");
  auto [pc, plain] = run_car("infer m hi --no-stream --socket " + path);
  daemon.join();
  EXPECT_EQ(pc, 0) << plain;
  EXPECT_EQ(json::parse(request, nullptr, false),
            json({{"op", "infer"}, {"id", 1}, {"model", "m"}, {"prompt", "hi"}, {"max_tokens", 128},
                  {"stream", false}}))
      << request;
  request.clear();
  daemon = record_one_request(path, request, R"({"id":1,"ok":true,"result":{"size_bytes":1}})");
  auto [lc, load] = run_car("load m --keep-alive 0 --socket " + path);
  daemon.join();
  EXPECT_EQ(lc, 0) << load;
  EXPECT_EQ(json::parse(request, nullptr, false),
            json({{"op", "load"}, {"id", 1}, {"model", "m"}, {"keep_alive", 0}}))
      << request;
}

TEST_F(DaemonBinaryEngineTest, CancelAndContextOverflow) {
  start();
  auto conn = connect();
  ASSERT_TRUE(conn.send_line(infer_request("long", 1900, true).dump()).ok());
  json first = read_json(conn, 60s);
  ASSERT_EQ(first["event"], "token") << first.dump();
  json c = call(conn, {{"id", "c"}, {"op", "cancel"}, {"target", "long"}});
  EXPECT_EQ(c["result"]["cancelled"], true);
  json r;
  do {
    r = read_json(conn, 60s);
  } while (r.is_object() && r.contains("event"));
  EXPECT_EQ(r["id"], "long");
  EXPECT_EQ(r["result"]["finish_reason"], "cancelled") << r.dump();
  EXPECT_LT(r["result"]["tokens"].size(), 1900u);

  std::string huge;
  for (int i = 0; i < 2500; ++i) huge += "word ";
  json over = call(conn, {{"id", "o"}, {"op", "infer"}, {"model", "tiny"}, {"prompt", huge}, {"max_tokens", 8}});
  EXPECT_EQ(error_code(over), "context_overflow") << over.dump();
}

TEST_F(DaemonBinaryEngineTest, DisconnectCancelsWithinOneToken) {
  start();
  auto observer = connect();
  {
    auto conn = connect();
    ASSERT_TRUE(conn.send_line(infer_request(1, 1900, true).dump()).ok());
    ASSERT_EQ(read_json(conn, 60s)["event"], "token");
  }
  EXPECT_TRUE(wait_until([&] { return stats(observer)["requests"]["in_flight"] == 0; }, 30s));
  EXPECT_TRUE(wait_until([&] { return daemon_->log().find("ok(cancelled") != std::string::npos; }, 10s))
      << daemon_->log();
}

TEST_F(DaemonBinaryEngineTest, SigtermDuringALongInferExitsCleanly) {
  // No grace: the request in flight is cancelled at once (the grace's length is the server test's, on a
  // fake clock); what this checks is that it is answered before the process exits cleanly.
  env_["CAR_INFERENCE_SHUTDOWN_GRACE_SECS"] = "0";
  start();
  auto conn = connect();
  ASSERT_TRUE(conn.send_line(infer_request("long", 1900, true).dump()).ok());
  ASSERT_EQ(read_json(conn, 60s)["event"], "token");
  ::kill(daemon_->pid(), SIGTERM);
  json r;
  do {
    r = read_json(conn, 60s);
  } while (r.is_object() && r.contains("event"));
  EXPECT_EQ(r["id"], "long");
  EXPECT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["result"]["finish_reason"], "cancelled") << r.dump();
  auto code = daemon_->wait_exit(30s);
  ASSERT_TRUE(code.has_value()) << daemon_->log();
  EXPECT_EQ(*code, 0) << daemon_->log();
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

// CAR_INFERENCE_MODEL_IDLE_SECS reaches the idle sweep (`spare` below is evicted for idleness after 1 s)
// and pins outrank it and a request's keep-alive, until SIGHUP unpins. (One daemon for both: the 1 s TTL is
// the shortest the setting allows and the only real-clock wait here.)
TEST_F(DaemonBinaryEngineTest, PinsComeFromTheSettingsAndChangeOnSighup) {
  const auto config = tmp_ / "car.env";
  std::ofstream(config) << "CAR_INFERENCE_PIN_MODELS=tiny\n";
  env_["CAR_INFERENCE_CONFIG"] = config.string();
  env_["CAR_INFERENCE_MODEL_IDLE_SECS"] = "1";
  std::filesystem::copy_file(models_ / "tiny.gguf", models_ / "spare.gguf");  // the same model, unpinned
  start();
  auto conn = connect();
  // keep_alive 0 would unload an unpinned model as its request ends; a pin outranks it.
  json r = call(conn, {{"id", 1}, {"op", "load"}, {"model", "tiny"}, {"keep_alive", 0}});
  ASSERT_EQ(r["ok"], true) << r;
  EXPECT_EQ(r["result"]["pinned"], true);
  EXPECT_EQ(r["result"]["retained"], true) << r;
  ASSERT_EQ(call(conn, {{"id", 2}, {"op", "load"}, {"model", "spare"}})["ok"], true);
  EXPECT_EQ(stats(conn)["cache"]["entries"], 2);
  // The sweep that evicts `spare`, idle past the 1 s TTL, found `tiny` idle as long: the pin kept it. (The
  // event, not a fixed sleep, tells the test that such a sweep ran.)
  EXPECT_TRUE(wait_until([&] { return stats(conn)["cache"]["evictions_by_cause"]["idle"] == 1; }, 10s))
      << daemon_->log();
  json s = stats(conn);
  ASSERT_EQ(s["models"].size(), 1u) << daemon_->log();
  EXPECT_EQ(s["models"][0]["model"], "tiny");
  EXPECT_EQ(s["models"][0]["pinned"], true);
  // Unpinned by an edit and SIGHUP: the next sweeps evict it.
  std::ofstream(config) << "CAR_INFERENCE_PIN_MODELS=other\n";
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  EXPECT_TRUE(wait_until([&] { return stats(conn)["cache"]["entries"] == 0; }, 10s)) << daemon_->log();
  // An invalid id in a reload is refused and the previous pins stay in force.
  std::ofstream(config) << "CAR_INFERENCE_PIN_MODELS=.hidden\n";
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  const auto refused = [&] { return daemon_->log().find("settings not reloaded") != std::string::npos; };
  EXPECT_TRUE(wait_until(refused, 10s)) << daemon_->log();
}

TEST_F(DaemonBinaryTest, AnInvalidPinnedIdStopsStartUp) {
  env_["CAR_INFERENCE_PIN_MODELS"] = "ok,.hidden";
  DaemonProcess p(env_, (tmp_ / "bad.log").string());
  auto code = p.wait_exit(20s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(p.log().find("CAR_INFERENCE_PIN_MODELS"), std::string::npos) << p.log();
}

TEST_F(DaemonBinaryEngineTest, BudgetEvictsAcrossThreeModels) {
  // What the daemon charges a model: the engine's estimate, which equals what the loaded model holds
  // (weights + KV cache for the context + scratch + logits), not the file size.
  // Two sequences per model: the charge counts a KV cache for each.
  auto charge = [](const std::filesystem::path& p) {
    engine::LoadOptions o;
    o.parallel = 2;
    auto e = engine::estimate_memory(p.string(), o);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.ok() ? e->total() : 0;
  };
  // A budget of two and a half models (in MiB, the setting's unit): add layers until two fit and three not.
  const uint64_t budget_mb = 2;
  for (uint32_t layers = 1; layers < 64; ++layers) {
    for (uint64_t seed : {2, 3, 4})
      write_model(models_ / ("m" + std::to_string(seed) + ".gguf"), seed, layers);
    uint64_t s = charge(models_ / "m2.gguf");
    if (2 * s <= (budget_mb << 20) && 3 * s > (budget_mb << 20)) break;
    ASSERT_LE(2 * s, budget_mb << 20) << "no layer count makes two models fit in the budget and three not";
  }
  write_model(models_ / "big.gguf", 5, 12);  // more than the whole budget
  ASSERT_GT(charge(models_ / "big.gguf"), budget_mb << 20);
  env_["CAR_INFERENCE_MODEL_CACHE_MB"] = std::to_string(budget_mb);
  env_["CAR_INFERENCE_PARALLEL"] = "2";
  start();
  auto conn = connect();
  for (const char* m : {"m2", "m3", "m4"}) {
    json r = call(conn, {{"id", m}, {"op", "load"}, {"model", m}});
    ASSERT_EQ(r["ok"], true) << r.dump();
    EXPECT_EQ(r["result"]["size_bytes"].get<uint64_t>(), charge(models_ / (std::string(m) + ".gguf")));
    json st = stats(conn);
    EXPECT_LE(st["cache"]["total_bytes"].get<uint64_t>(), budget_mb << 20) << st.dump();
    for (const auto& e : st["models"]) {
      if (e["model"] == m) {
        EXPECT_EQ(e["size_bytes"], r["result"]["size_bytes"]) << st.dump();
      }
    }
  }
  json big = call(conn, {{"id", "big"}, {"op", "load"}, {"model", "big"}});
  EXPECT_EQ(big["ok"], false) << big.dump();
  EXPECT_EQ(big["error"]["code"], "load_failed");
  EXPECT_NE(big["error"]["message"].get<std::string>().find("cache budget is " +
                                                            std::to_string(budget_mb << 20) + " bytes"),
            std::string::npos)
      << big.dump();
  json s = stats(conn);
  EXPECT_EQ(s["cache"]["entries"], 2) << s.dump();
  EXPECT_GE(s["cache"]["evictions_by_cause"]["capacity"], 1);
  json l = call(conn, {{"id", "l"}, {"op", "list"}});
  std::map<std::string, bool> loaded;
  for (const auto& m : l["result"]["models"]) loaded[m["model"].get<std::string>()] = m["loaded"].get<bool>();
  EXPECT_FALSE(loaded["m2"]);  // the least recently used went first
  EXPECT_TRUE(loaded["m4"]);
}

// One budget for the models and the streamed expert caches (issue #23, item 5): a streamed MoE is charged
// its expert cache at the floor (one slot per bank) and grows the rest into the room the budget leaves; a
// later load shrinks that share before it evicts a whole model, and a load refused for size leaves the
// cache as it was.
TEST_F(DaemonBinaryEngineTest, StreamedExpertCachesShareTheModelBudgetAndShrinkBeforeAnEviction) {
  auto write_moe = [](const std::filesystem::path& p, uint32_t n_layer, int n_expert) {
    synth::SynthSpec spec = synth::tiny_spec("qwen3moe");
    spec.n_layer = n_layer;
    spec.n_expert = n_expert;
    spec.n_ctx = 256;
    auto ok = synth::write_synth_model(spec, p.string());
    ASSERT_TRUE(ok.ok()) << ok.error().message;
  };
  engine::LoadOptions streamed;
  streamed.stream_experts = StreamExperts::on;
  auto estimate = [](const std::filesystem::path& p, const engine::LoadOptions& o) {
    auto e = engine::estimate_memory(p.string(), o);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.ok() ? *e : engine::MemoryBreakdown{};
  };
  write_moe(models_ / "moe.gguf", 4, 8);
  const engine::MemoryBreakdown moe = estimate(models_ / "moe.gguf", streamed);
  const uint64_t floor = moe.experts_floor;
  const uint64_t full = floor * 8;  // every expert of every bank cached
  ASSERT_GT(floor, 0u);
  // A budget (whole MiB, the setting's unit) that holds a dense model beside the MoE with its whole cache,
  write_model(models_ / "d1.gguf", 2, 1);
  const uint64_t d1 = estimate(models_ / "d1.gguf", {}).total();
  const uint64_t budget = ((d1 + moe.charged() - floor + full) / (1u << 20) + 1) << 20;
  // and a second dense model that fits beside the first and the MoE's charge, but not beside its cache too.
  uint64_t d2 = 0;
  for (uint32_t layers = 1; layers < 256; ++layers) {
    write_model(models_ / "d2.gguf", 3, layers);
    d2 = estimate(models_ / "d2.gguf", {}).total();
    if (d1 + moe.charged() + d2 + (full - floor) / 2 > budget) break;
  }
  ASSERT_LE(d1 + moe.charged() + d2, budget) << "the second dense model must fit beside the floor";
  ASSERT_GT(d1 + moe.charged() + d2 + (full - floor) / 2, budget);
  write_moe(models_ / "huge.gguf", 40, 64);  // its charge alone is over the budget
  ASSERT_GT(estimate(models_ / "huge.gguf", streamed).charged(), budget);

  env_["CAR_INFERENCE_MODEL_CACHE_MB"] = std::to_string(budget >> 20);
  env_["CAR_INFERENCE_PARALLEL"] = "1";  // the estimates above are of one sequence per model
  start();
  auto conn = connect();
  auto within_budget = [&](const json& st) {
    uint64_t total = st["cache"]["total_bytes"].get<uint64_t>();
    for (const auto& [model, e] : st["experts"].items()) {
      if (e["mode"] == "streamed") total += e["cache_bytes"].get<uint64_t>() - e["floor_bytes"].get<uint64_t>();
    }
    return total <= budget;
  };
  json r = call(conn, {{"id", 1}, {"op", "load"}, {"model", "d1"}});
  ASSERT_EQ(r["ok"], true) << r.dump();
  r = call(conn, {{"id", 2}, {"op", "load"}, {"model", "moe"}, {"stream_experts", "on"}});
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["result"]["size_bytes"].get<uint64_t>(), moe.charged()) << "charged at the floor, as estimated";
  json st = stats(conn);
  ASSERT_TRUE(st["experts"].contains("moe")) << st.dump();
  EXPECT_EQ(st["experts"]["moe"]["floor_bytes"].get<uint64_t>(), floor) << st.dump();
  EXPECT_EQ(st["experts"]["moe"]["cache_bytes"].get<uint64_t>(), full) << "room for every expert" << st.dump();
  EXPECT_TRUE(within_budget(st)) << st.dump();

  // A load refused for its size evicts nothing and leaves the shares as they were.
  r = call(conn, {{"id", 3}, {"op", "load"}, {"model", "huge"}, {"stream_experts", "on"}});
  EXPECT_EQ(r["ok"], false) << r.dump();
  EXPECT_EQ(r["error"]["code"], "load_failed") << r.dump();
  st = stats(conn);
  EXPECT_EQ(st["cache"]["entries"], 2) << st.dump();
  EXPECT_EQ(st["cache"]["evictions"], 0) << st.dump();
  EXPECT_EQ(st["experts"]["moe"]["cache_bytes"].get<uint64_t>(), full) << st.dump();

  // The second dense model fits only if the expert cache gives room back: it shrinks, nothing is evicted.
  r = call(conn, {{"id", 4}, {"op", "load"}, {"model", "d2"}});
  ASSERT_EQ(r["ok"], true) << r.dump();
  st = stats(conn);
  EXPECT_EQ(st["cache"]["entries"], 3) << st.dump();
  EXPECT_EQ(st["cache"]["evictions"], 0) << st.dump();
  EXPECT_LT(st["experts"]["moe"]["cache_bytes"].get<uint64_t>(), full) << st.dump();
  EXPECT_GE(st["experts"]["moe"]["cache_bytes"].get<uint64_t>(), floor) << st.dump();
  EXPECT_TRUE(within_budget(st)) << st.dump();
  // The MoE still answers (from its smaller cache), and the share comes back when a model leaves.
  r = call(conn, {{"id", 5}, {"op", "infer"}, {"model", "moe"}, {"prompt", "hello"}, {"max_tokens", 4}});
  EXPECT_EQ(r["ok"], true) << r.dump();
  r = call(conn, {{"id", 6}, {"op", "invalidate"}, {"model", "d2"}});
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_TRUE(wait_until([&] { return stats(conn)["experts"]["moe"]["cache_bytes"].get<uint64_t>() == full; }, 10s))
      << stats(conn).dump();
}

// --- Connection limits and start-up failures ---------------------------------------------------------

TEST_F(DaemonBinaryTest, ABadSocketGroupFailsStartUpWithoutLeavingTheSocketFile) {
  env_["CAR_INFERENCE_SOCKET_GROUP"] = "nosuchgroup";
  DaemonProcess daemon(env_, (tmp_ / "daemon.log").string());
  auto code = daemon.wait_exit(20s);
  ASSERT_TRUE(code.has_value()) << "still running; log:\n" << daemon.log();
  EXPECT_EQ(*code, 1);
  EXPECT_NE(daemon.log().find("nosuchgroup"), std::string::npos) << daemon.log();
  EXPECT_FALSE(std::filesystem::exists(socket_)) << "the socket file was left behind";
}

/// GET /health over the HTTP front's Unix socket at `path`: the status line ("" when nothing answers).
std::string http_health(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return got.substr(0, got.find("\r\n"));
}

// Socket activation with several sockets (docs/operations.md): systemd passes them by name; the one named
// http is the HTTP front's, the other the NDJSON socket. Neither is unlinked at exit (systemd owns both).
TEST_F(DaemonBinaryTest, SocketActivationTakesTheSocketsByName) {
  const std::string http = (tmp_ / "http.sock").string();
  const int http_fd = listening_socket(http);
  const int ndjson_fd = listening_socket(socket_);
  ASSERT_GE(http_fd, 0);
  ASSERT_GE(ndjson_fd, 0);
  // The HTTP one first: the daemon goes by the names, not the order.
  daemon_ = std::make_unique<DaemonProcess>(env_, (tmp_ / "daemon.log").string(),
                                            std::vector<DaemonProcess::Passed>{{http_fd, "http"}, {ndjson_fd, ""}});
  ::close(http_fd);
  ::close(ndjson_fd);
  auto conn = connect();
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "health"}})["ok"], true) << daemon_->log();
  EXPECT_EQ(http_health(http), "HTTP/1.1 200 OK") << daemon_->log();
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  EXPECT_TRUE(std::filesystem::exists(socket_));
  EXPECT_TRUE(std::filesystem::exists(http));
}

TEST_F(DaemonBinaryTest, SocketActivationWithOnlyTheHttpSocketBindsTheUnixSocketItself) {
  const std::string http = (tmp_ / "http.sock").string();
  const int http_fd = listening_socket(http);
  ASSERT_GE(http_fd, 0);
  daemon_ = std::make_unique<DaemonProcess>(env_, (tmp_ / "daemon.log").string(),
                                            std::vector<DaemonProcess::Passed>{{http_fd, "http"}});
  ::close(http_fd);
  // bind() makes the socket file before listen(): wait for a connection, not for the file (a connect in
  // between is refused; seen once under ASan in CI)
  ASSERT_TRUE(wait_until([&] { return ClientConnection::connect(socket_).ok(); }, 20s)) << daemon_->log();
  auto conn = connect();
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "health"}})["ok"], true) << daemon_->log();
  EXPECT_EQ(http_health(http), "HTTP/1.1 200 OK") << daemon_->log();
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  EXPECT_FALSE(std::filesystem::exists(socket_)) << "its own socket file: removed at exit";
}

TEST_F(DaemonBinaryTest, SocketActivationRefusesTwoUnnamedSocketsOrTwoNamedHttp) {
  for (const char* second : {"", "http"}) {
    const std::string a = (tmp_ / "a.sock").string();
    const std::string b = (tmp_ / "b.sock").string();
    std::filesystem::remove(a);
    std::filesystem::remove(b);
    const int fa = listening_socket(a);
    const int fb = listening_socket(b);
    ASSERT_GE(fa, 0);
    ASSERT_GE(fb, 0);
    DaemonProcess p(env_, (tmp_ / "bad.log").string(),
                    std::vector<DaemonProcess::Passed>{{fa, second}, {fb, second}});
    ::close(fa);
    ::close(fb);
    auto code = p.wait_exit(20s);
    ASSERT_TRUE(code.has_value()) << "still running; log:\n" << p.log();
    EXPECT_EQ(*code, 2) << p.log();
    EXPECT_NE(p.log().find(*second ? "two sockets named http" : "passed 2 sockets"), std::string::npos) << p.log();
    EXPECT_FALSE(std::filesystem::exists(socket_));
  }
}

// issue #23: a second daemon given the first one's --http unix: path must not take the socket over (nor
// delete it when it exits); the first keeps answering on it.
TEST_F(DaemonBinaryTest, ASecondDaemonRefusesTheFirstOnesHttpSocket) {
  const std::string http = (tmp_ / "http.sock").string();
  env_["CAR_INFERENCE_HTTP"] = "unix:" + http;
  start();
  // start() waits for the NDJSON socket; the HTTP one may come up a moment after it (a loaded CI machine).
  ASSERT_TRUE(wait_until([&] { return http_health(http) == "HTTP/1.1 200 OK"; }, 20s)) << daemon_->log();
  auto second_env = env_;
  second_env["CAR_INFERENCE_SOCKET"] = (tmp_ / "second.sock").string();
  DaemonProcess second(second_env, (tmp_ / "second.log").string());
  auto code = second.wait_exit(20s);
  ASSERT_TRUE(code.has_value()) << "the second daemon runs; log:\n" << second.log();
  EXPECT_EQ(*code, 1) << second.log();
  EXPECT_NE(second.log().find("another process is already listening on " + http), std::string::npos)
      << second.log();
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "second.sock")) << "the second daemon left its socket file";
  // The first still answers on both of its sockets.
  EXPECT_EQ(http_health(http), "HTTP/1.1 200 OK") << daemon_->log();
  auto conn = connect();
  EXPECT_EQ(call(conn, {{"id", 1}, {"op", "health"}})["ok"], true);
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  EXPECT_FALSE(std::filesystem::exists(http));  // its own: removed at exit
}

// A daemon removes at exit only the socket files it bound: one another process put at the path since
// (after removing the daemon's) is left alone.
TEST_F(DaemonBinaryTest, ExitLeavesASocketFileItDidNotCreate) {
  const std::string http = (tmp_ / "http.sock").string();
  env_["CAR_INFERENCE_HTTP"] = "unix:" + http;
  start();
  // start() waits for the NDJSON socket; the HTTP one may come up a moment after it (a loaded CI machine).
  ASSERT_TRUE(wait_until([&] { return http_health(http) == "HTTP/1.1 200 OK"; }, 20s)) << daemon_->log();
  ASSERT_TRUE(std::filesystem::remove(http));
  ASSERT_TRUE(std::filesystem::remove(socket_));
  const int other_http = listening_socket(http);
  const int other_socket = listening_socket(socket_);
  ASSERT_GE(other_http, 0);
  ASSERT_GE(other_socket, 0);
  ASSERT_EQ(daemon_->terminate(), 0) << daemon_->log();
  EXPECT_TRUE(std::filesystem::exists(http)) << daemon_->log();
  EXPECT_TRUE(std::filesystem::exists(socket_)) << daemon_->log();
  ::close(other_http);
  ::close(other_socket);
}

TEST_F(DaemonBinaryTest, HttpOnTheSocketsOwnPathIsAConfigurationError) {
  env_["CAR_INFERENCE_HTTP"] = "unix:" + socket_;
  DaemonProcess p(env_, (tmp_ / "bad.log").string());
  auto code = p.wait_exit(20s);
  ASSERT_TRUE(code.has_value()) << "still running; log:\n" << p.log();
  EXPECT_EQ(*code, 2) << p.log();
  EXPECT_NE(p.log().find("CAR_INFERENCE_HTTP=unix:" + socket_), std::string::npos) << p.log();
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

// issue #23: `car` at the connection cap reports the daemon's too_many_connections (exit 1), not the
// EPIPE of writing its request to a connection the daemon already closed (which about half the runs hit).
TEST_F(DaemonBinaryTest, CarAtTheConnectionCapReportsTooManyConnections) {
  env_["CAR_INFERENCE_MAX_CONNECTIONS"] = "1";
  start();
  std::optional<ClientConnection> held;
  ASSERT_TRUE(wait_until([&] {  // refused until the daemon saw start()'s probe connection close
    held.emplace(connect());
    if (!held->send_line(R"({"id": 1, "op": "health"})").ok()) return false;
    auto line = held->read_line(5s);
    return line.ok() && line.value() && json::parse(**line, nullptr, false).value("ok", false);
  }));
  for (int i = 0; i < 10; ++i) {
    auto [code, out] = run_car("health --socket " + socket_);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("too_many_connections"), std::string::npos) << out;
  }
  EXPECT_EQ(daemon_->terminate(), 0) << daemon_->log();
}

TEST_F(DaemonBinaryTest, ConnectionSettingsReachTheServer) {
  env_["CAR_INFERENCE_MAX_CONNECTIONS_PER_UID"] = "1";
  env_["CAR_INFERENCE_LINE_TIMEOUT_SECS"] = "1";
  start();  // its probe connections come and go
  std::optional<ClientConnection> first;
  ASSERT_TRUE(wait_until([&] {  // refused (with one error line) until the daemon saw the probes close
    first.emplace(connect());
    if (!first->send_line(R"({"id": 1, "op": "health"})").ok()) return false;
    auto line = first->read_line(5s);
    if (!line.ok() || !line.value()) return false;
    return json::parse(**line, nullptr, false).value("ok", false);
  }));
  json s = stats(*first);
  EXPECT_EQ(s["connections"]["max_per_uid"], 1);
  EXPECT_EQ(s["connections"]["max"], 256);
  auto second = connect();
  json refused = read_json(second, 5s);
  EXPECT_EQ(error_code(refused), "too_many_connections") << refused.dump();
  // The half-sent line of the admitted connection times out after a second.
  ASSERT_TRUE(first->send_raw(R"({"id": 2, "op")").ok());
  EXPECT_EQ(error_code(read_json(*first, 10s)), "line_timeout");
  EXPECT_EQ(daemon_->terminate(), 0) << daemon_->log();
}

TEST_F(DaemonBinaryTest, AConnectionFloodAtALowFileLimitLeavesDescriptorsForOthers) {
  // The daemon runs with an open-file limit of 256 (soft and hard, set in its own child process), so its
  // connection cap becomes 256 - 128 whatever MAX_CONNECTIONS says.
  env_["CAR_INFERENCE_MAX_CONNECTIONS"] = "100000";
  env_["CAR_INFERENCE_MAX_CONNECTIONS_PER_UID"] = "100000";
  const std::string log_path = (tmp_ / "daemon.log").string();
  std::vector<std::string> env_strings = {"PATH=/usr/bin:/bin"};
  for (const auto& [k, v] : env_) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit low{256, 256};
    ::setrlimit(RLIMIT_NOFILE, &low);
    int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(log, STDERR_FILENO);
    char* argv[] = {const_cast<char*>(kBinary.c_str()), nullptr};
    ::execve(kBinary.c_str(), argv, envp.data());
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{pid};
  auto log = [&] {
    std::ifstream in(log_path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  ASSERT_TRUE(wait_until([&] { return ClientConnection::connect(socket_).ok(); }, 20s)) << log();
  std::optional<ClientConnection> control;
  ASSERT_TRUE(wait_until([&] {
    control.emplace(connect());
    if (!control->send_line(R"({"id": 0, "op": "health"})").ok()) return false;
    auto line = control->read_line(5s);
    return line.ok() && line.value() && json::parse(**line, nullptr, false).value("ok", false);
  }));
  EXPECT_EQ(stats(*control)["connections"]["max"], 128);
  EXPECT_NE(log().find("max connections lowered from 100000 to 128"), std::string::npos) << log();
  // A flood of 300 connections, more than the daemon has descriptors: the ones past the cap are refused
  // with one line; none is left hanging.
  std::vector<ClientConnection> flood;
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    flood.push_back(connect());
    (void)flood.back().send_line(R"({"id": 1, "op": "health"})");  // a refused one may be closed already
  }
  for (auto& c : flood) {
    json r = read_json(c, 10s);
    if (error_code(r) == "too_many_connections") ++refused;
  }
  EXPECT_EQ(refused, 300 - 127) << "128 admitted, the control connection one of them";
  // The daemon still has descriptors for its own work: `list` reads the models directory, `load` opens
  // the file (and fails only because it is not a model).
  json l = call(*control, {{"id", 2}, {"op", "list"}});
  EXPECT_EQ(l["ok"], true) << l.dump();
  json load = call(*control, {{"id", 3}, {"op", "load"}, {"model", "garbage"}});
  EXPECT_EQ(error_code(load), "load_failed");
  EXPECT_EQ(load["error"]["message"].get<std::string>().find("Too many open files"), std::string::npos) << load.dump();
  flood.clear();
}

// ---- a model file replaced or truncated while cached ----------------------------------------------------
//
// Before the fault guard, each of these killed the daemon with SIGBUS (a read of the cached mapping past
// the file's new end) or kept serving the old model after an atomic rename.

/// Overwrite `path` in place as cp(1) does: open the existing file with O_TRUNC (same inode) and write.
void overwrite_in_place(const std::filesystem::path& path, const std::filesystem::path& from) {
  std::string bytes(std::filesystem::file_size(from), '\0');
  std::ifstream in(from, std::ios::binary);
  ASSERT_TRUE(in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) << from;
  int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    ASSERT_GT(n, 0) << std::strerror(errno);
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

/// `truncate -s SIZE path`.
void truncate_file(const std::filesystem::path& path, off_t size) {
  ASSERT_EQ(::truncate(path.c_str(), size), 0) << std::strerror(errno);
}

class DaemonModelFileTest : public DaemonBinaryEngineTest {
 protected:
  void SetUp() override {
    DaemonBinaryEngineTest::SetUp();
    if (IsSkipped()) return;
    // `other`: a different, smaller model (one layer) - what the user copies over `tiny`.
    write_model(models_ / "other.gguf", 7, 1);
    ASSERT_LT(std::filesystem::file_size(models_ / "other.gguf"),
              std::filesystem::file_size(models_ / "tiny.gguf"));
  }
  json infer(ClientConnection& conn, const std::string& model, json id) {
    json req = infer_request(std::move(id), 8, false);
    req["model"] = model;
    return call(conn, req, nullptr, 60s);
  }
  /// The daemon still runs and answers `health`.
  void expect_alive(ClientConnection& conn) {
    ASSERT_FALSE(daemon_->wait_exit(0ms).has_value()) << "car-inferenced died; log:\n" << daemon_->log();
    json h = call(conn, {{"id", "h"}, {"op", "health"}});
    EXPECT_EQ(h["ok"], true) << h.dump();
  }
};

TEST_F(DaemonModelFileTest, InPlaceCopyOverACachedModelServesTheNewFile) {
  start();
  auto conn = connect();
  json old_tokens = infer(conn, "tiny", 1)["result"]["tokens"];
  json other = infer(conn, "other", 2);
  ASSERT_EQ(other["ok"], true) << other.dump();
  ASSERT_NE(other["result"]["tokens"], old_tokens);
  overwrite_in_place(models_ / "tiny.gguf", models_ / "other.gguf");
  json r = infer(conn, "tiny", 3);
  expect_alive(conn);
  ASSERT_EQ(r["ok"], true) << r.dump() << daemon_->log();
  EXPECT_EQ(r["result"]["tokens"], other["result"]["tokens"]);  // the new file's model, not the old one
  EXPECT_NE(daemon_->log().find("changed on disk"), std::string::npos) << daemon_->log();
  EXPECT_EQ(stats(conn)["cache"]["evictions_by_cause"]["invalidate"], 1);
}

TEST_F(DaemonModelFileTest, TruncatedCachedModelIsAnErrorAndOthersAreStillServed) {
  start();
  auto conn = connect();
  ASSERT_EQ(infer(conn, "tiny", 1)["ok"], true);
  ASSERT_EQ(infer(conn, "other", 2)["ok"], true);
  truncate_file(models_ / "tiny.gguf", 0);
  json r = infer(conn, "tiny", 3);
  expect_alive(conn);
  EXPECT_EQ(error_code(r), "load_failed") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("tiny.gguf"), std::string::npos) << r.dump();
  EXPECT_EQ(infer(conn, "other", 4)["ok"], true);
  // Cut to a page instead: the header parses from nothing either, and the daemon still lives.
  write_model(models_ / "tiny.gguf", 1);
  ASSERT_EQ(infer(conn, "tiny", 5)["ok"], true);
  truncate_file(models_ / "tiny.gguf", 4096);
  EXPECT_EQ(error_code(infer(conn, "tiny", 6)), "load_failed");
  expect_alive(conn);
}

TEST_F(DaemonModelFileTest, AtomicRenameOverACachedModelServesTheNewModel) {
  start();
  auto conn = connect();
  json old_tokens = infer(conn, "tiny", 1)["result"]["tokens"];
  json other = infer(conn, "other", 2);
  ASSERT_EQ(other["ok"], true) << other.dump();
  std::filesystem::copy_file(models_ / "other.gguf", models_ / "tiny.gguf.new");
  std::filesystem::rename(models_ / "tiny.gguf.new", models_ / "tiny.gguf");
  json r = infer(conn, "tiny", 3);
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["result"]["tokens"], other["result"]["tokens"]);
  EXPECT_EQ(r["result"]["timings"]["load_ms"].get<double>() > 0, true);  // loaded afresh, not a hit
  expect_alive(conn);
}

TEST_F(DaemonModelFileTest, TruncatedWhileStreamingAnswersIoErrorAndReloadsNextTime) {
  start();
  auto conn = connect();
  ASSERT_TRUE(conn.send_line(infer_request("long", 1900, true).dump()).ok());
  json first = read_json(conn, 60s);
  ASSERT_EQ(first["event"], "token") << first.dump();
  // The generation reads every weight page for each token; cutting the file now makes the next one fault.
  truncate_file(models_ / "tiny.gguf", 0);
  json r;
  do {
    r = read_json(conn, 60s);
  } while (r.is_object() && r.contains("event"));
  EXPECT_EQ(r["id"], "long");
  EXPECT_EQ(error_code(r), "io_error") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("atomic rename"), std::string::npos) << r.dump();
  // Caught after the forward pass that saw it: by the fault guard (a weight read past the new end faulted
  // and read zeros) or, when the cut landed between a pass's reads and its check, by the file's new size.
  const std::string message = r["error"]["message"].get<std::string>();
  EXPECT_TRUE(message.find("faulted") != std::string::npos || message.find("0 bytes") != std::string::npos)
      << r.dump();
  expect_alive(conn);
  EXPECT_EQ(stats(conn)["cache"]["entries"], 0);  // the faulted model was dropped
  // Put a model back the safe way: it is loaded and served.
  write_model(models_ / "tiny.gguf", 1);
  json again = call(conn, infer_request("again", 4, false), nullptr, 60s);
  EXPECT_EQ(again["ok"], true) << again.dump();
  EXPECT_EQ(infer(conn, "other", "o")["ok"], true);
}

// ---- continuous batching (issue #25) -----------------------------------------------------------------------

// Four clients at once on one model running four sequences: each gets exactly what it gets alone, and the
// model ran fewer steps than it generated tokens (the requests shared steps).
TEST_F(DaemonBinaryEngineTest, ConcurrentRequestsToOneModelShareStepsAndMatchAlone) {
  env_["CAR_INFERENCE_PARALLEL"] = "4";
  start();
  auto conn = connect();
  auto request = [&](int i) {
    json r = infer_request(i, 48, false);
    r["prompt"] = "Request number " + std::to_string(i) + " says hello";
    if (i % 2 == 1) {
      r["temperature"] = 0.8;
      r["seed"] = 1000 + i;
    }
    r["logprobs"] = true;
    return r;
  };
  std::vector<json> alone;
  for (int i = 0; i < 4; ++i) {
    json r = call(conn, request(i), nullptr, 60s);
    ASSERT_EQ(r["ok"], true) << r.dump();
    alone.push_back(r["result"]);
  }
  auto steps = [&] {
    const json st = stats(conn);  // held: a range-for over a temporary's member would dangle
    for (const auto& m : st["models"]) {
      if (m["model"] == "tiny") return m["sequences"]["steps"].get<uint64_t>();
    }
    return uint64_t{0};
  };
  const uint64_t steps_before = steps();
  std::vector<ClientConnection> clients;
  for (int i = 0; i < 4; ++i) clients.push_back(connect());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(clients[static_cast<size_t>(i)].send_line(request(i).dump()).ok());
  uint64_t tokens = 0;
  for (int i = 0; i < 4; ++i) {
    json r = read_json(clients[static_cast<size_t>(i)], 60s);
    ASSERT_EQ(r["ok"], true) << r.dump();
    EXPECT_EQ(r["result"]["tokens"], alone[static_cast<size_t>(i)]["tokens"]) << i;
    EXPECT_EQ(r["result"]["logprobs"], alone[static_cast<size_t>(i)]["logprobs"]) << i;
    EXPECT_GE(r["result"]["timings"]["ttft_ms"].get<double>(), r["result"]["timings"]["queue_ms"].get<double>());
    tokens += r["result"]["tokens"].size();
  }
  const uint64_t used = steps() - steps_before;
  EXPECT_LT(used, tokens) << "the four requests never shared a step";
}

// With one worker, a request to an idle model is answered while a long one runs on another model: it waits
// neither for the worker (the busy model's request does not hold it) nor for the other model.
TEST_F(DaemonBinaryEngineTest, AnIdleModelIsNotHeldUpByABusyOne) {
  env_["CAR_INFERENCE_WORKERS"] = "1";
  write_model(models_ / "other.gguf", 7, 1);
  start();
  auto conn = connect();
  ASSERT_EQ(call(conn, {{"id", "l"}, {"op", "load"}, {"model", "other"}})["ok"], true);
  auto busy = connect();
  ASSERT_TRUE(busy.send_line(infer_request("long", 1900, true).dump()).ok());
  ASSERT_EQ(read_json(busy, 60s)["event"], "token");  // the long request generates
  json quick = {{"id", "q"}, {"op", "infer"}, {"model", "other"}, {"prompt", "Hi"}, {"max_tokens", 4},
                {"temperature", 0}, {"ignore_eos", true}};
  json r = call(conn, quick, nullptr, 60s);
  ASSERT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["result"]["tokens"].size(), 4u);
  // The long one is still running: the quick one did not wait for it.
  EXPECT_EQ(stats(conn)["requests"]["in_flight"], 1);
  json c = call(busy, {{"id", "c"}, {"op", "cancel"}, {"target", "long"}});
  EXPECT_EQ(c["result"]["cancelled"], true);
}

}  // namespace
}  // namespace car
