#include "daemon/session.h"

#include <spdlog/spdlog.h>

#include <array>

#include "daemon/protocol.h"
#include "daemon/service.h"

namespace car::daemon {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using nlohmann::json;

namespace {
constexpr auto kTuple = asio::as_tuple(use_awaitable);
constexpr std::size_t kWriteBatchBytes = 64 * 1024;
}  // namespace

Session::Session(asio::local::stream_protocol::socket socket, Service& service, PeerCredentials peer,
                 uint64_t number, std::size_t max_line_bytes)
    : socket_(std::move(socket)),
      write_signal_(socket_.get_executor()),
      service_(service),
      peer_(peer),
      number_(number),
      max_line_bytes_(max_line_bytes) {
  write_signal_.expires_at(asio::steady_timer::time_point::max());
}

void Session::start() {
  auto self = shared_from_this();
  asio::co_spawn(socket_.get_executor(), [self]() { return self->reader(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self]() { return self->writer(); }, asio::detached);
}

void Session::send(std::string line) {
  if (closed_) return;
  line.push_back('\n');
  queue_.push_back(std::move(line));
  write_signal_.cancel_one();
}

std::shared_ptr<Pending> Session::begin(json id, std::string op, std::string model) {
  auto p = std::make_shared<Pending>();
  p->id = std::move(id);
  p->op = std::move(op);
  p->model = std::move(model);
  pending_.push_back(p);
  return p;
}

void Session::finish(const std::shared_ptr<Pending>& pending, std::string final_line) {
  pending_.remove(pending);
  send(std::move(final_line));
  maybe_close();
}

std::size_t Session::cancel(const json& target) {
  std::size_t n = 0;
  for (auto& p : pending_) {
    if (!p->id.is_null() && p->id == target && !p->cancelled.exchange(true)) ++n;
  }
  return n;
}

void Session::cancel_all() {
  for (auto& p : pending_) p->cancelled.store(true);
}

void Session::close_when_idle() {
  reading_done_ = true;
  maybe_close();
}

void Session::close_now() {
  if (closed_) return;
  closed_ = true;
  reading_done_ = true;
  cancel_all();
  queue_.clear();
  boost::system::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_both, ec);
  socket_.close(ec);
  write_signal_.cancel();
  service_.session_closed(shared_from_this());
}

void Session::maybe_close() {
  // The writer closes the socket once the queue drains; wake it so it re-checks.
  if (reading_done_ && pending_.empty()) write_signal_.cancel_one();
}

awaitable<void> Session::reader() {
  protocol::LineFramer framer(max_line_bytes_);
  std::vector<protocol::LineFramer::Item> items;
  std::array<char, 64 * 1024> buf{};
  while (!reading_done_) {
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf), kTuple);
    if (ec || reading_done_) {
      if (ec && ec != asio::error::eof && ec != asio::error::operation_aborted) {
        spdlog::debug("conn {}: read error: {}", number_, ec.message());
      }
      break;
    }
    items.clear();
    framer.feed(std::string_view(buf.data(), n), items);
    for (auto& item : items) {
      if (closed_) co_return;
      if (item.kind == protocol::LineFramer::Item::Kind::kOversized) {
        spdlog::info("conn {}: request line over {} bytes rejected", number_, max_line_bytes_);
        send(protocol::error_line(nullptr, protocol::code::kBadRequest,
                                  "request line longer than " + std::to_string(max_line_bytes_) +
                                      " bytes; skipped to the next newline"));
        continue;
      }
      std::string_view line = item.line;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line
      service_.handle_line(shared_from_this(), line);
    }
  }
  if (closed_) co_return;
  // The client is gone (or half-closed): nothing more will be asked, and nobody may be reading the
  // answers of what is in flight - cancel it; the writer closes once the cancelled requests reported.
  if (!pending_.empty()) {
    spdlog::debug("conn {}: end of input with {} request(s) in flight: cancelling them", number_, pending_.size());
  }
  reading_done_ = true;
  cancel_all();
  maybe_close();
}

awaitable<void> Session::writer() {
  std::string batch;
  while (!closed_) {
    if (queue_.empty()) {
      if (reading_done_ && pending_.empty()) break;
      co_await write_signal_.async_wait(kTuple);
      continue;
    }
    batch.clear();
    while (!queue_.empty() && batch.size() < kWriteBatchBytes) {
      batch += queue_.front();
      queue_.pop_front();
    }
    auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(batch), kTuple);
    if (ec) {
      spdlog::debug("conn {}: write error: {} - cancelling its requests", number_, ec.message());
      break;
    }
  }
  close_now();
}

}  // namespace car::daemon
