#include "daemon/connection_manager.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "daemon/session.h"

namespace car::daemon {

ConnectionManager::ConnectionManager(const LiveSettings& live) : limits_(live, current_fd_limit()) {}

ConnectionManager::~ConnectionManager() = default;

void ConnectionManager::start(const std::shared_ptr<Session>& session) {
  sessions_.insert(session);  // the listener counted it open in limits_
  session->start();
}

void ConnectionManager::closed(const std::shared_ptr<Session>& session) {
  if (sessions_.erase(session) != 0) {
    limits_.closed(session->peer().uid);
    spdlog::debug("conn {}: closed", session->number());
  }
  if (sessions_.empty() && all_closed_) std::exchange(all_closed_, nullptr)();
}

void ConnectionManager::cancel_all() {
  for (const auto& s : sessions_) s->calls().cancel_all();
}

void ConnectionManager::close_all(bool graceful, std::function<void()> all_closed) {
  all_closed_ = std::move(all_closed);
  auto copy = sessions_;  // closing erases from sessions_
  for (const auto& s : copy) {
    if (graceful) {
      s->close_when_idle();
    } else {
      s->close_now();
    }
  }
  if (sessions_.empty() && all_closed_) std::exchange(all_closed_, nullptr)();
}

}  // namespace car::daemon
