// The HTTP front in-process over real sockets: the Server with a scripted runtime (no engine), driven by a
// small blocking HTTP/1.1 client. Covers the endpoints' statuses and shapes, SSE framing over chunked
// encoding, the API key, the non-loopback refusal, the body limit, keep-alive, the Unix socket's mode, and
// cancellation when the client closes mid-stream.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "daemon/server.h"
#include "tests/daemon/daemon_test_support.h"
#include "tests/test_support.h"

namespace car::daemon {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using car::testing::TempDir;

struct Script {
  std::atomic<int> cancelled{0};
  std::atomic<int> generating{0};
};

/// Emits " w0", " w1", ... one per max_tokens, ending with eos; the prompt "hold" keeps going (slowly)
/// until cancelled, the prompt "flood" as fast as it can.
class ScriptedBackend final : public Backend {
 public:
  explicit ScriptedBackend(Script& s) : script_(s) {}
  Result<GenerateOutput> generate(const GenerateParams& params, const TokenSink& on_token,
                                  const std::atomic<bool>& cancelled) override {
    GenerateOutput out;
    out.prompt_tokens = params.messages ? 7 : static_cast<int>(params.generate.prompt.size());
    const bool hold = params.generate.prompt == "hold";
    const bool flood = params.generate.prompt == "flood";
    ++script_.generating;
    for (int i = 0; i < (flood ? 2000000 : hold ? 100000 : params.generate.max_tokens); ++i) {
      if (cancelled.load()) {
        ++script_.cancelled;
        out.finish_reason = "cancelled";
        return out;
      }
      std::string text = " w" + std::to_string(i);
      if (!params.generate.stop.empty() && text.find(params.generate.stop[0]) != std::string::npos) {
        out.finish_reason = "stop";
        return out;
      }
      out.text += text;
      out.tokens.push_back(100 + i);
      if (on_token) on_token(protocol::TokenEvent{100 + i, text, std::nullopt});
      if (hold) std::this_thread::sleep_for(2ms);
    }
    out.finish_reason = params.generate.max_tokens >= 5 ? "eos" : "length";
    return out;
  }
  uint64_t memory_bytes() const override { return 1000; }
  bool streams_experts() const override { return false; }
  void save_state() override {}

 private:
  Script& script_;
};

class ScriptedRuntime final : public ModelRuntime {
 public:
  explicit ScriptedRuntime(Script& s) : script_(s) {}
  Result<std::shared_ptr<Backend>> load(const std::filesystem::path&) override {
    return std::shared_ptr<Backend>(std::make_shared<ScriptedBackend>(script_));
  }
  Result<uint64_t> estimate_bytes(const std::filesystem::path&, const LoadRequest&) override { return 1000; }
  bool available() const override { return true; }
  std::string name() const override { return "scripted"; }

