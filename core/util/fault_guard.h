// fault_guard: turns SIGBUS from reading a file mapping whose file shrank into a per-mapping flag instead of
// the death of the process.
//
// Why. Reading a page of a MAP_SHARED or MAP_PRIVATE file mapping that lies past the file's current end
// raises SIGBUS (BUS_ADRERR). A model file truncated or rewritten in place (`cp new.gguf m.gguf` truncates
// first) while the daemon has it mapped would kill the daemon and every client with it.
//
// How. A mapping registers its range [begin, begin + size) in a fixed-size, lock-free table (Region). The
// process-wide SA_SIGINFO handler that install() sets looks the fault address up in the table; when a
// registered range holds it, the handler maps anonymous zero pages (MAP_FIXED, read-only) over the range
// from the faulting page to the range's end, sets the range's `faulted` flag and returns, so the faulting
// load completes and reads zeros. Whoever computed from the mapping checks faulted() afterwards and
// discards the result (the engine answers io_error). The zero pages stay until the mapping is unmapped, so a
// flagged mapping must be dropped, not reused. A SIGBUS at any other address (or one sent by kill) goes to
// the handler that was installed before ours (a sanitizer's, for instance) or, when that was the default,
// the default action is restored and the fault recurs: real bugs still crash.
//
// Global state. Signal dispositions are process-wide, so this is the one piece of core/ besides the kernel
// ISA choice that holds global state: the table, and the handler the program that owns main() installs
// (daemon/main.cpp, tools/main.cpp, tests that need it). Libraries never install it themselves. Without
// install(), registered regions behave as before (a fault kills).
//
// Thread safety. install() may be called from any thread, any number of times (the first call wins).
// Region registration and release are lock-free and may run on any thread while the handler runs on any
// other; the handler itself only uses atomics and the mmap system call (async-signal-safe: no allocation,
// no locks). A Region must be released (destroyed) before its memory is unmapped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/util/result.h"

namespace car::fault_guard {

/// Ranges that can be registered at once. Past it, Region::add returns an unregistered Region (the
/// mapping is then unguarded, as it would be without the guard).
inline constexpr std::size_t kMaxRegions = 1024;

/// Install the SIGBUS handler. Idempotent. Error io_error when sigaction fails.
Result<void> install();
/// Whether install() has succeeded in this process.
bool installed();
/// Faults the handler has absorbed since start (every process-wide; for tests and diagnostics).
uint64_t faults_handled();

/// One registered range. Move-only; destroying it (or reset()) unregisters the range.
class Region {
 public:
  Region() = default;
  /// Register [begin, begin + size). `begin` must be page-aligned (mmap's result is). An empty Region
  /// (registered() false) when size is 0 or the table is full.
  static Region add(const void* begin, std::size_t size);

  Region(Region&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  Region& operator=(Region&& other) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() { reset(); }

  void reset();
  bool registered() const { return slot_ >= 0; }
  /// Whether a read in the range faulted since it was registered (its pages from there on read as zero).
  bool faulted() const;

 private:
  explicit Region(int slot) : slot_(slot) {}
  int slot_ = -1;
};

}  // namespace car::fault_guard
