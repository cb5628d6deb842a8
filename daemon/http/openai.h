// The OpenAI-compatible API's shapes, as pure functions (no I/O): an OpenAI request body becomes car's typed
// `infer` request (protocol::InferParams, built field by field through the infer field table's rows, so it
// is validated exactly as a socket request), and car's typed result and token events become OpenAI's
// responses, stream chunks and error objects - no car JSON document in between. The HTTP front
// (http_server.h) calls these; tests and the fuzzer call them directly.
//
// Mapping (docs/http.md):
// - POST /v1/completions: `prompt` (a string, or an array of one string) -> `prompt`; POST
//   /v1/chat/completions: `messages` (string content or text parts) -> `messages`, rendered by the daemon
//   with the model's chat template.
// - The parameters OpenAI spells as car does (the `OpenAi::kSame` rows of CAR_INFER_FIELDS: `model`,
//   `temperature`, `top_k`, `top_p`, `seed`, `stop`, `stream`) map one to one; `max_tokens` (chat:
//   `max_completion_tokens` first; completions default to 16), chat `logprobs` + `top_logprobs` and
//   completions' integer `logprobs` are converted into car's fields.
// - Parameters that would change the result and car cannot honour (`n` > 1, `best_of` > 1, `echo`,
//   `suffix`, `tools`, a non-text `response_format`, non-zero penalties, `logit_bias`) are a 400, never
//   ignored. Parameters that do not change the result (`user`, `metadata`, `store`, ...) are ignored.
// - car's finish reasons: `eos` and `stop` -> "stop", `length` -> "length".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "daemon/protocol/results.h"
#include "daemon/protocol/schema.h"

namespace car::daemon::http::openai {

enum class Endpoint { kCompletions, kChat };

/// An error as OpenAI reports it: HTTP status plus `{"error": {"message", "type", "param", "code"}}`.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  ///< empty: null
  std::string code;   ///< empty: null
};

/// `{"error": {...}}` for `e`.
nlohmann::json error_body(const ApiError& e);

/// A request mapped to car, and what the response needs to know about it.
struct Mapped {
  /// car's `infer` request, its fields set; finish() it for the InferParams (or the bad_request a socket
  /// request with these fields would get) the HTTP front hands the request handler.
  protocol::InferBuilder infer;
  std::string model;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  bool logprobs = false;       ///< per-token logprobs requested
  int top_logprobs = 0;
};

/// A request body as both HTTP APIs read it (this one and ollama.h): nesting bounded as on the socket (copying
/// and converting a document recurse over it), valid JSON, an object. nullopt: `body` holds it; otherwise
/// the 400 to answer.
std::optional<ApiError> parse_body(std::string_view text, nlohmann::json& body);

/// Map an OpenAI request body (JSON text) for `endpoint`. nullopt return: `out` is filled; otherwise the
/// 400 to answer.
std::optional<ApiError> map_request(Endpoint endpoint, std::string_view body, Mapped& out);

/// The HTTP error for a car error reply (`code` as in protocol::code).
ApiError from_car_error(std::string_view code, std::string_view message);

/// car finish_reason -> OpenAI ("eos"/"stop" -> "stop", "length" -> "length"; anything else as is).
std::string finish_reason(std::string_view car_reason);

/// The bodies below are serialized as they are built, in the order a document would dump its keys, from
/// car's typed result and token events: a response with logprobs is written a token's entry at a time (as a
/// document, 30k tokens of top_logprobs take some hundreds of MB). `id` like "chatcmpl-12", `created` in
/// Unix seconds. `logprobs` in a choice appear when the request asked for them, with `req.top_logprobs`
/// alternatives: chat's `{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": null}`,
/// the completions API's `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.

/// The non-streamed response: `text`, `finish_reason`, `usage`, and `logprobs`.
std::string response(Endpoint endpoint, const Mapped& req, const protocol::InferResult& result,
                     const std::string& id, int64_t created);
/// A chunk of a streamed response carrying `text` and, when given, the token's logprob entry. `first`: the
/// chat chunk carries the assistant role.
std::string text_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                       std::string_view text, bool first, const protocol::TokenLogprobs* logprobs = nullptr);
/// The last content chunk: empty delta/text and the finish reason.
std::string finish_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                         std::string_view car_reason);
/// The usage chunk (stream_options.include_usage): no choices, `usage` set.
std::string usage_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                        const protocol::GenerateOutput& output);

/// One server-sent event carrying `data` (`data: ...\n\n`); a payload with newlines is split across data
/// lines as the SSE format requires.
std::string sse_event(std::string_view data);
/// The stream's terminator: `data: [DONE]\n\n`.
std::string sse_done();

/// `usage` in OpenAI's shape (`prompt_tokens`, `completion_tokens`, `total_tokens`) for a generation.
nlohmann::json usage(const protocol::GenerateOutput& output);

}  // namespace car::daemon::http::openai
