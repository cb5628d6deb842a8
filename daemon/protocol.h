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

#include "core/util/result.h"

namespace car::protocol {

/// Longest request line the server accepts (the newline excluded).
inline constexpr std::size_t kMaxLineBytes = 1u << 20;

/// Error codes (CONTRACT.md). Stable: clients and tests match on them.
namespace code {
inline constexpr const char* kBadRequest = "bad_request";
inline constexpr const char* kUnknownOp = "unknown_op";
inline constexpr const char* kNotFound = "not_found";
inline constexpr const char* kForbidden = "forbidden";
inline constexpr const char* kLoadFailed = "load_failed";
inline constexpr const char* kContextOverflow = "context_overflow";
inline constexpr const char* kCancelled = "cancelled";
inline constexpr const char* kShuttingDown = "shutting_down";
inline constexpr const char* kInternal = "internal";
inline constexpr const char* kBusy = "busy";
inline constexpr const char* kIoError = "io_error";  ///< a streamed MoE expert could not be read from disk
}  // namespace code

/// A request line after framing and JSON parsing. `id` is null when the request carried none.
struct Request {
  nlohmann::json id;          ///< any JSON scalar (or null); echoed on every reply line
  std::string op;             ///< "load", "infer", ...
  nlohmann::json body;        ///< the whole object, for op-specific fields
};

/// Parse one line into a Request. Errors (code bad_request): not JSON, not an object, `id` not a scalar,
/// `op` missing or not a string. The id is recovered whenever the line is an object, so even a rejected
/// request's error reply carries it (`id_out`).
Result<Request> parse_request(std::string_view line, nlohmann::json* id_out);

/// Sampling and limits of an `infer` request, validated.
struct InferParams {
  std::string model;
  std::string prompt;
  int max_tokens = 128;
  std::optional<double> temperature;
  std::optional<int> top_k;
  std::optional<double> top_p;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;  ///< keep generating past end-of-sequence (benchmarks, tests)
  bool stream = false;
  std::optional<std::string> stream_experts;  ///< "on" | "off" | "auto" when the request loads the model
};

/// Upper bound on `max_tokens` (a typo such as 1e9 is a bad request, not a day of decoding).
inline constexpr int kMaxTokensLimit = 1 << 16;

/// Read `model` (required string). Error bad_request naming the field.
Result<std::string> model_field(const nlohmann::json& body);
/// Read the optional `stream_experts` field of load / infer: "on", "off" or "auto"; nullopt when absent or
/// null. Error bad_request for anything else.
Result<std::optional<std::string>> stream_experts_field(const nlohmann::json& body);
/// Read and validate every infer field (types and ranges). Error bad_request naming the field.
Result<InferParams> parse_infer(const nlohmann::json& body);

/// `{"id":..., "ok":true, "result":...}` serialized, without the newline.
std::string ok_line(const nlohmann::json& id, const nlohmann::json& result);
/// `{"id":..., "ok":false, "error":{"code","message"}}` serialized, without the newline.
std::string error_line(const nlohmann::json& id, std::string_view code, std::string_view message);
/// `{"id":..., "event":"token", "text":..., "token":...}`. Text that is not valid UTF-8 is replaced
/// byte-wise (U+FFFD) rather than failing the stream.
std::string token_line(const nlohmann::json& id, std::string_view text, int32_t token);

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

 private:
  std::size_t max_line_;
  std::string partial_;      // bytes of the current line so far; never more than max_line_
  bool discarding_ = false;  // the current line passed max_line_: drop bytes until '\n'
};

}  // namespace car::protocol
