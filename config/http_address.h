// HttpAddress: where the OpenAI-compatible HTTP front listens (CAR_INFERENCE_HTTP), parsed once, at the
// settings' edge; the daemon binds what this parsed and never reads the text again.
//
// Forms: `IPV4:PORT`, `[IPV6]:PORT` (an IP literal - no host names, so the address is what is bound) or
// `unix:/ABSOLUTE/PATH` (at most 107 bytes, the Unix socket path limit). PORT is 0-65535; 0 binds any free
// port (logged).
//
// Thread safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/util/result.h"

namespace car::config {

struct HttpAddress {
  bool unix_socket = false;
  std::string path;  ///< unix_socket: the absolute socket path
  std::string host;  ///< TCP: the IP literal, without brackets
  std::uint16_t port = 0;
  /// A Unix socket, 127.0.0.0/8, ::1 or an IPv4-mapped loopback address (no API key needed there).
  bool loopback() const;
  /// `unix:/PATH`, `HOST:PORT` or `[V6]:PORT`: what parse_http_address reads back to this address.
  std::string to_string() const;
  bool operator==(const HttpAddress&) const = default;
};

/// Parse one of the forms above. Error invalid_setting whose message says what is wrong with `text`
/// (without naming the variable: the caller says where the text came from).
Result<HttpAddress> parse_http_address(std::string_view text);

}  // namespace car::config
