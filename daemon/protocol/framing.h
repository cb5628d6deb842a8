// Framing: newline-delimited lines of at most kMaxLineBytes. LineFramer cuts a byte stream into lines and
// reports over-long lines without losing the framing. A LineFramer is owned by one reader (no locking).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace car::protocol {

/// Longest request line the server accepts (the newline excluded).
inline constexpr std::size_t kMaxLineBytes = 1u << 20;

/// Cuts a byte stream into lines of at most `max_line` bytes. Lines longer than that are not buffered:
/// the framer reports one Oversized item for them and discards bytes up to the next newline, so a client
/// that sends a huge line keeps its connection. A trailing '\r' is kept (JSON parsing tolerates it).
class LineFramer {
 public:
  explicit LineFramer(std::size_t max_line = kMaxLineBytes) : max_line_(max_line) {}

  struct Item {
    enum class Kind { kLine, kOversized } kind;
    std::string line;  ///< the line without '\n' (empty for kOversized)
  };

  /// Feed bytes; complete items are appended to `out` in order.
  void feed(std::string_view bytes, std::vector<Item>& out);
  /// Bytes of the current unfinished line held (0 while discarding).
  std::size_t buffered() const { return partial_.size(); }
  /// Is a line started and not yet ended (bytes held, or an over-long line being discarded)?
  bool in_line() const { return !partial_.empty() || discarding_; }

 private:
  std::size_t max_line_;
  std::string partial_;      // bytes of the current line so far; never more than max_line_
  bool discarding_ = false;  // the current line passed max_line_: drop bytes until '\n'
};

}  // namespace car::protocol
