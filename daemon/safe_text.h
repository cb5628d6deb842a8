// Text from clients, made safe to show: the one place that decides which characters may appear in a model
// id and how a client-supplied string is written into a log line.
//
// Unsafe characters (is_unsafe_code_point): C0 controls, DEL, C1 controls (U+0080-U+009F), the line and
// paragraph separators U+2028/U+2029, the bidirectional formatting characters (U+061C, U+200E, U+200F,
// U+202A-U+202E, U+2066-U+2069), zero-width characters U+200B-U+200D, U+2060 and the byte-order mark
// U+FEFF. They can forge a log line's fields, reorder what a terminal shows, or make two ids look alike.
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace car::daemon {

/// The length of the valid UTF-8 sequence at the start of `s`, or 0 when its first bytes are not one
/// (overlong forms, surrogates and code points above U+10FFFF are invalid; an empty `s` gives 0).
std::size_t utf8_sequence_length(std::string_view s);

/// Whether `cp` is one of the unsafe characters above.
bool is_unsafe_code_point(char32_t cp);

/// Why `s` is not safe text: "byte 0x.. at offset N is not valid UTF-8" or "U+XXXX at offset N is a
/// control/format character"; nullopt when every character is safe.
std::optional<std::string> unsafe_text_reason(std::string_view s);

/// `s` in double quotes for a log line: `"` and `\` escaped, unsafe characters as \uXXXX, bytes that are
/// not valid UTF-8 as \xNN; other characters (printable ASCII and valid non-ASCII text) as they are. The
/// result never contains a newline, a control character or a bidi control, and always ends in '"'.
std::string log_quote(std::string_view s);

/// A request id for a log line: `-` for null, strings as log_quote, numbers and booleans as JSON.
std::string log_id(const nlohmann::json& id);

}  // namespace car::daemon
