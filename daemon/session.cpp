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

/// The io thread's read buffer, shared by every session on it: a reader fills it and frames its bytes with
/// no co_await in between, so an idle connection holds no buffer of its own.
std::array<char, 64 * 1024>& read_buffer() {
  thread_local auto buf = std::make_unique<std::array<char, 64 * 1024>>();  // allocated on the io thread only
  return *buf;
}
}  // namespace

Session::Session(asio::local::stream_protocol::socket socket, RequestHandler& handler,
                 ConnectionManager& manager, PeerCredentials peer, uint64_t number,
                 std::size_t max_line_bytes)
    : socket_(std::move(socket)),
      write_signal_(socket_.get_executor()),
      drain_signal_(socket_.get_executor()),
      line_timer_(socket_.get_executor()),
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
  const std::size_t bound = manager_.limits().max_pending_output();
  if (queued_bytes_ >= 2 * bound) {
    call->overflowed = true;
    call->cancelled.store(true);
    manager_.limits().count_output_overflow();
    spdlog::info("conn {}: {} bytes of replies unread (bound {}): cancelling streamed request id={}", number_,
                 queued_bytes_, bound, log_id(call->id));
    return;
  }
  send(protocol::token_line(call->id, event));
}

void Session::reply(const json& id, const std::shared_ptr<Call>& call, Reply reply) {
  if (call && call->overflowed) {
    send(protocol::error_line(
        id, protocol::code::kOutputOverflow,
        "cancelled: the client left more than " + std::to_string(2 * manager_.limits().max_pending_output()) +
            " bytes of replies unread on this connection (twice CAR_INFERENCE_MAX_PENDING_OUTPUT_MB); read "
            "replies as they arrive"));
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

awaitable<void> Session::reader() {
  protocol::LineFramer framer(max_line_bytes_);
  std::vector<protocol::LineFramer::Item> items;
  boost::system::error_code ec;
  while (!reading_done_) {
    auto [wait_ec] = co_await socket_.async_wait(asio::socket_base::wait_read, kTuple);
    if (wait_ec || reading_done_) {
      if (wait_ec && wait_ec != asio::error::operation_aborted) {
        spdlog::debug("conn {}: read error: {}", number_, wait_ec.message());
      }
      break;
    }
    auto& buf = read_buffer();
    std::size_t n = socket_.read_some(asio::buffer(buf), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec) {
      if (ec != asio::error::eof) spdlog::debug("conn {}: read error: {}", number_, ec.message());
      break;
    }
    items.clear();
    framer.feed(std::string_view(buf.data(), n), items);
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
      if (queued_bytes_ >= manager_.limits().max_pending_output()) {
        paused_ = true;
        update_line_timer(false);
        spdlog::debug("conn {}: {} bytes of replies unread: reading paused", number_, queued_bytes_);
        while (!closed_ && !reading_done_ && queued_bytes_ >= manager_.limits().max_pending_output() / 2) {
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
    if (paused_ && queued_bytes_ < manager_.limits().max_pending_output() / 2) drain_signal_.cancel();
    if (ec) {
      spdlog::debug("conn {}: write error: {} - cancelling its requests", number_, ec.message());
      break;
    }
  }
  close_now();
}

}  // namespace car::daemon