 private:
  Script& script_;
};

struct HttpReply {
  int status = 0;
  std::string headers;  // lower-cased
  std::string body;     // de-chunked
  json json_body() const { return json::parse(body, nullptr, false); }
};

/// A blocking HTTP/1.1 client on one connection.
class HttpClient {
 public:
  explicit HttpClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    timeval tv{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  explicit HttpClient(const std::string& unix_path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", unix_path.c_str());
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~HttpClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }

  void send_raw(const std::string& s) {
    ASSERT_EQ(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
  }

  HttpReply request(const std::string& method, const std::string& target, const std::string& body = {},
                    const std::string& extra_headers = {}) {
    send_raw(method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n" + extra_headers +
             (body.empty() && method == "GET" ? ""
                                              : "Content-Type: application/json\r\nContent-Length: " +
                                                    std::to_string(body.size()) + "\r\n") +
             "\r\n" + body);
    return read_reply();
  }

  /// Read until `needle` appears in what arrived (the raw bytes); false on close/timeout.
  bool read_until(const std::string& needle) {
    while (buf_.find(needle) == std::string::npos) {
      if (!fill()) return false;
    }
    return true;
  }

  HttpReply read_reply() {
    HttpReply r;
    if (!read_until("\r\n\r\n")) return r;
    const std::size_t end = buf_.find("\r\n\r\n");
    std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    r.status = std::atoi(head.substr(9, 3).c_str());
    for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers = head;
    if (head.find("transfer-encoding: chunked") != std::string::npos) {
      for (;;) {
        if (!read_until("\r\n")) return r;
        const std::size_t eol = buf_.find("\r\n");
        const std::size_t n = std::stoul(buf_.substr(0, eol), nullptr, 16);
        while (buf_.size() < eol + 2 + n + 2) {
          if (!fill()) return r;
        }
        r.body += buf_.substr(eol + 2, n);
        buf_.erase(0, eol + 2 + n + 2);
        if (n == 0) break;
      }
    } else if (auto p = head.find("content-length: "); p != std::string::npos) {
      const std::size_t n = std::stoul(head.substr(p + 16));
      while (buf_.size() < n) {
        if (!fill()) return r;
      }
      r.body = buf_.substr(0, n);
      buf_.erase(0, n);
    }
    return r;
  }

  /// Bytes received on this connection so far.
  std::size_t received() const { return received_; }

  /// Does the server close the connection (EOF) within `timeout`?
  bool closed_by_server() {
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  bool fill() {
    char tmp[4096];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<std::size_t>(n));
    received_ += static_cast<std::size_t>(n);
    return true;
  }
  int fd_ = -1;
  std::size_t received_ = 0;
  bool connected_ = false;
  std::string buf_;
};

/// The JSON payloads of an SSE body's `data:` lines (`[DONE]` as the string "[DONE]").
std::vector<json> sse_payloads(const std::string& body) {
  std::vector<json> out;
  std::size_t at = 0;
  while (at < body.size()) {
    const std::size_t end = body.find("\n\n", at);
    if (end == std::string::npos) {
      ADD_FAILURE() << "an event does not end with a blank line: " << body.substr(at);
      break;
    }
    std::string ev = body.substr(at, end - at);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    ev = ev.substr(6);
    out.push_back(ev == "[DONE]" ? json("[DONE]") : json::parse(ev, nullptr, false));
    at = end + 2;
  }
  return out;
}

/// CAR_INFERENCE_HTTP's forms, parsed as the settings parse them.
config::HttpAddress http_address(const std::string& text) {
  auto a = config::parse_http_address(text);
  EXPECT_TRUE(a.ok()) << text;
  return a.ok() ? *a : config::HttpAddress{};
}

class HttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spdlog::set_level(spdlog::level::warn);
    models_ = tmp_ / "models";
    std::filesystem::create_directories(models_);
    for (const char* name : {"alpha", "beta"}) std::ofstream(models_ / (std::string(name) + ".gguf")) << "x";
    options_.socket_path = tmp_ / "d.sock";
    options_.models_dir = models_;
    options_.state_dir = tmp_.path();
    options_.live.idle_ttl = 0s;
    options_.handle_signals = false;
    options_.shutdown_grace = 5000ms;
    options_.http.address = http_address("127.0.0.1:0");
  }
  void TearDown() override {
    if (thread_.joinable()) {
      server_->request_stop();
      thread_.join();
    }
  }
  void start() {
    server_ = std::make_unique<Server>(options_, runtime_);
    auto ok = server_->open();
    ASSERT_TRUE(ok.ok()) << ok.error().message;
    thread_ = std::thread([this] { (void)server_->run(); });
  }
  uint16_t port() const { return server_->http_port(); }

