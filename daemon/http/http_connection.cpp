#include "daemon/http/http_connection.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <random>

#include "core/util/error_codes.h"
#include "daemon/http/openai.h"
#include "daemon/model_resolver.h"
#include "daemon/protocol.h"
#include "daemon/safe_text.h"


namespace car::daemon::http {

// asio, beast, bhttp, awaitable, json and Socket come from http_connection.h.
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr auto kTuple = asio::as_tuple(use_awaitable);


// GCC 12 cannot compile braced lists of string literals inside coroutines ("array used as initializer"):
// the coroutines build their JSON and header lists through these.
json status_json(const std::string& status) {
  return json{{"status", status}};
}
std::vector<std::pair<std::string, std::string>> one_header(const std::string& k, const std::string& v) {
  return {{k, v}};
}
/// One /v1/models entry; `created` is the file's modification time.
json model_entry(const std::filesystem::path& dir, const ListedModel& m, bool loaded) {
  struct stat st {};
  const int64_t created =
      ::stat((dir / (m.id + ".gguf")).c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
  return json{{"id", m.id},         {"object", "model"},
              {"created", created}, {"owned_by", "car-inference"},
              {"loaded", loaded},   {"size_bytes", m.file_bytes}};
}
json models_list(json data) {
  return json{{"object", "list"}, {"data", std::move(data)}};
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// The request's transfer codings (every Transfer-Encoding line, in order) when they are anything but
/// `chunked` alone - "gzip", "gzip, chunked", "deflate", an unknown one - as the client wrote them; empty
/// when there is no Transfer-Encoding or it is just chunked. The parser frames a body by the final coding
/// only: "gzip" would read as a request without a body and "gzip, chunked" as plain chunked, handing on
/// bytes nobody decoded.
template <class Fields>
std::string unsupported_transfer_coding(const Fields& fields) {
  bool present = false;
  std::string all;
  std::size_t codings = 0;
  bool only_chunked = true;
  for (const auto& field : fields) {  // every line, in order (equal_range need not give them in order)
    if (field.name() != bhttp::field::transfer_encoding) continue;
    present = true;
    const std::string_view value(field.value().data(), field.value().size());
    all += all.empty() ? "" : ", ";
    all += value;
    std::size_t at = 0;
    while (at <= value.size()) {
      std::size_t end = value.find(',', at);
      if (end == std::string_view::npos) end = value.size();
      std::string_view coding = value.substr(at, end - at);
      coding = coding.substr(0, coding.find(';'));  // transfer parameters
      const auto b = coding.find_first_not_of(" \t");
      const auto e = coding.find_last_not_of(" \t");
      coding = b == std::string_view::npos ? std::string_view() : coding.substr(b, e - b + 1);
      if (!coding.empty()) {  // empty list elements are allowed (RFC 9110 5.6.1)
        ++codings;
        if (!beast::iequals(coding, "chunked")) only_chunked = false;
      }
      at = end + 1;
    }
  }
  if (!present || (codings == 1 && only_chunked)) return {};
  return all.empty() ? std::string("(empty)") : all;
}

}  // namespace

openai::ApiError api_error(int status, std::string message, std::string code, std::string type,
                           std::string param) {
  openai::ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

void Connection::token(const std::shared_ptr<Call>& call, const protocol::TokenEvent& event) {
  // A token whose bytes are held back (inside a UTF-8 character) still carries its logprob.
  if (closed_ || !stream_ || !stream_->stream || overflowed_ || (event.text.empty() && !event.logprobs)) return;
  // Encoded now, so the bound counts the bytes as they will be written (an SSE event is some 150 bytes
  // of JSON around a token of a few).
  std::string ev = stream_->event(event);
  if (ev.empty()) return;
  const std::size_t bound = front_.max_pending_bytes();
  if (front_.limits().overflows(buffered_, ev.size())) {
    overflowed_ = true;
    call->overflowed = true;
    call->cancelled.store(true);
    front_.limits().count_output_overflow();
    spdlog::info("http conn {}: {} bytes of the stream unread (bound {}): cancelling the completion",
                 number_, buffered_, bound);
    signal_.cancel();
    return;
  }
  account(static_cast<std::ptrdiff_t>(ev.size()));
  queued_ += ev;
  signal_.cancel();
}

awaitable<void> Connection::wait_signal() {
  co_await signal_.async_wait(kTuple);
  signal_.expires_at(asio::steady_timer::time_point::max());
}

awaitable<void> Connection::run() {
  auto self = shared_from_this();
  bool first = true;
  while (!closed_) {
    Request req;
    bool ok = false;
    co_await read_request(req, first, ok);
    if (!ok) break;
    first = false;
    bool keep = false;
    serving_ = true;
    try {
      keep = co_await serve(req);
    } catch (const std::exception& e) {
      spdlog::error("http conn {}: {}", number_, e.what());
      keep = false;
    }
    serving_ = false;
    if (!keep || closing_) break;
  }
  // Wait for what is in flight to report (a cancelled completion ends within one token).
  while (!calls_.empty() && !closed_) co_await wait_signal();
  close_now();
  front_.closed(self);
}

awaitable<bool> Connection::read_request(Request& req, bool first, bool& ok) {
  const auto& o = front_.options();
  ok = false;
  api_ = Api::kOpenAi;  // errors before a request is routed take OpenAI's shape
  // 1. Wait for the first byte: an idle keep-alive connection may wait idle_timeout.
  if (buffer_.size() == 0) {
    timer_.expires_after(first ? o.header_timeout : o.idle_timeout);
    auto r = co_await (socket_.async_wait(asio::socket_base::wait_read, kTuple) || timer_.async_wait(kTuple));
    if (r.index() == 1 || std::get<0>(r) != std::tuple<boost::system::error_code>{}) co_return false;
  }
  // 2. The header, then the body, each within header_timeout.
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(o.max_body_bytes);
  timer_.expires_after(o.header_timeout);
  auto h = co_await (bhttp::async_read_header(socket_, buffer_, parser, kTuple) || timer_.async_wait(kTuple));
  if (h.index() == 1) {
    co_await send_error(
        api_error(408,
                  "request header not complete within " + std::to_string(o.header_timeout.count()) + " s",
                  "timeout"),
        false);
    co_return false;
  }
  if (auto [ec, n] = std::get<0>(h); ec) {
    if (ec == bhttp::error::body_limit) {  // a Content-Length over the limit is refused with the header
      co_await send_error(
          api_error(413, "request body larger than " + std::to_string(o.max_body_bytes) + " bytes",
                    "request_too_large"),
          false);
      co_return false;
    }
    if (ec != bhttp::error::end_of_stream && ec != asio::error::eof && ec != asio::error::operation_aborted) {
      co_await send_error(api_error(400, "malformed HTTP request: " + ec.message()), false);
    }
    co_return false;
  }
  if (std::string codings = unsupported_transfer_coding(parser.get()); !codings.empty()) {
    // Before the body: what follows the header cannot be framed, so the connection closes after the 501.
    co_await send_error(api_error(501, "Transfer-Encoding '" + codings.substr(0, 200) +
                                           "' is not supported: send the body as is, or chunked alone",
                                  "unsupported_transfer_encoding"),
                        false);
    co_return false;
  }
  if (parser.get()[bhttp::field::expect] == "100-continue") {
    if (!co_await write_raw("HTTP/1.1 100 Continue\r\n\r\n")) co_return false;
  }
  timer_.expires_after(o.header_timeout);
  auto b = co_await (bhttp::async_read(socket_, buffer_, parser, kTuple) || timer_.async_wait(kTuple));
  if (b.index() == 1) {
    co_await send_error(
        api_error(408, "request body not complete within " + std::to_string(o.header_timeout.count()) + " s",
                  "timeout"),
        false);
    co_return false;
  }
  if (auto [ec, n] = std::get<0>(b); ec) {
    if (ec == bhttp::error::body_limit) {
      co_await send_error(
          api_error(413, "request body larger than " + std::to_string(o.max_body_bytes) + " bytes",
                    "request_too_large"),
          false);
    } else if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
      co_await send_error(api_error(400, "malformed HTTP request: " + ec.message()), false);
    }
    co_return false;
  }
  req = parser.release();
  ok = true;
  co_return true;
}

bool Connection::authorized(const Request& req) const {
  const std::string& key = front_.options().api_key;
  if (key.empty()) return true;
  const auto auth = req[bhttp::field::authorization];
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() <= kBearer.size() || !beast::iequals(auth.substr(0, kBearer.size()), kBearer)) return false;
  return constant_time_equal(std::string_view(auth.data() + kBearer.size(), auth.size() - kBearer.size()),
                             key);
}

/// The endpoint label of car_inference_http_requests_total: one of a fixed set, never the client's text.
static std::string_view metrics_endpoint(std::string_view target) {
  for (std::string_view e : {"/health", "/ready", "/metrics", "/v1/models", "/v1/completions",
                             "/v1/chat/completions", "/api/tags", "/api/show", "/api/generate", "/api/chat",
                             "/api/ps", "/api/version"})
    if (target == e) return e;
  if (target.starts_with("/v1/models/")) return "/v1/models/{id}";
  return "other";
}

awaitable<bool> Connection::serve(Request& req) {
  const bool keep = req.keep_alive();
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  endpoint_ = metrics_endpoint(target);
  const bool get = req.method() == bhttp::verb::get || req.method() == bhttp::verb::head;
  const bool post = req.method() == bhttp::verb::post;
  const openai::ApiError not_allowed =
      api_error(405, "method " + std::string(req.method_string()) + " not allowed on " + std::string(target),
                "method_not_allowed");
  if (target == "/health") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    co_return co_await send_json(bhttp::status::ok, status_json("ok"), keep);
  }
  if (target == "/ready") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    const auto& ready = front_.options().ready;
    const bool is_ready = !front_.handler().shutting_down() && (!ready || ready());
    co_return co_await send_json(is_ready ? bhttp::status::ok : bhttp::status::service_unavailable,
                                 status_json(is_ready ? "ready" : "not ready"), keep);
  }
  api_ = target == "/api" || target.starts_with("/api/") ? Api::kOllama : Api::kOpenAi;
  if (target == "/") {  // what tools probing for a server (Ollama's clients among them) ask first
    if (!get) co_return co_await send_error(not_allowed, keep);
    Response res{bhttp::status::ok, req.version()};
    res.set(bhttp::field::content_type, "text/plain; charset=utf-8");
    res.body() = "car-inferenced is running (OpenAI API at /v1, Ollama API at /api)\n";
    co_return co_await send(std::move(res), keep);
  }
  const bool known = target == "/metrics" || target == "/v1/models" || target.starts_with("/v1/models/") ||
                     target == "/v1/completions" || target == "/v1/chat/completions" || api_ == Api::kOllama;
  if (!known) {
    co_return co_await send_error(
        api_error(404, "no such endpoint: " + std::string(req.method_string()) + " " + std::string(target),
                  "unknown_url"),
        keep);
  }
  if (!authorized(req)) {
    const openai::ApiError e =
        api_error(401, "missing or incorrect API key (send Authorization: Bearer KEY)", "invalid_api_key");
    json body = openai::error_body(e);
    if (api_ == Api::kOllama) body = ollama::error_body(e);
    co_return co_await send_json(bhttp::status::unauthorized, body, keep, one_header("WWW-Authenticate", "Bearer"));
  }
  if (api_ == Api::kOllama) co_return co_await serve_ollama(req, target);
  if (target == "/metrics") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    const auto& metrics = front_.options().metrics;
    if (!metrics) {
      co_return co_await send_error(api_error(404, "metrics are not available in this build"), keep);
    }
    Response res{bhttp::status::ok, req.version()};
    res.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = metrics();
    co_return co_await send(std::move(res), keep);
  }
  if (target == "/v1/models") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    co_return co_await models(req, {});
  }
  if (target.starts_with("/v1/models/")) {
    if (!get) co_return co_await send_error(not_allowed, keep);
    co_return co_await models(req, target.substr(std::string_view("/v1/models/").size()));
  }
  if (!post) co_return co_await send_error(not_allowed, keep);
  co_return co_await complete(
      target == "/v1/chat/completions" ? openai::Endpoint::kChat : openai::Endpoint::kCompletions, req);
}

