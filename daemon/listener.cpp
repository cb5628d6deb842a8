#include "daemon/listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "core/util/error_codes.h"

namespace car::daemon {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Protocol = asio::generic::stream_protocol;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

}  // namespace

Listener::Listener(asio::io_context& io, ConnectionLimits& limits, Options options)
    : io_(io),
      limits_(limits),
      options_(std::move(options)),
      acceptor_(io),
      next_number_(options_.first_number) {}

Listener::~Listener() {
  remove_socket_file();
}

Result<void> Listener::listen_unix(const std::string& path, const std::string& group, std::string_view what) {
  // Resolve the group before the socket file exists, so a bad group leaves nothing behind.
  std::optional<gid_t> gid;
  if (!group.empty()) {
    auto g = resolve_group(group);
    if (!g) return make_error(g.error().code, std::string(what) + " group: " + g.error().message);
    gid = *g;
  }
  auto fd = daemon::listen_unix(path, gid, what, socket_file_);
  if (!fd) return fd.error();
  boost::system::error_code ec;
  acceptor_.assign(Protocol(AF_UNIX, 0), *fd, ec);
  if (ec) {
    ::close(*fd);
    daemon::remove_owned_socket_file(socket_file_);
    return make_error(errc::kListenFailed,
                      "cannot adopt " + std::string(what) + " on " + path + ": " + ec.message());
  }
  unix_socket_ = true;
  return {};
}

Result<void> Listener::listen_tcp(const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec) return make_error(errc::kListenFailed, "'" + host + "' is not an IP address");
  const asio::ip::tcp::endpoint ep(ip, port);
  config::HttpAddress address;
  address.host = host;
  address.port = port;
  const std::string where = address.to_string();
  acceptor_.open(Protocol(ep.protocol().family(), ep.protocol().protocol()), ec);
  if (ec) return make_error(errc::kListenFailed, "socket(): " + ec.message());
  acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  acceptor_.bind(Protocol::endpoint(ep), ec);
  if (ec) return make_error(errc::kListenFailed, "cannot bind " + where + ": " + ec.message());
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(errc::kListenFailed, "listen on " + where + ": " + ec.message());
  unix_socket_ = false;
  return {};
}

Result<void> Listener::adopt(int fd, std::string_view what) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return make_error(errc::kListenFailed,
                      "getsockname on " + std::string(what) + " fd: " + std::strerror(errno));
  }
  const int family = ss.ss_family;
  if (family != AF_UNIX && family != AF_INET && family != AF_INET6) {
    return make_error(errc::kListenFailed, std::string(what) + " fd is neither a Unix nor a TCP socket");
  }
  boost::system::error_code ec;
  acceptor_.assign(Protocol(family, family == AF_UNIX ? 0 : IPPROTO_TCP), fd, ec);
  if (ec) {
    return make_error(errc::kListenFailed,
                      "cannot adopt " + std::string(what) + " socket-activation fd: " + ec.message());
  }
  unix_socket_ = family == AF_UNIX;
  return {};
}

void Listener::start(OnAdmit on_admit) {
  on_admit_ = std::move(on_admit);
  if (acceptor_.is_open()) asio::co_spawn(io_, accept_loop(), asio::detached);
}

void Listener::close() {
  stopping_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

void Listener::remove_socket_file() {
  close();
  daemon::remove_owned_socket_file(socket_file_);
}

uint16_t Listener::port() const {
  if (!acceptor_.is_open()) return 0;
  boost::system::error_code ec;
  auto ep = acceptor_.local_endpoint(ec);
  if (ec) return 0;
  if (ep.data()->sa_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(ep.data())->sin_port);
  if (ep.data()->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(ep.data())->sin6_port);
  return 0;
}

asio::awaitable<void> Listener::accept_loop() {
  asio::steady_timer backoff(io_);
  while (acceptor_.is_open() && !stopping_) {
    auto [ec, socket] = co_await acceptor_.async_accept(kTuple);
    if (stopping_ || ec == asio::error::operation_aborted) break;
    if (ec) {  // e.g. EMFILE: wait a little rather than spin
      spdlog::warn("{}: accept failed: {} (retrying)", options_.log_prefix, ec.message());
      backoff.expires_after(100ms);
      co_await backoff.async_wait(kTuple);
      continue;
    }
    admit(std::move(socket));
  }
}

void Listener::admit(Socket socket) {
  Peer peer;
  if (unix_socket_) {
    auto creds = peer_credentials(socket.native_handle());
    if (!creds) {
      spdlog::warn("{}: rejecting a connection: {}", options_.log_prefix, creds.error().message);
      return;  // `socket` closes here
    }
    peer.credentials = *creds;
  }
  peer.number = next_number_++;
  if (peer.credentials && !peer_allowed(*peer.credentials, options_.allowed_uids, options_.allowed_gids)) {
    spdlog::warn("{} {}: rejected peer {} (not in the allow-list)", options_.log_prefix, peer.number,
                 peer.credentials->to_string());
    return;
  }
  if (std::string why = limits_.refusal(peer.uid()); !why.empty()) {
    limits_.count_refusal();
    // The socket is new, so its send buffer has room: no blocking.
    const std::string text = options_.refusal ? options_.refusal(why) : std::string();
    if (!text.empty())
      (void)::send(socket.native_handle(), text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_log_ >= 1s) {  // a flood of refusals logs once a second
      last_refusal_log_ = now;
      spdlog::warn("{} {}: refused peer {}: {}", options_.log_prefix, peer.number,
                   peer.credentials ? peer.credentials->to_string() : std::string("(tcp)"), why);
    }
    return;  // `socket` closes here
  }
  if (peer.credentials) {
    spdlog::info("{} {}: accepted peer {}", options_.log_prefix, peer.number, peer.credentials->to_string());
  } else {
    spdlog::debug("{} {}: accepted", options_.log_prefix, peer.number);
  }
  limits_.opened(peer.uid());
  on_admit_(std::move(socket), peer);
}

Result<config::HttpAddress> listening_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return make_error(errc::kListenFailed,
                      std::string("getsockname on a listening fd: ") + std::strerror(errno));
  }
  config::HttpAddress a;
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_UNIX) {
    a.unix_socket = true;
    a.path = reinterpret_cast<sockaddr_un*>(&ss)->sun_path;
  } else if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    a.host = text;
    a.port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    a.host = text;
    a.port = ntohs(in6->sin6_port);
  } else {
    return make_error(errc::kListenFailed, "a listening fd is neither a Unix nor a TCP socket");
  }
  return a;
}

}  // namespace car::daemon