  TempDir tmp_;
  std::filesystem::path models_;
  ServerOptions options_;
  Script script_;
  ScriptedRuntime runtime_{script_};
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

const std::string kChat = R"({"model":"alpha","messages":[{"role":"user","content":"hi"}],"max_tokens":3})";

TEST_F(HttpFrontTest, HealthModelsAndUnknownEndpoints) {
  start();
  ASSERT_NE(port(), 0);
  HttpClient c(port());
  ASSERT_TRUE(c.connected());
  HttpReply h = c.request("GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.json_body()["status"], "ok");
  EXPECT_EQ(c.request("GET", "/ready").status, 200);
  HttpReply m = c.request("GET", "/v1/models");  // the same connection: keep-alive
  ASSERT_EQ(m.status, 200);
  json list = m.json_body();
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][0]["id"], "alpha");
  EXPECT_EQ(list["data"][0]["owned_by"], "car-inference");
  EXPECT_EQ(list["data"][0]["loaded"], false);
  EXPECT_EQ(c.request("GET", "/v1/models/beta").json_body()["id"], "beta");
  HttpReply missing = c.request("GET", "/v1/models/gamma");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json_body()["error"]["code"], "model_not_found");
  EXPECT_EQ(c.request("GET", "/v2/nothing").status, 404);
  EXPECT_EQ(c.request("GET", "/v1/chat/completions").status, 405);
  // The Prometheus page, counting this connection's requests by endpoint and status.
  HttpReply metrics = c.request("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("car_inference_http_requests_total{endpoint=\"/v1/models/{id}\",status=\"404\"} 1"),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("car_inference_http_requests_total{endpoint=\"other\",status=\"404\"} 1"),
            std::string::npos)
      << metrics.body;
}

TEST_F(HttpFrontTest, ChatAndCompletionResponses) {
  start();
  HttpClient c(port());
  HttpReply r = c.request("POST", "/v1/chat/completions", kChat);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json_body();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "alpha");
  EXPECT_EQ(j["choices"][0]["message"]["content"], " w0 w1 w2");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
  HttpReply p = c.request("POST", "/v1/completions", R"({"model":"beta","prompt":"abc","max_tokens":6})");
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(p.json_body()["choices"][0]["text"], " w0 w1 w2 w3 w4 w5");
  EXPECT_EQ(p.json_body()["choices"][0]["finish_reason"], "stop");  // car's eos
  EXPECT_EQ(c.request("GET", "/v1/models").json_body()["data"][1]["loaded"], true);
}

TEST_F(HttpFrontTest, ErrorsHaveOpenAiShapeAndStatus) {
  start();
  HttpClient c(port());
  HttpReply unknown = c.request("POST", "/v1/completions", R"({"model":"gamma","prompt":"x"})");
  EXPECT_EQ(unknown.status, 404);
  json e = unknown.json_body()["error"];
  EXPECT_TRUE(e.contains("message") && e.contains("type") && e.contains("param") && e.contains("code"));
  HttpReply n2 = c.request("POST", "/v1/chat/completions",
                           R"({"model":"alpha","messages":[{"role":"user","content":"x"}],"n":2})");
  EXPECT_EQ(n2.status, 400);
  EXPECT_EQ(n2.json_body()["error"]["param"], "n");
  HttpReply range = c.request("POST", "/v1/completions", R"({"model":"alpha","prompt":"x","top_p":7})");
  EXPECT_EQ(range.status, 400);
  EXPECT_NE(range.json_body()["error"]["message"].get<std::string>().find("top_p"), std::string::npos);
  EXPECT_EQ(c.request("POST", "/v1/completions", "{oops").status, 400);
}

TEST_F(HttpFrontTest, StreamIsSseOverChunkedEncodingAndConcatenatesToTheText) {
  start();
  HttpClient c(port());
  HttpReply r = c.request(
      "POST", "/v1/chat/completions",
      R"({"model":"alpha","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("content-type: text/event-stream"), std::string::npos);
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  json usage;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    if (!events[i]["usage"].is_null()) usage = events[i]["usage"];
    for (const auto& ch : events[i]["choices"]) {
      text += ch["delta"].value("content", "");
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(text, " w0 w1 w2 w3");
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 4);
  // The connection is still usable after the stream.
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  // A streamed request that fails before any token is a plain JSON error.
  HttpReply bad = c.request("POST", "/v1/completions", R"({"model":"gamma","prompt":"x","stream":true})");
  EXPECT_EQ(bad.status, 404);
}

