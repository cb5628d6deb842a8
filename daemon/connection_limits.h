// ConnectionLimits: what one client may hold of the daemon - how many connections in all and per peer
// uid, how long a request line may stay incomplete, how many bytes of unread replies a connection may
// queue - and the counts those limits are checked against (open connections per uid, queued reply bytes,
// refusals, timeouts, overflows) for `stats`.
//
// The connection cap is lowered to fit the process's open-file limit (fit_connection_cap), so connections
// can never use up the descriptors that model loads, `list` and the journal need.
//
// Owned by the ConnectionManager and shared by both fronts: the listener (daemon/listener.h) admits every
// connection against it and counts it open; the front's connections report queued and written output and
// their close. Every member runs on the io thread (no lock).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "daemon/server_options.h"

namespace car::daemon {

/// File descriptors kept out of the connection cap for the daemon itself: the listening socket, epoll and
/// eventfds, the journal, model files being loaded or streamed, a directory being listed.
std::size_t fd_reserve(uint64_t fd_limit);
/// The connection cap that fits an open-file limit (`fd_limit` = RLIMIT_NOFILE's soft value):
/// min(requested, fd_limit - fd_reserve(fd_limit)), at least 1.
std::size_t fit_connection_cap(std::size_t requested, uint64_t fd_limit);
/// RLIMIT_NOFILE's soft limit (RLIM_INFINITY as UINT64_MAX).
uint64_t current_fd_limit();

class ConnectionLimits {
 public:
  ConnectionLimits(const LiveSettings& live, uint64_t fd_limit);

  /// Take new limits (SIGHUP). Connections already open stay open even when above a lowered cap.
  void apply(const LiveSettings& live);

  /// Why a new connection from `uid` must be refused; empty when it may be admitted. Both fronts' connections
  /// count against one cap; a peer without a known uid (TCP) against the cap only.
  std::string refusal(std::optional<uid_t> uid) const;
  void opened(std::optional<uid_t> uid);
  void closed(std::optional<uid_t> uid);
  void count_refusal() { ++refused_; }
  void count_line_timeout() { ++line_timeouts_; }
  void count_output_overflow() { ++output_overflows_; }
  /// Reply bytes queued (positive) or written/dropped (negative) by some session.
  void add_queued(std::ptrdiff_t delta) {
    queued_bytes_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(queued_bytes_) + delta);
  }

  /// Connections closed since the last call (the server returns freed memory to the system after closes).
  std::size_t take_closed() { return std::exchange(closed_since_, 0); }

  std::size_t max_connections() const { return cap_; }
  std::size_t max_per_uid() const { return live_.max_connections_per_uid; }
  std::chrono::seconds line_timeout() const { return live_.line_timeout; }
  std::size_t max_pending_output() const { return live_.max_pending_output_bytes; }

  // The output rule, one for both fronts. A connection's held output is what it queued for its client
  // and has not written yet. At max_pending_output() a front stops taking requests (reading resumes below
  // half of it); a stream whose next event would take the held output past twice it is cancelled with
  // `output_overflow` instead of paused, since a paused generation keeps its model and a worker.
  /// Stop reading requests: the client leaves this much of the connection's output unread.
  bool pause_reading(std::size_t held) const { return held >= max_pending_output(); }
  /// Reading may resume.
  bool resume_reading(std::size_t held) const { return held < max_pending_output() / 2; }
  /// The held output past which a stream is cancelled: twice max_pending_output().
  std::size_t overflow_bound() const { return 2 * max_pending_output(); }
  /// Would `more` bytes of a stream on a connection holding `held` pass overflow_bound()?
  bool overflows(std::size_t held, std::size_t more) const { return held + more > overflow_bound(); }

  std::size_t open() const { return open_; }
  uint64_t fd_limit() const { return fd_limit_; }

  /// `{"open", "max", "max_per_uid", "uids", "refused", "line_timeouts", "output_overflows",
  /// "queued_bytes"}`.
  nlohmann::json stats() const;

 private:
  LiveSettings live_;
  uint64_t fd_limit_;
  std::size_t cap_;  // live_.max_connections fitted to fd_limit_
  std::size_t open_ = 0;
  std::unordered_map<uid_t, std::size_t> per_uid_;  // open connections by peer uid; no zero entries
  std::size_t queued_bytes_ = 0;                    // sum of every session's unwritten reply bytes
  std::size_t closed_since_ = 0;
  uint64_t refused_ = 0;
  uint64_t line_timeouts_ = 0;
  uint64_t output_overflows_ = 0;
};

}  // namespace car::daemon
