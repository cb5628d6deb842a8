#include "daemon/connection_limits.h"

#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

namespace car::daemon {

std::size_t fd_reserve(uint64_t fd_limit) {
  return static_cast<std::size_t>(std::max<uint64_t>(128, fd_limit / 8));
}

std::size_t fit_connection_cap(std::size_t requested, uint64_t fd_limit) {
  const uint64_t reserve = fd_reserve(fd_limit);
  const uint64_t room = fd_limit > reserve ? fd_limit - reserve : 1;
  return static_cast<std::size_t>(std::max<uint64_t>(1, std::min<uint64_t>(requested, room)));
}

uint64_t current_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
    return std::numeric_limits<uint64_t>::max();
  }
  return static_cast<uint64_t>(rl.rlim_cur);
}

ConnectionLimits::ConnectionLimits(const LiveSettings& live, uint64_t fd_limit)
    : live_(live), fd_limit_(fd_limit), cap_(fit_connection_cap(live.max_connections, fd_limit)) {
  if (cap_ < live.max_connections) {
    spdlog::warn(
        "max connections lowered from {} to {}: the open-file limit is {} and {} descriptors are kept "
        "for models and the daemon itself (raise LimitNOFILE= / ulimit -n)",
        live.max_connections, cap_, fd_limit_, fd_reserve(fd_limit_));
  }
}

void ConnectionLimits::apply(const LiveSettings& live) {
  const std::size_t cap = fit_connection_cap(live.max_connections, fd_limit_);
  if (cap < live.max_connections) {
    spdlog::warn("max connections lowered from {} to {} to fit the open-file limit {}", live.max_connections,
                 cap, fd_limit_);
  }
  live_ = live;
  cap_ = cap;
}

std::string ConnectionLimits::refusal(std::optional<uid_t> uid) const {
  if (open_ >= cap_) {
    return "car-inferenced already serves " + std::to_string(open_) +
           " connections (CAR_INFERENCE_MAX_CONNECTIONS=" + std::to_string(cap_) +
           "); close one or retry later";
  }
  if (!uid) return {};
  auto it = per_uid_.find(*uid);
  if (it != per_uid_.end() && it->second >= live_.max_connections_per_uid) {
    return "uid " + std::to_string(*uid) + " already has " + std::to_string(it->second) +
           " connections open (CAR_INFERENCE_MAX_CONNECTIONS_PER_UID=" +
           std::to_string(live_.max_connections_per_uid) + "); close one or retry later";
  }
  return {};
}

void ConnectionLimits::opened(std::optional<uid_t> uid) {
  ++open_;
  if (uid) ++per_uid_[*uid];
}

void ConnectionLimits::closed(std::optional<uid_t> uid) {
  if (open_ > 0) --open_;
  if (uid) {
    auto it = per_uid_.find(*uid);
    if (it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
  }
  ++closed_since_;
}

nlohmann::json ConnectionLimits::stats() const {
  return {{"open", open_},
          {"max", cap_},
          {"max_per_uid", live_.max_connections_per_uid},
          {"uids", per_uid_.size()},
          {"refused", refused_},
          {"line_timeouts", line_timeouts_},
          {"output_overflows", output_overflows_},
          {"queued_bytes", queued_bytes_}};
}

}  // namespace car::daemon