TEST_F(HttpFrontTest, ClosingTheConnectionCancelsTheGeneration) {
  start();
  for (bool stream : {true, false}) {
    const int before = script_.cancelled.load();
    HttpClient c(port());
    c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
               std::to_string(std::string(R"({"model":"alpha","prompt":"hold","stream":false})").size()) +
               "\r\n\r\n" +
               (stream ? R"({"model":"alpha","prompt":"hold","stream":true })"
                       : R"({"model":"alpha","prompt":"hold","stream":false})"));
    if (stream) {
      ASSERT_TRUE(c.read_until("w3"));  // it is generating
    } else {
      ASSERT_TRUE(car::testing::wait_until([&] { return script_.generating.load() >= 2; }, 10s));
    }
    c.close();
    EXPECT_TRUE(car::testing::wait_until([&] { return script_.cancelled.load() > before; }, 10s))
        << "stream=" << stream;
  }
}

/// The JSON lines of an Ollama stream (each must end with one newline).
std::vector<json> ndjson_lines(const std::string& body) {
  std::vector<json> out;
  std::size_t at = 0;
  while (at < body.size()) {
    const std::size_t end = body.find('\n', at);
    if (end == std::string::npos) {
      ADD_FAILURE() << "a line does not end with a newline: " << body.substr(at);
      break;
    }
    out.push_back(json::parse(body.substr(at, end - at), nullptr, false));
    EXPECT_FALSE(out.back().is_discarded()) << body.substr(at, end - at);
    at = end + 1;
  }
  return out;
}

TEST_F(HttpFrontTest, OllamaGenerateAndChatStreamAsNdjsonByDefault) {
  start();
  HttpClient c(port());
  HttpReply r = c.request("POST", "/api/generate",
                          R"({"model":"alpha:latest","prompt":"abc","raw":true,"options":{"num_predict":4}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("content-type: application/x-ndjson"), std::string::npos) << r.headers;
  auto lines = ndjson_lines(r.body);
  ASSERT_EQ(lines.size(), 5u) << r.body;
  std::string text;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["done"], false);
    EXPECT_EQ(lines[i]["model"], "alpha:latest") << "the name as the request gave it";
    text += lines[i]["response"].get<std::string>();
  }
  EXPECT_EQ(text, " w0 w1 w2 w3");
  EXPECT_EQ(lines.back()["done"], true);
  EXPECT_EQ(lines.back()["done_reason"], "length");
  EXPECT_EQ(lines.back()["eval_count"], 4);
  EXPECT_EQ(lines.back()["response"], "");
  // Not streamed: the final object alone, with the whole text; chat answers an assistant message.
  HttpReply chat = c.request(
      "POST", "/api/chat",
      R"({"model":"alpha","messages":[{"role":"user","content":"hi"}],"stream":false,"options":{"num_predict":6}})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  json j = chat.json_body();
  EXPECT_EQ(j["message"]["role"], "assistant");
  EXPECT_EQ(j["message"]["content"], " w0 w1 w2 w3 w4 w5");
  EXPECT_EQ(j["done_reason"], "stop");  // car's eos
  EXPECT_EQ(j["prompt_eval_count"], 7);
  // The connection is still usable; the OpenAI API beside it answers in its own shape.
  EXPECT_EQ(c.request("POST", "/v1/completions", R"({"model":"gamma","prompt":"x"})").json_body()["error"]["code"],
            "model_not_found");
}

