// The wire protocol between car-inferenced and its clients (CONTRACT.md "Wire protocol", docs/protocol.md):
// newline-delimited JSON over a Unix stream socket, one object per line each way, at most 1 MiB per line.
//
// This header is shared by the server (daemon/) and the `car` client (tools/): request parsing and
// validation, the reply/event builders, error codes, and LineFramer, which cuts a byte stream into lines
// and reports over-long lines without losing the framing. Everything here is pure (no I/O, no globals) and
// safe to use from any thread; a LineFramer is owned by one reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/generate_request.h"
#include "core/util/error_codes.h"
#include "core/util/limits.h"
#include "core/util/result.h"
#include "core/util/stream_experts.h"

namespace car::protocol {

/// Longest request line the server accepts (the newline excluded).
inline constexpr std::size_t kMaxLineBytes = 1u << 20;

/// The error codes (CONTRACT.md): the wire rows of car's one code table (core/util/error_codes.h, Reach
/// kWire and kWireDaemon), under the names the daemon has always used (`protocol::code::kBadRequest`).
/// Stable: clients and tests match on them.
namespace code = ::car::errc;

/// The wire code for an error code reported by the runtime or the cache: itself when its row's Reach is
/// kWire, else `internal`.
std::string_view wire_code(std::string_view code);

/// The request ops, one row each: enumerator and wire name.
#define CAR_PROTOCOL_OPS(X)    \
  X(kLoad, "load")             \
  X(kInfer, "infer")           \
  X(kStats, "stats")           \
  X(kMetrics, "metrics")       \
  X(kInvalidate, "invalidate") \
  X(kList, "list")             \
  X(kHealth, "health")         \
  X(kCancel, "cancel")

enum class Op {
#define CAR_PROTOCOL_OP_ENUM(e, name) e,
  CAR_PROTOCOL_OPS(CAR_PROTOCOL_OP_ENUM)
#undef CAR_PROTOCOL_OP_ENUM
};

/// The op named `name`, or nullopt for an unknown op.
std::optional<Op> op_from_name(std::string_view name);
/// The wire name of `op`.
std::string_view op_name(Op op);
/// "load, infer, ..." in table order, for the unknown_op message.
const std::string& known_ops_text();

/// A request line after framing and JSON parsing. `id` is null when the request carried none.
struct Request {
  nlohmann::json id;          ///< any JSON scalar (or null); echoed on every reply line
  std::string op;             ///< "load", "infer", ...
  nlohmann::json body;        ///< the whole object, for op-specific fields
};

/// Strict schema: every member of a request object must be a field its op knows (`id`, `op` and `strict`
/// are known to every op). An unknown member is bad_request naming it, with a suggestion when a known field
/// is close ("unknown field 'tempreature' for op 'infer' (did you mean 'temperature'?)"). A request with
/// `"strict": false` skips the check; `strict` other than a boolean is bad_request.
Result<void> check_fields(Op op, const nlohmann::json& body);
/// The fields `op` knows, besides `id`, `op` and `strict`, in a fixed order (for messages and docs).
const std::vector<std::string_view>& known_fields(Op op);

/// How deep a request document may nest (objects and arrays; the request object counts one). A deeper line
/// is bad_request before it is parsed: copying, dumping and comparing a document recurse over it, and so
/// does converting `messages` for a chat template (which accepts 128 levels, the messages array counting
/// one). Real requests (conversations with tool calls, JSON schemas in tools) stay within a few tens.
constexpr int kMaxRequestDepth = 128;

/// True when the JSON text nests deeper than `limit` arrays and objects: one pass that skips strings (the
/// text need not be valid JSON; an invalid one is the parser's to refuse).
bool nests_deeper_than(std::string_view text, int limit);

/// Parse one line into a Request. Errors (code bad_request): nested deeper than kMaxRequestDepth, not
/// JSON, not an object, `id` not a scalar or
/// a number other than an integer in int64/uint64 range (2.5, 1e3, 2^64 and -0 could not be echoed as
/// sent), `op` missing or not a string. The id is recovered whenever the line is an object, so even a
/// rejected request's error reply carries it (`id_out`).
Result<Request> parse_request(std::string_view line, nlohmann::json* id_out);

/// What to generate: the part of an `infer` request the runtime receives, parsed once (parse_infer) and
/// passed to ModelRuntime's Backend::generate as it is. The generation fields are parsed straight into
/// `generate`, the engine's own request: a new field is one parse step here and nothing in between. Unset
/// fields keep the engine's defaults.
struct GenerateParams {
  /// prompt, max_tokens, sampling (temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed),
  /// stop, ignore_eos, logprobs, top_logprobs. `prompt` is empty when `messages` is given (the runtime
  /// renders them into it).
  engine::GenerateRequest generate;
  /// A conversation instead of `prompt` (an array of {role, content, ...} objects): rendered with the model's
  /// chat template, or `chat_template` when given, then tokenized with special-token text parsed.
  std::optional<nlohmann::json> messages;
  bool add_generation_prompt = true;         ///< end the rendered prompt with the assistant's turn opening
  std::optional<std::string> chat_template;  ///< template text used instead of the model's
  /// The request gave `seed`; when false the daemon draws a fresh random one into generate.sampling.seed
  /// (and reports it), so sampled text is reproducible only when asked for.
  bool seed_given = false;
};

/// One generated token's logprob entry, as the final result's `logprobs` array and a streamed token event
/// carry it: the id, its own text (token_to_piece, special tokens as text; may be a partial UTF-8
/// character, sent with U+FFFD), its full-vocabulary log-probability before penalties and filters, and the
/// K most likely ids at that position.
struct TokenLogprob {
  int32_t token = 0;
  std::string text;
  double logprob = 0;
};
struct TokenLogprobs : TokenLogprob {
  std::vector<TokenLogprob> top_logprobs;
};
/// `{"token", "text", "logprob", "top_logprobs": [{"token", "text", "logprob"}, ...]}`.
nlohmann::json logprobs_json(const TokenLogprobs& lp);

/// A streamed token: the id (-1 for the text held back at the end), the text it released, and with
/// `logprobs` / `top_logprobs` its logprob entry.
struct TokenEvent {
  int32_t token = 0;
  std::string text;
  std::optional<TokenLogprobs> logprobs;
};

/// Upper bound on `top_logprobs` (as OpenAI's API).
inline constexpr int kMaxTopLogprobs = 20;

/// An `infer` request, validated: what to generate plus what the daemon does around it.
struct InferParams : GenerateParams {
  std::string model;
  bool stream = false;
  std::optional<StreamExperts> stream_experts;  ///< the request's choice when it loads the model
};

/// Upper bound on `num_ctx` (the one CAR_INFERENCE_CONTEXT has); the engine bounds num_ctx by the context
/// the model is loaded with.
inline constexpr int kMaxContextLimit = limits::kMaxContextTokens;

/// Upper bound on `max_tokens` (core/util/limits.h).
inline constexpr int kMaxTokensLimit = limits::kMaxGenerateTokens;

/// Read `model` (required string). Error bad_request naming the field.
Result<std::string> model_field(const nlohmann::json& body);
/// Read the optional `stream_experts` field of load / infer: "on", "off" or "auto"; nullopt when absent or
/// null. Error bad_request for anything else.
Result<std::optional<StreamExperts>> stream_experts_field(const nlohmann::json& body);
/// Upper bound on a request's `keep_alive` in seconds (the range of CAR_INFERENCE_MAX_KEEP_ALIVE_SECS); the
/// daemon then cuts it to its CAR_INFERENCE_MAX_KEEP_ALIVE_SECS.
inline constexpr int64_t kMaxKeepAliveSecs = limits::kMaxIdleSecs;
/// Read the optional `keep_alive` field of load / infer: whole seconds the model stays loaded after the
/// request (0: unload it when the request ends); nullopt when absent or null. Error bad_request otherwise.
Result<std::optional<int64_t>> keep_alive_field(const nlohmann::json& body);
/// Read and validate every infer field (types and ranges). Error bad_request naming the field.
Result<InferParams> parse_infer(const nlohmann::json& body);

/// `{"id":..., "ok":true, "result":...}` serialized, without the newline.
std::string ok_line(const nlohmann::json& id, const nlohmann::json& result);
/// `{"id":..., "ok":false, "error":{"code","message"}}` serialized, without the newline.
std::string error_line(const nlohmann::json& id, std::string_view code, std::string_view message);
/// `{"id":..., "event":"token", "text":..., "token":...}`, plus `"logprob"` and `"top_logprobs"` when the
/// event carries logprobs. Text that is not valid UTF-8 is replaced byte-wise (U+FFFD) rather than failing
/// the stream.
std::string token_line(const nlohmann::json& id, const TokenEvent& event);

/// Serialize JSON for the wire: compact, invalid UTF-8 replaced instead of throwing.
std::string dump(const nlohmann::json& value);

/// A reply line as the client sees it.
struct Reply {
  nlohmann::json id;
  bool is_event = false;      ///< a streaming event ("event" present), not the final reply
  std::string event;          ///< "token", ...
  bool ok = false;            ///< final replies only
  nlohmann::json result;      ///< ok replies
  std::string error_code;     ///< failed replies
  std::string error_message;
  nlohmann::json raw;         ///< the whole line, for --json output
};

/// Parse a reply line (client side). Error protocol_error when the server sent something unexpected.
Result<Reply> parse_reply(std::string_view line);

/// Cuts a byte stream into lines of at most `max_line` bytes. Lines longer than that are not buffered:
/// the framer reports one Oversized item for them and discards bytes up to the next newline, so a client
/// that sends a huge line keeps its connection. A trailing '\r' is kept (JSON parsing tolerates it).
class LineFramer {
 public:
  explicit LineFramer(std::size_t max_line = kMaxLineBytes) : max_line_(max_line) {}

  struct Item {
    enum class Kind { kLine, kOversized } kind;
    std::string line;  ///< the line without '\n' (empty for kOversized)
  };

  /// Feed bytes; complete items are appended to `out` in order.
  void feed(std::string_view bytes, std::vector<Item>& out);
  /// Bytes of the current unfinished line held (0 while discarding).
  std::size_t buffered() const { return partial_.size(); }
  /// Is a line started and not yet ended (bytes held, or an over-long line being discarded)?
  bool in_line() const { return !partial_.empty() || discarding_; }

 private:
  std::size_t max_line_;
  std::string partial_;      // bytes of the current line so far; never more than max_line_
  bool discarding_ = false;  // the current line passed max_line_: drop bytes until '\n'
};

}  // namespace car::protocol
