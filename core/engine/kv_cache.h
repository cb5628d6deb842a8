// KvCache: the keys and values of one sequence, per layer and KV head, stored as fp16 (as llama.cpp's default
// F16 cache does - the rounding is part of the numerics the conformance goldens reflect).
//
// Layout, per layer: K is [n_head_kv][n_ctx][head_dim_k] and V is [n_head_kv][n_ctx][head_dim_v], so one
// head's keys for positions 0..n-1 are contiguous for the attention loop. `n_past()` positions are valid;
// the forward pass writes positions [n_past, n_past + n) and then advances.
//
// Memory proportional to use: the arrays live in one anonymous private mapping (KvMapping) that is never
// filled by us - a page the kernel has not given yet reads as zero - so a sequence of L positions holds only
// the pages of the first L rows of each (layer, head, K/V) region, not the whole context. shrink() gives back
// (MADV_DONTNEED) the whole pages of each region past a kept prefix; they read as zero again if touched.
// resident_bytes() is what the rows written since then hold, page by page, without asking the kernel;
// KvMapping::resident_bytes() asks it (mincore) and is equal while nothing is swapped out.
//
// Sliding-window layers (window(layer) > 0): a query at position p sees only the keys at positions p' with
// p - p' < window (llama.cpp's LLAMA_SWA_TYPE_STANDARD mask), so it attends [first_visible(layer, p), p].
// Every position is still stored (a prefix stays reusable whatever the window); only what is read changes.
//
// Thread safety: none; one sequence is evaluated by one caller at a time (the forward pass may write
// different heads from different threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/util/result.h"

