// The Ollama API's shapes, as pure functions (no I/O), beside openai.h: an Ollama request body becomes car's
// typed `infer` request (protocol::InferParams, built through the infer field table's rows, so it is
// validated exactly as a socket request), and car's typed results become Ollama's responses and
// newline-delimited JSON stream lines. The HTTP front (http_connection.cpp) routes /api/* here.
//
// Mapping (docs/http.md, "The Ollama API"):
// - POST /api/generate: `prompt` (+ `system`) is rendered with the model's chat template as a user turn,
//   or used as it is with `raw: true` or when the model has no template (Ollama's `{{ .Prompt }}`).
//   POST /api/chat: `messages` (string content), rendered with the model's chat template.
// - `options`: temperature, top_k, top_p, min_p, seed, stop, num_predict (-> max_tokens; absent or
//   negative: until the context is full, as Ollama does), repeat_penalty, repeat_last_n (-1: the whole
//   context), num_ctx map onto car's fields. Options that would change the result and car cannot honour
//   (mirostat, penalties, typical_p, tfs_z) are a 400 unless neutral; options that only tune the machine
//   (num_thread, num_gpu, use_mmap, ...) are accepted and ignored. Unknown fields and options are a 400
//   naming the nearest known one, as on the socket and the OpenAI front.
// - `keep_alive`: a Go duration ("5m", "1h30m", "-1") or a number of seconds; negative: as long as the
//   daemon allows (CAR_INFERENCE_MAX_KEEP_ALIVE_SECS). A generate/chat without a prompt/messages loads the
//   model (done_reason "load"), or with `keep_alive` 0 unloads it (done_reason "unload").
// - `format`, `images`, `suffix`, `template`, `context`, `tools` and `think: true` would change what
//   Ollama answers and car cannot do them: a 400, never ignored.
// - Errors are `{"error": "message"}` with the status Ollama uses (400, 404 for a missing model, ...); a
//   stream that fails after its first line ends with such a line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/gguf/model_info.h"
#include "daemon/http/openai.h"
#include "daemon/protocol/results.h"
#include "daemon/protocol/schema.h"

namespace car::daemon::http::ollama {

enum class Endpoint { kGenerate, kChat };

/// An Ollama request mapped to car.
struct Mapped {
  /// car's `infer` request (unless load_only); finish() it for the InferParams the handler takes.
  protocol::InferBuilder infer;
  std::string model;  ///< the model id (a trailing ":latest" tag removed)
  std::string name;   ///< the model as the request named it: what the answer's `model` echoes
  bool stream = true;  ///< Ollama streams unless told `"stream": false`
  /// No prompt / messages: only load the model (or unload it, `unload`) and answer done_reason load/unload.
  bool load_only = false;
  bool unload = false;  ///< load_only with keep_alive 0
  std::optional<int64_t> keep_alive_s;  ///< the request's keep_alive in seconds (already capped)
  /// generate without raw: the prompt is used as is when the model has no chat template.
  bool raw_without_template = false;
  std::string raw_prompt;  ///< that prompt
  /// num_predict absent or negative: generate until the context is full.
  bool to_context = true;
};

/// Map a request body (JSON text) for `endpoint`. nullopt: `out` is filled; otherwise the error to answer.
std::optional<openai::ApiError> map_request(Endpoint endpoint, std::string_view body, Mapped& out);

/// The model id a request names: `name` without a trailing ":latest" (Ollama's default tag), so tools that
/// add it find the file.
std::string model_id(std::string_view name);

/// `keep_alive` as Ollama reads it: a number of seconds or a Go duration string ("300ms", "5m", "1h30m",
/// "-1"); negative means forever, returned as limits::kMaxIdleSecs. Whole seconds, rounded up.
/// nullopt + `error` set: not a duration.
std::optional<int64_t> keep_alive_seconds(const nlohmann::json& v, std::string& error);

/// `{"error": message}`.
nlohmann::json error_body(const openai::ApiError& e);
/// The status and message Ollama would use for a car error reply.
openai::ApiError from_car_error(std::string_view code, std::string_view message);

/// RFC 3339 time with nanoseconds in UTC ("2026-12-05T06:12:01.123456789Z") for a Unix time in ns.
std::string rfc3339(int64_t unix_ns);

/// One stream line (with its '\n') carrying `text`: generate's `response`, chat's assistant `message`.
std::string text_line(Endpoint endpoint, const std::string& model, const std::string& created_at,
                      std::string_view text);
/// The final object: done, done_reason, the counts and durations (ns); `text` is the whole response for a
/// non-streamed answer, empty for a stream's last line. With '\n' when `line`.
std::string final_object(Endpoint endpoint, const std::string& model, const std::string& created_at,
                         const protocol::InferResult& result, std::string_view text, bool line);
/// The answer to a load / unload request (done_reason "load" or "unload").
std::string load_object(Endpoint endpoint, const std::string& model, const std::string& created_at, bool unload);
/// car finish_reason -> Ollama done_reason ("eos"/"stop" -> "stop", "length" -> "length").
std::string done_reason(std::string_view car_reason);

/// What /api/tags, /api/ps and /api/show say of one model file.
struct ModelFacts {
  std::string id;
  uint64_t file_bytes = 0;
  int64_t modified_unix_ns = 0;
  std::optional<gguf::ModelInfo> info;  ///< nullopt: not a readable GGUF file
};
/// `details`: format, family, families, parameter_size, quantization_level.
nlohmann::json details(const ModelFacts& m);
/// A stable identity of the file's version (id, size, modification time), hex: Ollama's `digest` field. Not a
/// content hash: hashing a model of many GB for a listing would take seconds.
std::string digest(const ModelFacts& m);
/// One /api/tags entry.
nlohmann::json tags_entry(const ModelFacts& m);
/// One /api/ps entry: `size` the bytes the cache charges, `expires_at` when it would be evicted for
/// idleness (far future when never).
nlohmann::json ps_entry(const ModelFacts& m, uint64_t charged_bytes, std::optional<int64_t> expires_unix_ns);

}  // namespace car::daemon::http::ollama
