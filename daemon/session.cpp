#include "daemon/session.h"

#include <spdlog/spdlog.h>

#include <array>
#include <memory>

#include "daemon/connection_manager.h"
#include "daemon/protocol.h"
#include "daemon/safe_text.h"

namespace car::daemon {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {
constexpr auto kTuple = asio::as_tuple(use_awaitable);
constexpr std::size_t kWriteBatchBytes = 64 * 1024;
/// After a line timeout, how long the error line may take to reach a client that does not read.
constexpr auto kTimeoutCloseDelay = 2s;

/// The io thread's large read buffer, shared by every session on it: a reader fills it and frames its bytes
/// with no co_await in between, so no connection holds a buffer this size.
std::array<char, 64 * 1024>& read_buffer() {
  thread_local auto buf = std::make_unique<std::array<char, 64 * 1024>>();  // allocated on the io thread only
  return *buf;
}
}  // namespace

Session::Session(asio::generic::stream_protocol::socket socket, RequestHandler& handler,
                 ConnectionManager& manager, PeerCredentials peer, uint64_t number,
                 std::size_t max_line_bytes, const TimerClock& timer_clock)
    : socket_(std::move(socket)),
      write_signal_(socket_.get_executor()),
      drain_signal_(socket_.get_executor()),
      line_timer_(socket_.get_executor(), timer_clock),
      handler_(handler),
      manager_(manager),
      peer_(peer),
      number_(number),
      max_line_bytes_(max_line_bytes) {
  write_signal_.expires_at(asio::steady_timer::time_point::max());
  drain_signal_.expires_at(asio::steady_timer::time_point::max());
}

void Session::start() {
  // Reads (after a wait for readability) and send()'s immediate writes must never block the io thread.
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  auto self = shared_from_this();
  asio::co_spawn(socket_.get_executor(), [self]() { return self->reader(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self]() { return self->writer(); }, asio::detached);
}

void Session::account(std::ptrdiff_t delta) {
  queued_bytes_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(queued_bytes_) + delta);
  manager_.limits().add_queued(delta);
}

void Session::send(std::string line) {
  if (closed_) return;
  line.push_back('\n');
  if (queue_.empty() && !writing_) {
    // Nothing is waiting or being written, so the line can go out now, in order, without waking the
    // writer; the socket is non-blocking, and what it does not take is queued for the writer. An error
    // (the peer gone) is left to the writer, whose write of the queued line fails the same way and closes.
    boost::system::error_code ec;
    const std::size_t n = socket_.write_some(asio::buffer(line), ec);
    if (!ec && n == line.size()) return;
    if (!ec) line.erase(0, n);
  }
  account(static_cast<std::ptrdiff_t>(line.size()));
  queue_.push_back(std::move(line));
  write_signal_.cancel_one();
}

void Session::token(const std::shared_ptr<Call>& call, const protocol::TokenEvent& event) {
  if (closed_ || call->overflowed) return;
  std::string line = protocol::token_line(call->id, event);
  auto& limits = manager_.limits();
  if (limits.overflows(queued_bytes_, line.size() + 1)) {
    call->overflowed = true;
    call->cancelled.store(true);
    limits.count_output_overflow();
    spdlog::info("conn {}: {} bytes of replies unread (bound {}): cancelling streamed request id={}", number_,
                 queued_bytes_, limits.overflow_bound(), log_id(call->id));
    return;
  }
  send(std::move(line));
}

void Session::reply(const json& id, const std::shared_ptr<Call>& call, Reply reply) {
  if (call && call->overflowed) {
    send(protocol::error_line(
        id, protocol::code::kOutputOverflow,
        "cancelled: the client left more than " + std::to_string(manager_.limits().overflow_bound()) +
            " bytes of replies unread on this connection (twice CAR_INFERENCE_MAX_PENDING_OUTPUT_MB); read "
            "replies as they arrive"));
  } else if (reply.ok && reply.infer) {
    send(protocol::infer_line(id, *reply.infer));
  } else if (reply.ok) {
    send(protocol::ok_line(id, reply.result));
  } else {
    send(protocol::error_line(id, reply.code, reply.message));
  }
  if (call) maybe_close();
}

void Session::close_when_idle() {
  reading_done_ = true;
  drain_signal_.cancel();
  maybe_close();
}

void Session::close_now() {
  if (closed_) return;
  closed_ = true;
  reading_done_ = true;
  calls_.cancel_all();
  queue_.clear();
  account(-static_cast<std::ptrdiff_t>(queued_bytes_));
  boost::system::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_both, ec);
  socket_.close(ec);
  write_signal_.cancel();
  drain_signal_.cancel();
  line_timer_.cancel();
  manager_.closed(shared_from_this());
}