awaitable<bool> Connection::models(const Request& req, std::string_view id) {
  const bool keep = req.keep_alive();
  auto listed = list_models(front_.options().models_dir);
  if (!listed) {
    co_return co_await send_error(api_error(500, listed.error().message, "", "server_error"), keep);
  }
  auto entry = [this](const ListedModel& m) {
    return model_entry(front_.options().models_dir, m, front_.handler().cache().contains(m.id));
  };
  if (!id.empty()) {
    for (const auto& m : *listed) {
      if (m.id == id) co_return co_await send_json(bhttp::status::ok, entry(m), keep);
    }
    co_return co_await send_error(api_error(404, "The model '" + std::string(id) + "' does not exist",
                                            "model_not_found", "invalid_request_error", "model"),
                                  keep);
  }
  json data = json::array();
  for (const auto& m : *listed) data.push_back(entry(m));
  co_return co_await send_json(bhttp::status::ok, models_list(std::move(data)), keep);
}

void Connection::watch_for_close() {
  if (watching_ || closed_ || client_gone_) return;
  watching_ = true;
  socket_.async_wait(asio::socket_base::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
    self->watching_ = false;
    if (ec || self->closed_ || self->calls_.empty()) return;
    char c = 0;
    const ssize_t n = ::recv(self->socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;  // the client sent more (a pipelined request): it is still there
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      self->watch_for_close();
      return;
    }
    // End of file or a reset: nobody will read the answer.
    spdlog::info("http conn {}: the client closed the connection: cancelling its completion", self->number_);
    self->client_gone_ = true;
    self->calls_.cancel_all();
    self->signal_.cancel();
  });
}

