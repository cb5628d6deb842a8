#include "daemon/http/http_server.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/util/error_codes.h"
#include "daemon/http/http_connection.h"
#include "daemon/http/openai.h"
#include "daemon/protocol.h"

namespace car::daemon::http {

namespace {

constexpr uint64_t kFirstConnectionNumber = 1'000'000;  // apart from the NDJSON connections in log lines

}  // namespace

Result<std::string> read_api_key(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    return make_error(errc::kInvalidSetting, "CAR_INFERENCE_HTTP_API_KEY_FILE=" + path.string() +
                                                 ": cannot read it: " + std::strerror(errno));
  }
  std::string line;
  std::getline(in, line);
  const auto b = line.find_first_not_of(" \t\r");
  const auto e = line.find_last_not_of(" \t\r");
  if (b == std::string::npos) {
    return make_error(errc::kInvalidSetting, "CAR_INFERENCE_HTTP_API_KEY_FILE=" + path.string() +
                                                 ": the first line (the key) is empty");
  }
  return line.substr(b, e - b + 1);
}

// ---- HttpFront ----

HttpFront::HttpFront(asio::io_context& io, RequestHandler& handler, ConnectionLimits& limits,
                     HttpOptions options)
    : handler_(handler),
      limits_(limits),
      options_(std::move(options)),
      listener_(
          io, limits,
          Listener::Options{.log_prefix = "http conn",
                            .first_number = kFirstConnectionNumber,
                            .allowed_uids = options_.allowed_uids,
                            .allowed_gids = options_.allowed_gids,
                            .refusal = [](const std::string& why) {
                              const std::string body = protocol::dump(openai::error_body(
                                  api_error(503, why, "too_many_connections", "server_error")));
                              return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                     "Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
                                     std::to_string(body.size()) + "\r\n\r\n" + body;
                            }}) {}

HttpFront::~HttpFront() {
  for (const auto& [c, uid] : connections_) c->close_now();
  listener_.remove_socket_file();
}

uint16_t HttpFront::port() const {
  return listener_.port();
}

Result<void> HttpFront::open() {
  if (options_.listen_fd) {
    auto a = listening_address(*options_.listen_fd);
    if (!a) return a.error();
    address_ = *a;
  } else if (options_.address) {
    address_ = *options_.address;
  } else {
    return make_error(errc::kListenFailed, "no HTTP address configured (CAR_INFERENCE_HTTP)");
  }
  if (!address_.loopback() && options_.api_key.empty()) {
    return make_error(errc::kListenFailed,
                      "refusing to serve HTTP on " + address_.to_string() +
                          ", which is not a loopback address, without an API key: set "
                          "CAR_INFERENCE_HTTP_API_KEY_FILE, or listen on 127.0.0.1, [::1] or a "
                          "unix: path");
  }
  if (options_.listen_fd) {
    if (auto ok = listener_.adopt(*options_.listen_fd, "the HTTP"); !ok) return ok;
    spdlog::info("http: listening on {} (passed by systemd, fd {})", address_.to_string(),
                 *options_.listen_fd);
    return {};
  }
  if (address_.unix_socket) {
    // Claimed like the NDJSON socket: never another process's live socket (or the daemon's own).
    if (auto ok = listener_.listen_unix(address_.path, options_.socket_group, "the HTTP socket"); !ok)
      return ok;
  } else {
    if (auto ok = listener_.listen_tcp(address_.host, address_.port); !ok) return ok;
    address_.port = port();
  }
  spdlog::info("http: listening on {}{}", address_.to_string(),
               options_.api_key.empty() ? " (no API key)" : " (API key required)");
  return {};
}

void HttpFront::start() {
  listener_.start(
      [this](Listener::Socket socket, const Listener::Peer& peer) { admit(std::move(socket), peer); });
}

void HttpFront::stop_accepting() {
  listener_.close();
}

void HttpFront::cancel_all() {
  for (const auto& [c, uid] : connections_) c->calls().cancel_all();
}

void HttpFront::close_all(bool graceful) {
  auto copy = connections_;
  for (const auto& [c, uid] : copy) {
    if (graceful) {
      c->close_when_idle();
    } else {
      c->close_now();
    }
  }
}

void HttpFront::closed(const std::shared_ptr<Connection>& c) {
  auto it = connections_.find(c);
  if (it == connections_.end()) return;
  limits_.closed(it->second);
  connections_.erase(it);
}

void HttpFront::admit(Listener::Socket socket, const Listener::Peer& peer) {
  auto c = std::make_shared<Connection>(std::move(socket), *this, peer.number);
  connections_.emplace(c, peer.uid());
  c->start();
}

}  // namespace car::daemon::http
