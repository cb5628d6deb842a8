// Request lines: one line of JSON into a Request (id, op, body), with the compact fast path for the
// field-less ops (`{"id":1,"op":"health"}` read without a document) and the nesting bound checked before
// anything is parsed. What an op's fields mean is the schema's (schema.h). Pure; any thread.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/util/result.h"

namespace car::protocol {

/// A request line after framing and JSON parsing. `id` is null when the request carried none.
struct Request {
  nlohmann::json id;          ///< any JSON scalar (or null); echoed on every reply line
  std::string op;             ///< "load", "infer", ...
  nlohmann::json body;        ///< the whole object, for op-specific fields
};

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

}  // namespace car::protocol