namespace car::engine {

/// An anonymous private mapping (read/write, no swap reservation, no transparent huge pages, so memory
/// follows the 4 KiB pages written). Move-only; unmapped when destroyed.
class KvMapping {
 public:
  /// Map `bytes` (rounded up to whole pages). Errors: internal (mmap refused: address space, overcommit
  /// policy; the message names the size and the reason).
  static Result<KvMapping> map(size_t bytes);
  KvMapping() = default;
  ~KvMapping();
  KvMapping(KvMapping&& o) noexcept;
  KvMapping& operator=(KvMapping&& o) noexcept;
  KvMapping(const KvMapping&) = delete;
  KvMapping& operator=(const KvMapping&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  /// Give back the whole pages inside [begin, end) (byte offsets); they read as zero afterwards.
  void release(size_t begin, size_t end);
  /// Make the pages of [begin, end) (page-aligned) resident and writable in one system call
  /// (MADV_POPULATE_WRITE) rather than one fault per page at first write. False where the kernel has no such
  /// call (before Linux 5.14): the pages then come at first write, as without it.
  bool populate(size_t begin, size_t end);
  /// Bytes of the mapping's pages resident now, as the kernel reports them (mincore).
  uint64_t resident_bytes() const;
  static size_t page_size();

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class KvCache {
 public:
  /// `windows`: one sliding-window size per layer (0 = global attention), or empty = every layer global.
  /// Errors: internal when the mapping cannot be made.
  static Result<KvCache> create(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k,
                                int64_t head_dim_v, std::vector<int64_t> windows = {});
  /// As create(); throws std::bad_alloc when the mapping cannot be made (as an allocation would).
  KvCache(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
          std::vector<int64_t> windows = {});
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

  int64_t n_layer() const { return n_layer_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }
  /// Forget positions >= n (keep a prefix for reuse); n <= n_past(). Keeps their pages (see shrink).
  void truncate(int64_t n);
  void clear() { n_past_ = 0; }
  /// Mark n more positions as written.
  void advance(int64_t n);
  /// Rows up to `end` may have been written (a writer that stopped before advance(), a failed step), so
  /// that the next shrink() gives their pages back too.
  void touch(int64_t end);
  /// Rows up to `end` are about to be written: the pages that hold them in every region are made resident
  /// now, one system call per region (KvMapping::populate), and touch(end). A step writes one row per
  /// region and layer for each token, so its first write to each new page would otherwise fault on its own:
  /// ~10-15 us a fault in the paravirtualized guests CI and benchmarks run on against ~1-2 us a page
  /// populated (docs/performance.md). The same pages become resident either way.
  void prepare(int64_t end);
  /// truncate(keep), then give back the whole pages of every region past row `retain` (clamped to
  /// [keep, n_ctx]) among the rows written since the last shrink (none to give: no system call); rows
  /// [keep, retain) keep their pages - and stale values, never read before they are written again - for a
  /// writer that is about to fill them. retain == 0 gives back the whole mapping.
  void shrink(int64_t keep, int64_t retain);
  void shrink(int64_t keep) { shrink(keep, keep); }
  /// Rows written since the last shrink (or creation): the pages holding them are resident.
  int64_t touched() const { return touched_; }
  /// Bytes of the pages that hold the first `rows` rows of every region (the union, so a page two regions
  /// share counts once): resident_bytes(touched()) is what the cache holds now.
  uint64_t resident_bytes(int64_t rows) const;
  uint64_t resident_bytes() const { return resident_bytes(touched_); }
  const KvMapping& mapping() const { return map_; }

  /// The sliding window of `layer` (0 = global).
  int64_t window(int64_t layer) const { return windows_.empty() ? 0 : windows_[static_cast<size_t>(layer)]; }
  /// The first position a query at `pos` attends in `layer`: max(0, pos - window + 1), or 0 when global.
  int64_t first_visible(int64_t layer, int64_t pos) const {
    const int64_t w = window(layer);
    return w > 0 && pos >= w ? pos - w + 1 : 0;
  }

  /// Keys of (layer, kv head): n_ctx rows of head_dim_k.
  uint16_t* k(int64_t layer, int64_t head) { return base() + offset_k(layer, head); }
  const uint16_t* k(int64_t layer, int64_t head) const { return base() + offset_k(layer, head); }
  uint16_t* v(int64_t layer, int64_t head) { return base() + offset_v(layer, head); }
  const uint16_t* v(int64_t layer, int64_t head) const { return base() + offset_v(layer, head); }

  /// Bytes of the arrays at a full context (the mapping's size before page rounding).
  uint64_t size_bytes() const { return static_cast<uint64_t>(k_elems() + v_elems()) * sizeof(uint16_t); }

 private:
  KvCache(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
          std::vector<int64_t> windows, KvMapping map);
  uint16_t* base() const { return reinterpret_cast<uint16_t*>(map_.data()); }
  size_t k_elems() const { return static_cast<size_t>(n_layer_ * n_head_kv_ * n_ctx_ * dk_); }
  size_t v_elems() const { return static_cast<size_t>(n_layer_ * n_head_kv_ * n_ctx_ * dv_); }
  size_t offset_k(int64_t layer, int64_t head) const {
    return static_cast<size_t>((layer * n_head_kv_ + head) * n_ctx_ * dk_);
  }
  size_t offset_v(int64_t layer, int64_t head) const {
    return k_elems() + static_cast<size_t>((layer * n_head_kv_ + head) * n_ctx_ * dv_);
  }
  /// fn(start, row) for each (layer, head) region in address order, K's then V's: the region's first byte in
  /// the mapping and the bytes of one of its rows.
  template <class Fn>
  void for_each_region(Fn&& fn) const {
    const size_t regions = static_cast<size_t>(n_layer_ * n_head_kv_);
    for (int kind = 0; kind < 2; ++kind) {
      const size_t row = static_cast<size_t>(kind == 0 ? dk_ : dv_) * sizeof(uint16_t);
      const size_t first = kind == 0 ? 0 : k_elems() * sizeof(uint16_t);
      for (size_t r = 0; r < regions; ++r) fn(first + r * static_cast<size_t>(n_ctx_) * row, row);
    }
  }

  int64_t n_layer_, n_ctx_, n_head_kv_, dk_, dv_;
  int64_t n_past_ = 0;
  int64_t touched_ = 0;  // rows [0, touched_) of some region may have been written since the last shrink
  int64_t prepared_ = 0;          // prepare(): every region's pages hold rows [0, prepared_) (until a shrink)
  std::vector<int64_t> windows_;  // n_layer entries, or empty (all global)
  KvMapping map_;  // K [n_layer][n_head_kv][n_ctx][dk], then V [n_layer][n_head_kv][n_ctx][dv]
};

}  // namespace car::engine
