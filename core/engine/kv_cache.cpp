#include "core/engine/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "core/util/error_codes.h"

namespace car::engine {

namespace {
size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }
size_t round_down(size_t x, size_t to) { return x / to * to; }
}  // namespace

size_t KvMapping::page_size() {
  static const size_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

Result<KvMapping> KvMapping::map(size_t bytes) {
  const size_t size = round_up(std::max<size_t>(bytes, 1), page_size());
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return make_error(errc::kInternal, "KV cache: cannot map " + std::to_string(size) +
                                           " bytes: " + std::strerror(err));
  }
  // A huge page would make a few written rows hold 2 MiB; where the kernel has no THP this fails harmlessly.
  (void)::madvise(p, size, MADV_NOHUGEPAGE);
  KvMapping m;
  m.data_ = static_cast<std::byte*>(p);
  m.size_ = size;
  return m;
}

KvMapping::~KvMapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

KvMapping::KvMapping(KvMapping&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

KvMapping& KvMapping::operator=(KvMapping&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void KvMapping::release(size_t begin, size_t end) {
  const size_t page = page_size();
  begin = round_up(begin, page);
  end = std::min(round_down(end, page), size_);
  if (begin >= end) return;
  // Cannot fail on a range of our own private anonymous mapping; if it did, the pages simply stay.
  (void)::madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

bool KvMapping::populate(size_t begin, size_t end) {
#ifdef MADV_POPULATE_WRITE
  end = std::min(end, size_);
  if (begin >= end) return true;
  // EINVAL: the kernel has no MADV_POPULATE_WRITE. Anything else (ENOMEM, EINTR) leaves the rest of the
  // range to fault in at first write, as it would have.
  return ::madvise(data_ + begin, end - begin, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
#else
  (void)begin;
  (void)end;
  return false;
#endif
}

uint64_t KvMapping::resident_bytes() const {
  if (data_ == nullptr) return 0;
  const size_t page = page_size();
  std::vector<unsigned char> vec(size_ / page);
  if (::mincore(data_, size_, vec.data()) != 0) return 0;
  uint64_t pages = 0;
  for (unsigned char c : vec) pages += c & 1u;
  return pages * page;
}

Result<KvCache> KvCache::create(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k,
                                int64_t head_dim_v, std::vector<int64_t> windows) {
  CAR_CHECK(n_layer > 0 && n_ctx > 0 && n_head_kv > 0 && head_dim_k > 0 && head_dim_v > 0);
  const uint64_t bytes = static_cast<uint64_t>(n_layer * n_head_kv * n_ctx * (head_dim_k + head_dim_v)) *
                         sizeof(uint16_t);
  auto map = KvMapping::map(bytes);
  if (!map.ok()) return map.error();
  return KvCache(n_layer, n_ctx, n_head_kv, head_dim_k, head_dim_v, std::move(windows), std::move(*map));
}

KvCache::KvCache(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
                 std::vector<int64_t> windows)
    : KvCache([&] {
        auto c = create(n_layer, n_ctx, n_head_kv, head_dim_k, head_dim_v, std::move(windows));
        if (!c.ok()) throw std::bad_alloc();
        return std::move(*c);
      }()) {}

KvCache::KvCache(int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v,
                 std::vector<int64_t> windows, KvMapping map)
    : n_layer_(n_layer), n_ctx_(n_ctx), n_head_kv_(n_head_kv), dk_(head_dim_k), dv_(head_dim_v),
      windows_(std::move(windows)), map_(std::move(map)) {
  CAR_CHECK(windows_.empty() || static_cast<int64_t>(windows_.size()) == n_layer);
  for (int64_t w : windows_) CAR_CHECK(w >= 0);
}

void KvCache::truncate(int64_t n) {
  CAR_CHECK(n >= 0 && n <= n_past_);
  n_past_ = n;
}

void KvCache::advance(int64_t n) {
  CAR_CHECK(n >= 0 && n_past_ + n <= n_ctx_);
  n_past_ += n;
  touched_ = std::max(touched_, n_past_);
}

void KvCache::touch(int64_t end) { touched_ = std::clamp(end, touched_, n_ctx_); }

void KvCache::prepare(int64_t end) {
  end = std::min(end, n_ctx_);
  const int64_t have = std::max(touched_, prepared_);
  if (end <= have) {
    touch(end);
    return;
  }
  static std::atomic<bool> unsupported{false};
  if (!unsupported.load(std::memory_order_relaxed)) {
    // Rows below `have` have their pages already; the page holding row `have` may too (populating a
    // resident page changes nothing). Each region's pages now hold whole rows up to its last page's end:
    // prepared_ is the fewest of those, so the next steps' rows make no system call until they pass it.
    const size_t page = KvMapping::page_size();
    int64_t covered = n_ctx_;
    bool failed = false;
    for_each_region([&](size_t start, size_t row) {
      if (failed) return;
      const size_t from = round_down(start + static_cast<size_t>(have) * row, page);
      const size_t to = round_up(start + static_cast<size_t>(end) * row, page);
      if (!map_.populate(from, to)) {
        unsupported.store(true, std::memory_order_relaxed);
        failed = true;
        return;
      }
      covered = std::min(covered, static_cast<int64_t>((to - start) / row));
    });
    prepared_ = failed ? end : std::max(end, covered);
  }
  touch(end);
}

void KvCache::shrink(int64_t keep, int64_t retain) {
  truncate(keep);
  retain = std::clamp(retain, keep, n_ctx_);
  if (touched_ <= retain) return;
  if (retain == 0) {
    map_.release(0, map_.size());
    touched_ = 0;
    prepared_ = 0;
    return;
  }
  // Region by region (K's, then V's): the pages wholly past row `retain` up to the rows written. A page that
  // also holds the next region's first rows is kept (it is in that region's prefix).
  const size_t page = KvMapping::page_size();
  const size_t total = size_bytes();
  for_each_region([&](size_t start, size_t row) {
    const size_t stop = start + static_cast<size_t>(n_ctx_) * row;
    const size_t limit = stop == total ? map_.size() : round_down(stop, page);
    const size_t end = std::min(round_up(start + static_cast<size_t>(touched_) * row, page), limit);
    map_.release(start + static_cast<size_t>(retain) * row, end);
  });
  touched_ = retain;
  prepared_ = std::min(prepared_, retain);
}

uint64_t KvCache::resident_bytes(int64_t rows) const {
  rows = std::clamp<int64_t>(rows, 0, n_ctx_);
  if (rows == 0) return 0;
  const size_t page = KvMapping::page_size();
  size_t covered = 0;  // pages [0, covered) already counted
  uint64_t pages = 0;
  for_each_region([&](size_t start, size_t row) {
    const size_t p0 = std::max(start / page, covered);
    const size_t p1 = (start + static_cast<size_t>(rows) * row + page - 1) / page;
    if (p1 > p0) pages += p1 - p0;
    covered = std::max(covered, p1);
  });
  return pages * page;
}

}  // namespace car::engine
