// Session: one NDJSON client connection - the front end of the Unix socket. A reader coroutine frames
// request lines (LineFramer), parses them and hands each to the RequestHandler; a writer coroutine drains
// the session's write queue (Asio's cpp20 chat_server shape). A line sent while nothing is queued or being
// written goes straight to the (non-blocking) socket; only what the socket does not take is queued. The
// session is the handler's Client: it puts the handler's replies and token events into reply lines.
//
// Lifetime: owned by shared_ptr - by the ConnectionManager, its coroutines, and every job still working
// for it. Every member runs on the io thread (workers post to it), so there is no lock. Its requests in
// flight are in its CallRegistry, each with a cancellation flag the worker checks between tokens. When the
// client goes away (end of file, read or write error) every request in flight is cancelled; once they have
// all reported and the queue is flushed, the socket is closed and the ConnectionManager told.
//
// Limits (ConnectionLimits, read at each use so SIGHUP changes them):
// - An idle connection holds a 1 KiB read buffer: the reader's pending read peeks into it; a chunk that
//   fills it is followed at once by a read into the io thread's shared 64 KiB buffer. A chunk that fits is
//   taken off the socket only after its requests were handled, so a client waiting for its reply is woken
//   once, by the reply (see reader()).
// - Backpressure (ConnectionLimits' output rule, the HTTP front's too): while the replies queued and not yet
//   written reach max_pending_output, the reader stops taking requests (the kernel's buffers then fill and
//   the client's writes block); it resumes when the client has read the queue down to half. A streamed
//   request whose next token line would take the queue past twice the bound is cancelled; its final reply
//   becomes error `output_overflow`.
// - A request line left incomplete for line_timeout is answered with `line_timeout` and the connection
//   closed. A connection without a partial line is never timed out.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "daemon/peer_credentials.h"
#include "daemon/request_handler.h"
#include "daemon/timer_clock.h"

namespace car::daemon {

class ConnectionManager;

class Session final : public Client, public std::enable_shared_from_this<Session> {
 public:
  Session(boost::asio::generic::stream_protocol::socket socket, RequestHandler& handler,
          ConnectionManager& manager, PeerCredentials peer, uint64_t number, std::size_t max_line_bytes,
          const TimerClock& timer_clock = steady_timer_clock());

  /// Spawn the reader and writer coroutines.
  void start();
  /// Stop reading; close the socket once in-flight requests reported and the queue is flushed.
  void close_when_idle();
  /// Close now (shutdown, write error).
  void close_now();

  // Client (the request handler's side):
  void reply(const nlohmann::json& id, const std::shared_ptr<Call>& call, Reply reply) override;
  /// Queues the token line; past twice the pending-output bound the request is cancelled instead (and its
  /// later events dropped).
  void token(const std::shared_ptr<Call>& call, const protocol::TokenEvent& event) override;
  CallRegistry& calls() override { return calls_; }
  uint64_t number() const override { return number_; }

  const PeerCredentials& peer() const { return peer_; }
  std::size_t in_flight() const { return calls_.size(); }
  /// Reply bytes queued and not yet written to the socket.
  std::size_t queued_bytes() const { return queued_bytes_; }

 private:
  /// Queue one line (the newline is added). Dropped when the connection is already broken.
  void send(std::string line);
  boost::asio::awaitable<void> reader();
  /// Take `bytes` already peeked off the socket (sets it to 0).
  void consume(std::size_t& bytes);
  boost::asio::awaitable<void> writer();
  void maybe_close();
  void account(std::ptrdiff_t delta);
  void update_line_timer(bool in_line);
  void line_timed_out();

  boost::asio::generic::stream_protocol::socket socket_;
  boost::asio::steady_timer write_signal_;  // expires at max; cancelled to wake the writer
  boost::asio::steady_timer
      drain_signal_;                      // expires at max; cancelled to wake a reader paused by backpressure
  Timer line_timer_;                      // armed while a request line is incomplete; then the forced close
  RequestHandler& handler_;
  ConnectionManager& manager_;
  const PeerCredentials peer_;
  const uint64_t number_;
  const std::size_t max_line_bytes_;
  // The connection's own read buffer: small, so an idle connection costs little, and big enough for a
  // typical request line. A chunk that fills it is followed at once by a read into the io thread's large
  // buffer, so a long line is not taken in small bites.
  std::array<char, 1024> read_small_;
  std::deque<std::string> queue_;  // lines waiting for the writer
  std::size_t queued_bytes_ = 0;   // bytes of queue_ plus the batch being written
  CallRegistry calls_;             // requests in flight
  bool reading_done_ = false;      // no more requests will be read (EOF, error, shutdown)
  bool closed_ = false;            // the socket is closed; sends are dropped
  bool paused_ = false;            // the reader waits for the queue to drain (backpressure)
  bool writing_ = false;           // the writer has a batch on the socket; send() must queue behind it
  bool line_timer_armed_ = false;
};

}  // namespace car::daemon
