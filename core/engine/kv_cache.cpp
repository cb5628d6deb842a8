#include "core/engine/kv_cache.h"

#include <utility>

#include "core/util/result.h"

namespace car::engine {

KvCache::KvCache(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
                 std::vector<int64_t> windows)
    : n_layer_(n_layer), n_ctx_(n_ctx), n_head_kv_(n_head_kv), dk_(head_dim_k), dv_(head_dim_v),
      windows_(std::move(windows)) {
  CAR_CHECK(n_layer > 0 && n_ctx > 0 && n_head_kv > 0 && head_dim_k > 0 && head_dim_v > 0);
  CAR_CHECK(windows_.empty() || static_cast<int64_t>(windows_.size()) == n_layer);
  for (int64_t w : windows_) CAR_CHECK(w >= 0);
  k_.assign(static_cast<size_t>(n_layer * n_head_kv * n_ctx * head_dim_k), 0);
  v_.assign(static_cast<size_t>(n_layer * n_head_kv * n_ctx * head_dim_v), 0);
}

void KvCache::truncate(int64_t n) {
  CAR_CHECK(n >= 0 && n <= n_past_);
  n_past_ = n;
}

void KvCache::advance(int64_t n) {
  CAR_CHECK(n >= 0 && n_past_ + n <= n_ctx_);
  n_past_ += n;
}

}  // namespace car::engine
