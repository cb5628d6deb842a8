#include "config/http_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "core/util/error_codes.h"
#include "core/util/limits.h"

namespace car::config {

bool HttpAddress::loopback() const {
  if (unix_socket) return true;
  unsigned char v4[4];
  if (::inet_pton(AF_INET, host.c_str(), v4) == 1) return v4[0] == 127;
  unsigned char v6[16];
  if (::inet_pton(AF_INET6, host.c_str(), v6) != 1) return false;
  static constexpr unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static constexpr unsigned char kMappedV4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(v6, kLoopback6, 16) == 0) return true;
  return std::memcmp(v6, kMappedV4, 12) == 0 && v6[12] == 127;  // ::ffff:127.x.y.z
}

std::string HttpAddress::to_string() const {
  if (unix_socket) return "unix:" + path;
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Result<HttpAddress> parse_http_address(std::string_view text) {
  auto bad = [](const char* why) { return make_error(errc::kInvalidSetting, why); };
  HttpAddress a;
  if (text.starts_with("unix:")) {
    a.unix_socket = true;
    a.path = std::string(text.substr(5));
    if (a.path.empty() || a.path.front() != '/') {
      return bad("a unix: address needs an absolute path (unix:/run/x.sock)");
    }
    if (a.path.size() > limits::kMaxSocketPath)
      return bad("longer than 107 bytes (the Unix socket path limit)");
    return a;
  }
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("not HOST:PORT, [IPV6]:PORT or unix:/PATH");
  const std::string_view port = text.substr(colon + 1);
  unsigned long value = 0;
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) {
    if (c < '0' || c > '9') digits = false;
    value = value * 10 + static_cast<unsigned long>(c - '0');
  }
  if (!digits || value > 65535) return bad("the port must be 0-65535 (0: any free port, logged)");
  std::string host(text.substr(0, colon));
  unsigned char buf[16];
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    if (::inet_pton(AF_INET6, host.c_str(), buf) != 1) return bad("not an IPv6 address");
  } else if (::inet_pton(AF_INET, host.c_str(), buf) != 1) {
    return bad("the host must be an IPv4 address or a bracketed IPv6 address ([::1])");
  }
  a.host = std::move(host);
  a.port = static_cast<std::uint16_t>(value);
  return a;
}

}  // namespace car::config
