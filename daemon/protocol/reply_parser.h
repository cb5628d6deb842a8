// The client's side of the socket protocol: one reply line parsed into a Reply (final reply or streamed
// event). Used by the `car` client and the tests. Pure; any thread.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/util/result.h"

namespace car::protocol {

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

}  // namespace car::protocol
