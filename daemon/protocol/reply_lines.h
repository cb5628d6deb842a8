// Reply lines of the socket protocol (docs/protocol.md): the final `ok` / error reply and the streamed
// token events, serialized without the newline. Each line is written straight from its values (no document
// built in between) with the bytes a document would dump: keys in nlohmann::json's sorted order, invalid
// UTF-8 replaced (U+FFFD) rather than failing. Pure; any thread.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "daemon/protocol/results.h"

namespace car::protocol {

/// Serialize JSON for the wire: compact, invalid UTF-8 replaced instead of throwing.
std::string dump(const nlohmann::json& value);

/// `{"id":..., "ok":true, "result":...}` serialized, without the newline.
std::string ok_line(const nlohmann::json& id, const nlohmann::json& result);
/// `{"id":..., "ok":false, "error":{"code","message"}}` serialized, without the newline.
std::string error_line(const nlohmann::json& id, std::string_view code, std::string_view message);
/// `{"id":..., "event":"token", "text":..., "token":...}`, plus `"logprob"` and `"top_logprobs"` when the
/// event carries logprobs. Text that is not valid UTF-8 is replaced byte-wise (U+FFFD) rather than failing
/// the stream.
std::string token_line(const nlohmann::json& id, const TokenEvent& event);

/// `{"id":..., "ok":true, "result":{...}}` for an `infer` result (docs/protocol.md): the bytes ok_line would
/// write for the result as a document, written from the typed result without one (a result with logprobs
/// is some 1.5 KB a token as a document).
std::string infer_line(const nlohmann::json& id, const InferResult& result);

}  // namespace car::protocol