void Session::maybe_close() {
  // The writer closes the socket once the queue drains; wake it so it re-checks.
  if (reading_done_ && calls_.empty()) write_signal_.cancel_one();
}

void Session::update_line_timer(bool in_line) {
  const auto timeout = manager_.limits().line_timeout();
  if (!in_line || timeout.count() <= 0 || reading_done_) {
    if (line_timer_armed_) line_timer_.cancel();
    line_timer_armed_ = false;
    return;
  }
  if (line_timer_armed_) return;  // counted from the line's first byte, not its latest
  line_timer_armed_ = true;
  line_timer_.expires_after(timeout);
  line_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || !self->line_timer_armed_) return;
    self->line_timed_out();
  });
}

void Session::line_timed_out() {
  line_timer_armed_ = false;
  if (closed_ || reading_done_) return;
  const auto timeout = manager_.limits().line_timeout();
  manager_.limits().count_line_timeout();
  spdlog::info("conn {}: request line incomplete after {} s: closing the connection", number_,
               timeout.count());
  send(protocol::error_line(nullptr, protocol::code::kLineTimeout,
                            "request line incomplete after " + std::to_string(timeout.count()) +
                                " s (CAR_INFERENCE_LINE_TIMEOUT_SECS); closing the connection"));
  // Like a disconnect: nothing more is read, what is in flight is cancelled, the writer closes once the
  // error line is out - or the timer below does, when the client does not read it either.
  reading_done_ = true;
  calls_.cancel_all();
  boost::system::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_receive, ec);  // wakes the reader's wait
  maybe_close();
  line_timer_.expires_after(kTimeoutCloseDelay);
  line_timer_.async_wait([self = shared_from_this()](boost::system::error_code wait_ec) {
    if (!wait_ec) self->close_now();
  });
}

void Session::consume(std::size_t& bytes) {
  // Peeked bytes are on the socket for this reader alone, so they are there to take; a failure (the peer
  // gone) shows again at the next read, which ends the reader. They were peeked into read_small_ and framed
  // (the framer copied them), so they go back into it: at most its size.
  while (bytes > 0) {
    boost::system::error_code ec;
    const std::size_t n = socket_.receive(asio::buffer(read_small_.data(), bytes), 0, ec);
    if (ec || n == 0) break;
    bytes -= n;
  }
  bytes = 0;
}