TEST_F(HttpFrontTest, OllamaErrorsListingsLoadAndUnload) {
  start();
  HttpClient c(port());
  HttpReply missing = c.request("POST", "/api/generate", R"({"model":"gamma","prompt":"x"})");
  EXPECT_EQ(missing.status, 404);
  EXPECT_TRUE(missing.json_body()["error"].is_string()) << missing.body;
  HttpReply streamed_missing = c.request("POST", "/api/chat",
                                         R"({"model":"gamma","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(streamed_missing.status, 404) << "a stream that fails before its first line is a plain error";
  HttpReply typo = c.request("POST", "/api/generate", R"({"model":"alpha","prompt":"x","option":{}})");
  EXPECT_EQ(typo.status, 400);
  EXPECT_EQ(typo.json_body()["error"], "unknown field \"option\" (did you mean 'options'?)");
  EXPECT_EQ(c.request("POST", "/api/generate", "{oops").status, 400);
  HttpReply nothing = c.request("GET", "/api/nothing");
  EXPECT_EQ(nothing.status, 404);
  EXPECT_TRUE(nothing.json_body()["error"].is_string());
  HttpReply pull = c.request("POST", "/api/pull", R"({"model":"x"})");
  EXPECT_EQ(pull.status, 501);
  EXPECT_NE(pull.json_body()["error"].get<std::string>().find("models directory"), std::string::npos);
  EXPECT_EQ(c.request("GET", "/api/generate").status, 405);
  EXPECT_EQ(c.request("GET", "/").status, 200);
  EXPECT_FALSE(c.request("GET", "/api/version").json_body()["version"].is_null());

  json tags = c.request("GET", "/api/tags").json_body();
  ASSERT_EQ(tags["models"].size(), 2u) << tags.dump();
  EXPECT_EQ(tags["models"][0]["name"], "alpha");
  EXPECT_EQ(tags["models"][0]["details"]["format"], "gguf");
  EXPECT_TRUE(c.request("GET", "/api/ps").json_body()["models"].empty());
  HttpReply load = c.request("POST", "/api/generate", R"({"model":"alpha","keep_alive":"1m"})");
  ASSERT_EQ(load.status, 200) << load.body;
  EXPECT_EQ(load.json_body()["done_reason"], "load");
  json ps = c.request("GET", "/api/ps").json_body();
  ASSERT_EQ(ps["models"].size(), 1u) << ps.dump();
  EXPECT_EQ(ps["models"][0]["name"], "alpha");
  EXPECT_EQ(ps["models"][0]["size"], 1000);
  EXPECT_EQ(ps["models"][0]["digest"], tags["models"][0]["digest"]);  // the listing's facts for the file
  HttpReply unload = c.request("POST", "/api/chat", R"({"model":"alpha","messages":[],"keep_alive":0})");
  ASSERT_EQ(unload.status, 200) << unload.body;
  EXPECT_EQ(unload.json_body()["done_reason"], "unload");
  EXPECT_TRUE(c.request("GET", "/api/ps").json_body()["models"].empty());
  HttpReply show_missing = c.request("POST", "/api/show", R"({"model":"gamma"})");
  EXPECT_EQ(show_missing.status, 404);
  HttpReply show_bad = c.request("POST", "/api/show", R"({"model":"alpha"})");  // "x" is not a GGUF file
  EXPECT_EQ(show_bad.status, 500);
  EXPECT_TRUE(show_bad.json_body()["error"].is_string());
}

TEST_F(HttpFrontTest, OllamaStreamCancelsWhenTheClientCloses) {
  start();
  const int before = script_.cancelled.load();
  HttpClient c(port());
  const std::string body = R"({"model":"alpha","prompt":"hold","raw":true})";
  c.send_raw("POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n\r\n" + body);
  ASSERT_TRUE(c.read_until("w3"));
  c.close();
  EXPECT_TRUE(car::testing::wait_until([&] { return script_.cancelled.load() > before; }, 10s));
}

// While the daemon drains its requests after SIGTERM, the HTTP front still accepts: a new connection's
// /ready is a 503 (so a load balancer takes the replica out), new work a 503, /health still 200; once the
// drain ends the front closes.
TEST_F(HttpFrontTest, ReadyIs503WhileShuttingDown) {
  start();
  HttpClient busy(port());
  const std::string body = R"({"model":"alpha","prompt":"hold","stream":true})";
  busy.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                "\r\n\r\n" + body);
  ASSERT_TRUE(busy.read_until("w3"));  // a request in flight holds the shutdown open
  server_->request_stop();
  ASSERT_TRUE(car::testing::wait_until(
      [&] {
        HttpClient probe(port());
        return probe.connected() && probe.request("GET", "/ready").status == 503;
      },
      10s));
  HttpClient c(port());
  ASSERT_TRUE(c.connected());
  EXPECT_EQ(c.request("GET", "/ready").json_body()["status"], "not ready");
  EXPECT_EQ(c.request("GET", "/health").status, 200);
  EXPECT_EQ(c.request("POST", "/v1/completions", R"({"model":"alpha","prompt":"x"})").status, 503);
  busy.close();  // cancels the held request: the drain ends and the daemon exits
  thread_.join();
}