awaitable<bool> Connection::complete(openai::Endpoint endpoint, Request& req) {
  bool keep = false;
  try {
    keep = co_await generate(endpoint, req);
  } catch (...) {
    stream_.reset();
    account(-static_cast<std::ptrdiff_t>(queued_.size()));
    queued_ = std::string();
    throw;
  }
  // What a stream left queued (the client went away) is dropped, and its memory given back.
  stream_.reset();
  account(-static_cast<std::ptrdiff_t>(queued_.size()));
  queued_ = std::string();
  co_return keep;
}

std::string Connection::Stream::event(const protocol::TokenEvent& ev) const {
  if (api == Api::kOllama) {
    if (ev.text.empty()) return {};
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    return ollama::text_line(ollama_endpoint, model,
                             ollama::rfc3339(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
                             ev.text);
  }
  return openai::sse_event(openai::text_chunk(endpoint, *mapped, id, created, ev.text, false,
                                              ev.logprobs ? &*ev.logprobs : nullptr));
}

std::string Connection::Stream::opening() const {
  if (api == Api::kOllama) return {};
  return openai::sse_event(openai::text_chunk(endpoint, *mapped, id, created, "", true));
}

std::string Connection::Stream::closing(const Reply& reply) const {
  if (api == Api::kOllama) {
    if (!reply.ok) {
      return protocol::dump(ollama::error_body(ollama::from_car_error(reply.code, reply.message))) + "\n";
    }
    CAR_CHECK(reply.infer.has_value());
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    return ollama::final_object(ollama_endpoint, model,
                                ollama::rfc3339(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
                                *reply.infer, "", true);
  }
  std::string events;
  if (reply.ok) {
    CAR_CHECK(reply.infer.has_value());  // an ok infer reply carries its typed result
    const protocol::GenerateOutput& output = reply.infer->output;
    events += openai::sse_event(openai::finish_chunk(endpoint, *mapped, id, created, output.finish_reason));
    if (mapped->include_usage) {
      events += openai::sse_event(openai::usage_chunk(endpoint, *mapped, id, created, output));
    }
  } else {
    events += openai::sse_event(
        protocol::dump(openai::error_body(openai::from_car_error(reply.code, reply.message))));
  }
  return events + openai::sse_done();
}

std::string Connection::Stream::content_type() const {
  return api == Api::kOllama ? "application/x-ndjson" : "text/event-stream";
}

awaitable<bool> Connection::generate(openai::Endpoint endpoint, Request& req) {
  const bool keep = req.keep_alive();
  const auto received = Clock::now();
  openai::Mapped m;
  if (auto e = openai::map_request(endpoint, req.body(), m)) co_return co_await send_error(*e, keep);
  req.body() = std::string();  // mapped: the body is not needed any more
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  Stream st;
  st.api = Api::kOpenAi;
  st.stream = m.stream;
  st.endpoint = endpoint;
  st.mapped = &m;
  st.id = (endpoint == openai::Endpoint::kChat ? "chatcmpl-" : "cmpl-") +
          hex64((static_cast<uint64_t>(number_) << 32) ^ static_cast<uint64_t>(next_id_) ^
                static_cast<uint64_t>(received.time_since_epoch().count()));
  st.created = created;
  stream_ = std::move(st);
  auto infer = std::move(m.infer).finish();
  if (infer) {
    infer->no_template_hint = endpoint == openai::Endpoint::kChat
                                  ? "this endpoint cannot take one: send the text to /v1/completions as a prompt"
                                  : "";
  }
  co_return co_await run_completion(std::move(infer), keep, req.version() >= 11, received,
                                    [&](protocol::InferResult& result) {
    return openai::response(endpoint, m, result, stream_->id, created);
  });
}

awaitable<bool> Connection::run_completion(Result<protocol::InferParams> infer, bool keep, bool chunked,
                                           std::chrono::steady_clock::time_point received,
                                           const std::function<std::string(protocol::InferResult&)>& body) {
  const bool streamed = stream_->stream;
  final_.reset();
  client_gone_ = false;
  overflowed_ = false;
  // The typed request, validated by the infer field table's rows as a socket request's fields are.
  front_.handler().handle_infer(shared_from_this(), next_id(), std::move(infer), received);
  if (!chunked) keep = false;
  bool header_sent = false;
  auto frame = [&](std::string data) {
    if (!chunked || data.empty()) return data;
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return std::string(size) + data + "\r\n";
  };
  auto header = [&]() {
    front_.handler().metrics().count_http(endpoint_, 200);
    std::string h = "HTTP/1.1 200 OK\r\nServer: car-inferenced\r\nContent-Type: " + stream_->content_type() +
                    "\r\nCache-Control: no-cache\r\n";
    h += chunked ? "Transfer-Encoding: chunked\r\n" : "";
    h += keep ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    return h;
  };
  while (!closed_) {
    if (!final_ && !calls_.empty()) watch_for_close();
    if (client_gone_) {
      if (final_ || calls_.empty()) break;
      co_await wait_signal();
      continue;
    }
    if (streamed && !queued_.empty() && !(final_ && !final_->ok && !header_sent)) {
      // The queued events go into one write; until it is done they are still counted (buffered_), so
      // the events queued meanwhile and this write together stay within the bound.
      std::string out;
      if (!header_sent) {
        out += header();
        header_sent = true;
        out += frame(stream_->opening());
      }
      const std::size_t moved = queued_.size();
      out += frame(std::exchange(queued_, std::string()));
      const auto size = static_cast<std::ptrdiff_t>(out.size());
      account(size - static_cast<std::ptrdiff_t>(moved));
      const bool written = co_await write_raw(std::move(out));
      account(-size);
      if (!written) {
        calls_.cancel_all();
        client_gone_ = true;
      }
      continue;
    }
    if (final_) break;
    co_await wait_signal();
  }
  if (client_gone_ || closed_) co_return false;
  Reply reply = std::move(*final_);
  final_.reset();
  if (!streamed) {
    if (!reply.ok) co_return co_await send_error(car_error(reply.code, reply.message), keep);
    // Only the response text is held while a slow client reads it: written from the typed result without
    // a document, which is freed before the write.
    CAR_CHECK(reply.infer.has_value());  // an ok infer reply carries its typed result
    Response res{bhttp::status::ok, 11};
    res.set(bhttp::field::content_type, "application/json; charset=utf-8");
    res.body() = body(*reply.infer);
    reply.infer.reset();
    co_return co_await send(std::move(res), keep);
  }
  if (overflowed_) {  // however the generation ended (a cancelled one may end ok)
    reply = Reply::failure(protocol::code::kOutputOverflow,
                           "cancelled: the client left more than " + std::to_string(front_.max_pending_bytes()) +
                               " bytes of the stream unread (twice CAR_INFERENCE_MAX_PENDING_OUTPUT_MB); read "
                               "the stream as it arrives");
  }
  if (!header_sent) {
    if (!reply.ok) co_return co_await send_error(car_error(reply.code, reply.message), keep);
    std::string out = header();
    out += frame(stream_->opening());
    header_sent = true;
    if (!co_await write_raw(std::move(out))) co_return false;
  }
  std::string out = frame(stream_->closing(reply));
  if (chunked) out += "0\r\n\r\n";
  if (!co_await write_raw(std::move(out))) co_return false;
  co_return keep;
}

awaitable<bool> Connection::write_raw(std::string data) {
  if (closed_) co_return false;
  auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(data), kTuple);
  if (ec) {
    spdlog::debug("http conn {}: write error: {}", number_, ec.message());
    co_return false;
  }
  co_return true;
}

awaitable<bool> Connection::send(Response res, bool keep_alive) {
  front_.handler().metrics().count_http(endpoint_, static_cast<int>(res.result_int()));
  res.set(bhttp::field::server, "car-inferenced");
  res.keep_alive(keep_alive);
  res.prepare_payload();
  const auto size = static_cast<std::ptrdiff_t>(res.body().size());
  account(size);  // a response being written to a client that reads slowly is held output too
  auto [ec, n] = co_await bhttp::async_write(socket_, res, kTuple);
  account(-size);
  if (ec) co_return false;
  co_return keep_alive;
}

awaitable<bool> Connection::send_json(bhttp::status status, const json& body, bool keep_alive,
                                      const std::vector<std::pair<std::string, std::string>>& headers) {
  Response res{status, 11};
  res.set(bhttp::field::content_type, "application/json");
  for (const auto& [k, v] : headers) res.set(k, v);
  res.body() = protocol::dump(body);
  co_return co_await send(std::move(res), keep_alive);
}

awaitable<bool> Connection::send_error(const openai::ApiError& e, bool keep_alive) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.status == 429) headers.emplace_back("Retry-After", "1");
  // A local, not a temporary in the co_await (g++ 12 destroys a conditional's temporary too early there).
  json body = openai::error_body(e);
  if (api_ == Api::kOllama) body = ollama::error_body(e);
  co_return co_await send_json(static_cast<bhttp::status>(e.status), body, keep_alive, headers);
}

openai::ApiError Connection::car_error(std::string_view code, std::string_view message) const {
  return api_ == Api::kOllama ? ollama::from_car_error(code, message) : openai::from_car_error(code, message);
}

}  // namespace car::daemon::http
