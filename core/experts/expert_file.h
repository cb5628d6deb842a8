// ExpertFile: how a streamed source (core/experts/streamed_source.h) reads expert matrices from its model
// file, apart from which experts it caches. GGUF aligns tensor data to 32 bytes only, so with O_DIRECT each
// matrix is read as the 4096-aligned window around it into page-aligned slot memory, and the matrix starts
// `window_lead(offset)` bytes into its window. When O_DIRECT is refused - at open, or by a read failing with
// EINVAL - the file falls back to buffered reads of exactly the matrix, at the same place in the window (so
// the views are the same either way), each followed by posix_fadvise(DONTNEED) so the page cache stays
// bounded. A read is retried on EINTR; a failed or short read is an io_error saying what was missing.
//
// Ownership and threads: owns its descriptors (move-only). read() may run on many reader threads at once:
// the descriptors are fixed at open and the O_DIRECT switch is an atomic that only ever turns off.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/experts/expert_pool.h"
#include "core/util/result.h"

namespace car::experts {

/// O_DIRECT's alignment of offsets, lengths and buffers (covers 512-byte devices).
inline constexpr uint64_t kDirectAlign = 4096;

/// Bytes a slot reserves for a matrix of `bytes`: rounded up to the alignment, plus one block for any
/// start.
uint64_t window_bytes(uint64_t bytes);
/// Where a matrix at file offset `offset` starts inside its window.
inline uint64_t window_lead(uint64_t offset) {
  return offset % kDirectAlign;
}

/// Anonymous page-aligned memory for one slot (RAII, move-only). mmap'd so memory given back on eviction
/// returns to the system rather than to a fragmented heap.
class SlotMemory {
 public:
  SlotMemory() = default;
  /// Errors: io_error naming the size.
  static Result<SlotMemory> allocate(size_t bytes);
  SlotMemory(SlotMemory&& o) noexcept { *this = std::move(o); }
  SlotMemory& operator=(SlotMemory&& o) noexcept;
  SlotMemory(const SlotMemory&) = delete;
  SlotMemory& operator=(const SlotMemory&) = delete;
  ~SlotMemory() { reset(); }

  uint8_t* data() const { return data_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void reset();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class ExpertFile {
 public:
  /// Told once, on the reader thread, that O_DIRECT reads were refused and reads are buffered from now on.
  using FallbackFn = std::function<void(const std::string& why)>;

  ExpertFile() = default;
  ExpertFile(ExpertFile&& o) noexcept;
  ExpertFile& operator=(ExpertFile&& o) noexcept;
  ExpertFile(const ExpertFile&) = delete;
  ExpertFile& operator=(const ExpertFile&) = delete;
  ~ExpertFile();

  /// Open `path` for reading, and with `direct_io` a second descriptor with O_DIRECT; a filesystem that
  /// refuses O_DIRECT is not an error: `direct_refused` receives why, and reads are buffered. `reader`
  /// replaces pread(2) (tests inject faults; null: pread). Errors: io_error (open or fstat failed).
  static Result<ExpertFile> open(const std::string& path, bool direct_io, PreadFn reader,
                                 std::string* direct_refused);

  /// Read the `bytes` at file `offset` into `window` (window_bytes(bytes) of page-aligned memory) so they
  /// start at window + window_lead(offset). Adds the bytes read to `nread`. `on_fallback`: see FallbackFn.
  /// Errors: io_error whose message says what failed ("pread of N bytes at offset O failed: ...", "the file
  /// ends N bytes short of ..."), for the caller to prefix with the matrix's name.
  Result<void> read(uint64_t offset, uint64_t bytes, uint8_t* window, uint64_t& nread,
                    const FallbackFn& on_fallback) const;

  uint64_t size() const { return size_; }
  /// True while reads use O_DIRECT.
  bool direct() const { return direct_->load(std::memory_order_acquire); }

 private:
  ssize_t pread(int fd, void* buf, size_t count, off_t offset) const;
  void close();

  int fd_buffered_ = -1;
  int fd_direct_ = -1;  // -1: O_DIRECT off or refused at open
  uint64_t size_ = 0;
  // Heap-held so the file stays movable; turned off once, by the first read O_DIRECT refuses.
  std::unique_ptr<std::atomic<bool>> direct_ = std::make_unique<std::atomic<bool>>(false);
  PreadFn reader_;
};

}  // namespace car::experts