// A streaming client that never reads: the daemon buffers at most twice CAR_INFERENCE_MAX_PENDING_OUTPUT_MB
// of the stream (the SSE events queued and the write in flight, as encoded) - as the socket does - then
// cancels the completion, ends the stream with an output_overflow error event and counts it.
TEST_F(HttpFrontTest, StreamingClientThatNeverReadsIsCancelledAtTheBound) {
  constexpr std::size_t kBound = 32 * 1024;
  options_.live.max_pending_output_bytes = kBound;
  const std::string path = (tmp_ / "http.sock").string();
  options_.http.address =
      http_address("unix:" + path);  // a Unix socket: the kernel holds at most its send buffer
  start();
  HttpClient c(path);
  ASSERT_TRUE(c.connected());
  const std::string body = R"({"model":"alpha","prompt":"flood","stream":true})";
  c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n\r\n" + body);
  // Not reading: the generation floods until the daemon's buffer for this stream reaches the bound.
  ASSERT_TRUE(car::testing::wait_until([&] { return script_.cancelled.load() == 1; }, 60s));
  auto conn = protocol::ClientConnection::connect(options_.socket_path.string());
  ASSERT_TRUE(conn.ok());
  json stats = car::testing::call(*conn, json{{"id", 1}, {"op", "stats"}});
  EXPECT_EQ(stats["result"]["connections"]["output_overflows"], 1) << stats.dump();
  // What the daemon still holds for the unread stream, as it counts it.
  EXPECT_LE(stats["result"]["connections"]["queued_bytes"].get<std::size_t>(), 2 * kBound + 4096)
      << stats.dump();
  HttpClient m(path);
  HttpReply page = m.request("GET", "/metrics");
  EXPECT_NE(page.body.find("car_inference_connections_output_overflows_total 1"), std::string::npos)
      << page.body;
  // Read it all now: everything buffered anywhere (the daemon, the socket) arrives. Over a Unix socket the
  // kernel holds at most the daemon's send buffer (net.core.wmem_default, 208 KiB by default).
  HttpReply r = c.read_reply();
  ASSERT_EQ(r.status, 200);
  RecordProperty("received_bytes", static_cast<int>(c.received()));
  EXPECT_LE(c.received(), 2 * kBound + 512 * 1024) << "bytes the daemon buffered for a client that did not read";
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events[events.size() - 2]["error"]["code"], "output_overflow") << events[events.size() - 2];
  // The connection stays usable.
  EXPECT_EQ(c.request("GET", "/health").status, 200);
}

