// Connection: one connection of the HTTP front (http_server.h). It reads HTTP/1.1 requests (keep-alive,
// header and idle timeouts, body limits), routes them (the OpenAI endpoints, /v1/models, /metrics,
// /health), hands a completion to the request handler as a typed request (openai.h's mapping) and writes
// the response - a streamed one as server-sent events, held as encoded up to the front's pending-output
// bound (ConnectionLimits' overflow rule: past it the completion is cancelled). It is the handler's Client
// for the requests it hands on. io thread only.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/http/http_server.h"
#include "daemon/http/ollama.h"
#include "daemon/http/openai.h"
#include "daemon/request_handler.h"

namespace car::daemon::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::awaitable;
using nlohmann::json;
using Socket = asio::generic::stream_protocol::socket;

/// An error as OpenAI reports it, for an HTTP status (the connection's answers and the front's refusal).
openai::ApiError api_error(int status, std::string message, std::string code = {},
                           std::string type = "invalid_request_error", std::string param = {});

class Connection final : public Client, public std::enable_shared_from_this<Connection> {
 public:
  Connection(Socket socket, HttpFront& front, uint64_t number)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        signal_(socket_.get_executor()),
        front_(front),
        number_(number) {
    signal_.expires_at(asio::steady_timer::time_point::max());
  }

  void start() {
    auto self = shared_from_this();
    asio::co_spawn(
        socket_.get_executor(), [self]() { return self->run(); }, asio::detached);
  }

  void close_now() {
    if (closed_) return;
    closed_ = true;
    calls_.cancel_all();
    boost::system::error_code ec;
    socket_.shutdown(asio::socket_base::shutdown_both, ec);
    socket_.close(ec);
    timer_.cancel();
    signal_.cancel();
  }

  /// Close now unless a request is being served; then close once its response is written.
  void close_when_idle() {
    closing_ = true;
    if (!serving_) close_now();
  }

  // Client:
  void reply(const json&, const std::shared_ptr<Call>&, Reply reply) override {
    final_ = std::move(reply);
    signal_.cancel();
  }
  void token(const std::shared_ptr<Call>& call, const protocol::TokenEvent& event) override;
  CallRegistry& calls() override { return calls_; }
  uint64_t number() const override { return number_; }

 private:
  using Request = bhttp::request<bhttp::string_body>;
  using Response = bhttp::response<bhttp::string_body>;

  awaitable<void> run();
  /// Wait for `op` with `timeout`; false (and the connection closed) on timeout.
  awaitable<bool> read_request(Request& req, bool first, bool& ok);
  awaitable<bool> serve(Request& req);
  awaitable<bool> send(Response res, bool keep_alive);
  /// Bytes of output held for this connection (queued or being written) changed by `delta`.
  void account(std::ptrdiff_t delta) {
    buffered_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(buffered_) + delta);
    front_.limits().add_queued(delta);
  }
  awaitable<bool> send_json(bhttp::status status, const json& body, bool keep_alive,
                            const std::vector<std::pair<std::string, std::string>>& headers = {});
  /// An error in the shape of the API being served (api_): OpenAI's error object or Ollama's {"error"}.
  awaitable<bool> send_error(const openai::ApiError& e, bool keep_alive);
  /// The HTTP error for a car error reply, in the API being served.
  openai::ApiError car_error(std::string_view code, std::string_view message) const;
  awaitable<bool> write_raw(std::string data);
  awaitable<bool> complete(openai::Endpoint endpoint, Request& req);
  awaitable<bool> generate(openai::Endpoint endpoint, Request& req);
  /// Hand `infer` to the handler and write its answer as `stream_` says (set by the caller).
  awaitable<bool> run_completion(Result<protocol::InferParams> infer, bool keep, bool chunked,
                                 std::chrono::steady_clock::time_point received,
                                 const std::function<std::string(protocol::InferResult&)>& body);
  // The Ollama API (http_connection_ollama.cpp).
  awaitable<bool> serve_ollama(Request& req, std::string_view target);
  awaitable<bool> ollama_complete(ollama::Endpoint endpoint, Request& req);
  awaitable<bool> ollama_load(const ollama::Mapped& m, ollama::Endpoint endpoint, bool keep,
                              std::chrono::steady_clock::time_point received);
  awaitable<bool> ollama_tags(const Request& req);
  awaitable<bool> ollama_ps(const Request& req);
  awaitable<bool> ollama_show(Request& req);
  /// The next request id of this connection.
  json next_id() { return next_id_++; }
  awaitable<bool> models(const Request& req, std::string_view id);
  bool authorized(const Request& req) const;
  void watch_for_close();
  awaitable<void> wait_signal();

  Socket socket_;
  asio::steady_timer timer_;
  asio::steady_timer signal_;  // cancelled when a token or the final reply arrives
  HttpFront& front_;
  const uint64_t number_;
  beast::flat_buffer buffer_;
  CallRegistry calls_;
  bool closed_ = false;
  bool serving_ = false;  // a request was read and its response is not written yet
  bool closing_ = false;  // close after the current response
  std::string_view endpoint_ = "other";  ///< the request's endpoint as a metrics label (a fixed string)
  // Which API the request being served speaks: its errors take that API's shape.
  enum class Api { kOpenAi, kOllama };
  Api api_ = Api::kOpenAi;
  // The completion in progress and how its answer is written: OpenAI's server-sent events or Ollama's
  // newline-delimited JSON. A streamed one encodes each token's event as it arrives (token()).
  struct Stream {
    Api api = Api::kOpenAi;
    bool stream = false;
    openai::Endpoint endpoint = openai::Endpoint::kCompletions;
    const openai::Mapped* mapped = nullptr;  // complete()'s, while it runs (OpenAI)
    std::string id;
    int64_t created = 0;
    ollama::Endpoint ollama_endpoint = ollama::Endpoint::kGenerate;
    std::string model;       // Ollama: the model as the request named it
    std::string created_at;  // Ollama: RFC 3339, the request's (each line of a stream carries its own)
    /// One token's event, encoded (empty: nothing to send).
    std::string event(const protocol::TokenEvent& ev) const;
    /// What a stream starts with (OpenAI chat: the role chunk).
    std::string opening() const;
    /// What a stream ends with: the finish (and usage) events, or the error; with [DONE] for OpenAI.
    std::string closing(const Reply& reply) const;
    std::string content_type() const;
  };
  std::optional<Stream> stream_;
  std::string queued_;        // SSE events not yet handed to a write
  std::size_t buffered_ = 0;  // queued_ plus the write in flight: bounded by max_pending_bytes()
  std::optional<Reply> final_;
  bool overflowed_ = false;  // the stream reached the bound: the completion was cancelled
  bool client_gone_ = false;
  bool watching_ = false;
  int64_t next_id_ = 1;
};

}  // namespace car::daemon::http
