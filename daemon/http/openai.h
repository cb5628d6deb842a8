// The OpenAI-compatible API's shapes, as pure functions (no I/O): an OpenAI request body becomes a car
// `infer` request (then parsed and validated by protocol::parse_infer like any socket request), and car's
// replies and token events become OpenAI's responses, stream chunks and error objects. The HTTP front
// (http_server.h) calls these; tests and the fuzzer call them directly.
//
// Mapping (docs/http.md):
// - POST /v1/completions: `prompt` (a string, or an array of one string) -> `prompt`; POST
//   /v1/chat/completions: `messages` (string content or text parts) -> `messages`, rendered by the daemon
//   with the model's chat template.
// - `max_tokens` (chat: `max_completion_tokens` first), `temperature`, `top_p`, `seed`, `stop`, `stream` map
//   one to one; chat `logprobs` + `top_logprobs` and completions' integer `logprobs` become car's
//   `logprobs` / `top_logprobs`.
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
  nlohmann::json
      car;  ///< the car `infer` request object (op, model, prompt/messages, ...): known fields only
  std::string model;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  bool logprobs = false;       ///< per-token logprobs requested
  int top_logprobs = 0;
};

/// Map an OpenAI request body (JSON text) for `endpoint`. nullopt return: `out` is filled; otherwise the
/// 400 to answer.
std::optional<ApiError> map_request(Endpoint endpoint, std::string_view body, Mapped& out);

/// The HTTP error for a car error reply (`code` as in protocol::code).
ApiError from_car_error(std::string_view code, std::string_view message);

/// car finish_reason -> OpenAI ("eos"/"stop" -> "stop", "length" -> "length"; anything else as is).
std::string finish_reason(std::string_view car_reason);

/// The non-streamed response for a car `infer` result (`text`, `finish_reason`, `usage`, and `logprobs`
/// when asked). `id` like "chatcmpl-12", `created` in Unix seconds.
nlohmann::json response(Endpoint endpoint, const Mapped& req, const nlohmann::json& car_result,
                        const std::string& id, int64_t created);

/// Chunks of a streamed response. `first`: the chat chunk carries the assistant role.
nlohmann::json text_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                          std::string_view text, bool first, const nlohmann::json& logprobs = nullptr);
/// The last content chunk: empty delta/text and the finish reason.
nlohmann::json finish_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                            std::string_view car_reason);
/// The usage chunk (stream_options.include_usage): no choices, `usage` set.
nlohmann::json usage_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                           const nlohmann::json& car_usage);

/// car's per-token logprobs (`[{"token", "text", "logprob", "top_logprobs": [...]}]`) in the chat shape
/// (`{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": null}`); `top` entries kept.
nlohmann::json chat_logprobs(const nlohmann::json& car_logprobs, int top);
/// ... in the legacy completions shape (`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`).
nlohmann::json completion_logprobs(const nlohmann::json& car_logprobs, int top);

/// One server-sent event carrying `data` (`data: ...\n\n`); a payload with newlines is split across data
/// lines as the SSE format requires.
std::string sse_event(std::string_view data);
/// The stream's terminator: `data: [DONE]\n\n`.
std::string sse_done();

/// `usage` in OpenAI's shape from car's `{"prompt_tokens", "completion_tokens"}`.
nlohmann::json usage(const nlohmann::json& car_usage);

}  // namespace car::daemon::http::openai