TEST_F(HttpFrontTest, ApiKeyIsRequiredExceptForHealth) {
  std::ofstream(tmp_ / "key") << "  s3cret \n";
  auto key = http::read_api_key(tmp_ / "key");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(*key, "s3cret");
  options_.http.api_key = *key;
  start();
  HttpClient c(port());
  HttpReply none = c.request("GET", "/v1/models");
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.json_body()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(c.request("GET", "/v1/models", "", "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(c.request("GET", "/v1/models", "", "Authorization: Bearer s3cret\r\n").status, 200);
  EXPECT_EQ(c.request("GET", "/health").status, 200);
}

TEST_F(HttpFrontTest, NonLoopbackWithoutAKeyIsRefused) {
  options_.http.address = http_address("0.0.0.0:0");
  Server server(options_, runtime_);
  auto ok = server.open();
  ASSERT_FALSE(ok.ok());
  EXPECT_NE(ok.error().message.find("CAR_INFERENCE_HTTP_API_KEY_FILE"), std::string::npos)
      << ok.error().message;
  EXPECT_FALSE(std::filesystem::exists(options_.socket_path));  // the NDJSON socket file was removed again
  options_.http.api_key = "k";
  Server keyed(options_, runtime_);
  EXPECT_TRUE(keyed.open().ok());
}

TEST_F(HttpFrontTest, BodyOverTheLimitIs413AndCloses) {
  options_.max_line_bytes = 1000;
  start();
  HttpClient c(port());
  const std::string big = R"({"model":"alpha","prompt":")" + std::string(2000, 'a') + "\"}";
  HttpReply r = c.request("POST", "/v1/completions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(c.closed_by_server());
}

// issue #23: a transfer coding other than chunked alone is a 501 before the body is read (it was read as no
// body, or "gzip, chunked" as plain chunked), and the connection closes (what follows the header cannot be
// framed); chunked alone still works.
TEST_F(HttpFrontTest, TransferCodingsOtherThanChunkedAre501) {
  start();
  const std::string body = R"({"model":"alpha","prompt":"abc","max_tokens":2})";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size());
  const std::string chunked = std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
  for (const std::string& te : {std::string("Transfer-Encoding: gzip\r\n"),
                                std::string("Transfer-Encoding: gzip, chunked\r\n"),
                                std::string("Transfer-Encoding: deflate\r\n"),
                                std::string("Transfer-Encoding: x-custom\r\n"),
                                std::string("Transfer-Encoding: chunked, chunked\r\n")}) {
    HttpClient c(port());
    c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + te + "\r\n" + chunked);
    HttpReply r = c.read_reply();
    EXPECT_EQ(r.status, 501) << te;
    EXPECT_EQ(r.json_body()["error"]["code"], "unsupported_transfer_encoding") << te << r.body;
    EXPECT_TRUE(c.closed_by_server()) << te;
  }
  {  // chunked not last: the parser's own 400, as RFC 9112 6.3 requires
    HttpClient c(port());
    c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               "Transfer-Encoding: gzip\r\n\r\n" + chunked);
    EXPECT_EQ(c.read_reply().status, 400);
    EXPECT_TRUE(c.closed_by_server());
  }
  HttpClient c(port());
  c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n" + chunked);
  HttpReply r = c.read_reply();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json_body()["choices"][0]["text"], " w0 w1");
}

TEST_F(HttpFrontTest, UnixSocketIs0660) {
  options_.http.address = http_address("unix:" + (tmp_ / "http.sock").string());
  start();
  struct stat st {};
  ASSERT_EQ(::stat((tmp_ / "http.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  HttpClient c((tmp_ / "http.sock").string());
  ASSERT_TRUE(c.connected());
  EXPECT_EQ(c.request("GET", "/health").status, 200);
}

// Both fronts come in through one Listener and count against the daemon's live ConnectionLimits: an HTTP
// connection past CAR_INFERENCE_MAX_CONNECTIONS gets a 503 too_many_connections, the NDJSON socket counts
// the HTTP connections too, and SIGHUP's new cap reaches the HTTP front (it used to keep the cap it
// started with).
TEST_F(HttpFrontTest, TheConnectionCapIsTheLiveOneBothFrontsShare) {
  options_.live.max_connections = 1;
  options_.handle_signals = true;
  options_.reload = [this]() -> Result<LiveSettings> {
    LiveSettings raised = options_.live;
    raised.max_connections = 3;
    return raised;
  };
  start();
  HttpClient first(port());
  ASSERT_TRUE(first.connected());
  ASSERT_EQ(first.request("GET", "/health").status, 200);
  HttpClient second(port());
  HttpReply refused = second.read_reply();
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.json_body()["error"]["code"], "too_many_connections") << refused.body;
  {
    // The socket's front door: the HTTP connection holds the one place.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", options_.socket_path.c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string line;
    char buf[512];
    for (ssize_t n; line.find('\n') == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      line.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    EXPECT_NE(line.find("too_many_connections"), std::string::npos) << line;
  }
  // To the server's io thread, which reads its signalfd: open() blocked the signals in this thread and so
  // in the io thread it started (a signal sent to this thread would stay pending here, unread).
  ASSERT_EQ(::pthread_kill(thread_.native_handle(), SIGHUP), 0);
  // The reload runs on the io thread; each refused try is one more refusal, nothing else.
  int status = 0;
  for (int tries = 0; tries < 2000 && status != 200; ++tries) {
    HttpClient c(port());
    status = c.request("GET", "/health").status;
    if (status != 200) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(status, 200) << "the raised cap reached the HTTP front";
}

}  // namespace
}  // namespace car::daemon