awaitable<void> Session::reader() {
  protocol::LineFramer framer(max_line_bytes_);
  std::vector<protocol::LineFramer::Item> items;
  boost::system::error_code ec;
  while (!reading_done_) {
    // The request bytes are peeked, answered, and only then taken off the socket. Taking bytes off a Unix
    // socket frees the sender's buffer space, and Linux then wakes every thread sleeping on the sender's
    // socket - including a client blocked reading for its reply, which wakes for nothing and sleeps
    // again. Consuming after the reply went out turns that spurious wake-up (a context switch for the
    // client and a cross-CPU wake for the io thread, per request) into a wake-up with the reply: a
    // second recv call is cheaper. (An asynchronous read, not a wait for readability: Asio re-arms a
    // wait with an epoll_ctl call every time, while a pending read costs nothing until data arrives.)
    auto [read_ec, n] =
        co_await socket_.async_receive(asio::buffer(read_small_), asio::socket_base::message_peek, kTuple);
    if (read_ec || reading_done_) {
      if (read_ec && read_ec != asio::error::operation_aborted && read_ec != asio::error::eof) {
        spdlog::debug("conn {}: read error: {}", number_, read_ec.message());
      }
      break;
    }
    items.clear();
    framer.feed(std::string_view(read_small_.data(), n), items);
    std::size_t unconsumed = n;  // peeked bytes framed and still on the socket
    if (n == read_small_.size()) {
      // A long line or a burst: take the chunk now and read what else is waiting into the large buffer.
      // Whatever that read finds besides data (nothing, an error, end of input) the next read finds again.
      consume(unconsumed);
      auto& buf = read_buffer();
      const std::size_t more = socket_.read_some(asio::buffer(buf), ec);
      if (!ec) framer.feed(std::string_view(buf.data(), more), items);
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto& item = items[i];
      if (closed_ || reading_done_) co_return;
      if (i > 0) {
        // Let the replies, tokens and other connections that became ready run before the next request of
        // this chunk, so a batch of requests sees the backpressure its own answers build up. (After the
        // chunk's last request the wait for more input yields anyway.)
        co_await asio::post(socket_.get_executor(), use_awaitable);
        if (closed_ || reading_done_) co_return;
      }
      // Backpressure: take no new request while the client leaves this much of our output unread.
      if (manager_.limits().pause_reading(queued_bytes_)) {
        paused_ = true;
        update_line_timer(false);
        spdlog::debug("conn {}: {} bytes of replies unread: reading paused", number_, queued_bytes_);
        while (!closed_ && !reading_done_ && !manager_.limits().resume_reading(queued_bytes_)) {
          co_await drain_signal_.async_wait(kTuple);
          drain_signal_.expires_at(asio::steady_timer::time_point::max());
        }
        paused_ = false;
        if (closed_ || reading_done_) co_return;
      }
      if (item.kind == protocol::LineFramer::Item::Kind::kOversized) {
        spdlog::info("conn {}: request line over {} bytes rejected", number_, max_line_bytes_);
        send(protocol::error_line(nullptr, protocol::code::kBadRequest,
                                  "request line longer than " + std::to_string(max_line_bytes_) +
                                      " bytes; skipped to the next newline"));
        continue;
      }
      std::string_view line = item.line;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line
      const auto received = std::chrono::steady_clock::now();
      json id;
      auto request = protocol::parse_request(line, &id);
      if (request) {
        handler_.handle(shared_from_this(), std::move(*request), received);
      } else {
        handler_.reject(shared_from_this(), id, request.error(), received);
      }
    }
    consume(unconsumed);
    items = {};  // an idle connection keeps no item storage either
    update_line_timer(framer.in_line());
  }
  update_line_timer(false);
  if (closed_) co_return;
  // The client is gone (or half-closed): nothing more will be asked, and nobody may be reading the
  // answers of what is in flight - cancel it; the writer closes once the cancelled requests reported.
  if (!calls_.empty()) {
    spdlog::debug("conn {}: end of input with {} request(s) in flight: cancelling them", number_,
                  calls_.size());
  }
  reading_done_ = true;
  calls_.cancel_all();
  maybe_close();
}

awaitable<void> Session::writer() {
  std::string batch;
  while (!closed_) {
    if (queue_.empty()) {
      batch = std::string();  // give a large batch's memory back while idle
      if (reading_done_ && calls_.empty()) break;
      co_await write_signal_.async_wait(kTuple);
      continue;
    }
    batch.clear();
    while (!queue_.empty() && batch.size() < kWriteBatchBytes) {
      batch += queue_.front();
      queue_.pop_front();
    }
    writing_ = true;
    auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(batch), kTuple);
    writing_ = false;
    if (closed_) break;
    account(-static_cast<std::ptrdiff_t>(batch.size()));
    if (paused_ && manager_.limits().resume_reading(queued_bytes_)) drain_signal_.cancel();
    if (ec) {
      spdlog::debug("conn {}: write error: {} - cancelling its requests", number_, ec.message());
      break;
    }
  }
  close_now();
}

}  // namespace car::daemon
