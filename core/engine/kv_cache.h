// KvCache: the keys and values of one sequence, per layer and KV head, stored as fp16 (as llama.cpp's default
// F16 cache does - the rounding is part of the numerics the conformance goldens reflect).
//
// Layout, per layer: K is [n_head_kv][n_ctx][head_dim_k] and V is [n_head_kv][n_ctx][head_dim_v], so one
// head's keys for positions 0..n-1 are contiguous for the attention loop. `n_past()` positions are valid;
// the forward pass writes positions [n_past, n_past + n) and then advances. Owns its memory (allocated once).
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

namespace car::engine {

class KvCache {
 public:
  /// `windows`: one sliding-window size per layer (0 = global attention), or empty = every layer global.
  KvCache(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
          std::vector<int64_t> windows = {});

  int64_t n_layer() const { return n_layer_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }
  /// Forget positions >= n (keep a prefix for reuse); n <= n_past().
  void truncate(int64_t n);
  void clear() { n_past_ = 0; }
  /// Mark n more positions as written.
  void advance(int64_t n);

  /// The sliding window of `layer` (0 = global).
  int64_t window(int64_t layer) const { return windows_.empty() ? 0 : windows_[static_cast<size_t>(layer)]; }
  /// The first position a query at `pos` attends in `layer`: max(0, pos - window + 1), or 0 when global.
  int64_t first_visible(int64_t layer, int64_t pos) const {
    const int64_t w = window(layer);
    return w > 0 && pos >= w ? pos - w + 1 : 0;
  }

  /// Keys of (layer, kv head): n_ctx rows of head_dim_k.
  uint16_t* k(int64_t layer, int64_t head) { return k_.data() + offset_k(layer, head); }
  const uint16_t* k(int64_t layer, int64_t head) const { return k_.data() + offset_k(layer, head); }
  uint16_t* v(int64_t layer, int64_t head) { return v_.data() + offset_v(layer, head); }
  const uint16_t* v(int64_t layer, int64_t head) const { return v_.data() + offset_v(layer, head); }

  uint64_t size_bytes() const { return (k_.size() + v_.size()) * sizeof(uint16_t); }

 private:
  size_t offset_k(int64_t layer, int64_t head) const {
    return static_cast<size_t>((layer * n_head_kv_ + head) * n_ctx_ * dk_);
  }
  size_t offset_v(int64_t layer, int64_t head) const {
    return static_cast<size_t>((layer * n_head_kv_ + head) * n_ctx_ * dv_);
  }

  int64_t n_layer_, n_ctx_, n_head_kv_, dk_, dv_;
  int64_t n_past_ = 0;
  std::vector<int64_t> windows_;  // n_layer entries, or empty (all global)
  std::vector<uint16_t> k_;  // [n_layer][n_head_kv][n_ctx][dk]
  std::vector<uint16_t> v_;  // [n_layer][n_head_kv][n_ctx][dv]
};

}  // namespace car::engine
