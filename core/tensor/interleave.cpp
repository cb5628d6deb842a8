// The interleaved layouts of Q4_K and Q6_K (kernels.h interleave_rows): which matrices take them, the writer
// (the table's kernel), the portable inverses, and the de-interleaved copy a table without the layout's
// kernels reads.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <thread>
#include <memory>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/tensor/q6k_interleaved.h"
#include "core/util/result.h"
#include "core/util/thread_pool.h"

namespace car::tensor {
namespace {

constexpr int64_t kGroup = detail::kRepackedRowGroup;  // rows per interleaved group
constexpr size_t kQsBytes = 2048;                      // the quants of one super-block of a group
static_assert(16 * sizeof(block_q4_K) == kQsBytes + 16 * 16);

std::atomic<bool> g_enabled{true};

}  // namespace

void set_interleave_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

bool can_interleave(const MatrixView& w) {
  const detail::DotKernels& k = detail::active_kernels();
  if (!g_enabled.load(std::memory_order_relaxed) || w.interleaved || w.data == nullptr || w.rows <= 0 ||
      w.rows % kGroup != 0 || w.cols % QK_K != 0 ||
      static_cast<uint32_t>(w.type) >= static_cast<uint32_t>(detail::kTypeSlots) ||
      !k.interleaved[detail::slot(w.type)].usable() || w.row_bytes != detail::row_bytes(w.type, w.cols)) {
    return false;
  }
  // Q4_K: llama.cpp's repacked gemv / gemm orders, which the layout's kernels keep. Q6_K: the one dot order,
  // which the product's order must not replace.
  if (w.type == GgmlType::Q4_K) return detail::repacked(w);
  return w.type == GgmlType::Q6_K && !detail::order_differs(k, w.type, w.order);
}

MatrixView interleave_rows(const MatrixView& w, uint8_t* dst, ThreadPool* pool) {
  CAR_CHECK(can_interleave(w));
  CAR_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0);
  const auto interleave = detail::active_kernels().interleaved[detail::slot(w.type)].interleave;
  const int64_t groups = w.rows / kGroup;
  const size_t group_bytes = static_cast<size_t>(kGroup) * w.row_bytes;
  auto run = [&](int64_t g0, int64_t g1) {
    interleave(w.data + static_cast<size_t>(g0) * group_bytes, w.row_bytes, (g1 - g0) * kGroup, w.cols,
               dst + static_cast<size_t>(g0) * group_bytes);
  };
  if (pool != nullptr && pool->size() > 1 && groups > 1) {
    pool->parallel_for(groups, 8, 0, run);
  } else {
    run(0, groups);
  }
  MatrixView v = w;
  v.data = dst;
  v.interleaved = true;
  return v;
}

void deinterleave_rows(const MatrixView& w, uint8_t* dst) {
  CAR_CHECK(w.interleaved && (w.type == GgmlType::Q4_K || w.type == GgmlType::Q6_K) && w.rows % kGroup == 0);
  const int64_t nb = w.cols / QK_K;
  if (w.type == GgmlType::Q6_K) {
    for (int64_t r0 = 0; r0 < w.rows; r0 += kGroup) {
      const uint8_t* src = w.data + static_cast<size_t>(r0) * w.row_bytes;
      for (int64_t i = 0; i < nb; ++i) {
        detail::q6k::read_block(
            src + static_cast<size_t>(i) * detail::q6k::kBlockBytes, [&](int r) -> block_q6_K& {
              return reinterpret_cast<block_q6_K*>(dst + static_cast<size_t>(r0 + r) * w.row_bytes)[i];
            });
      }
    }
    return;
  }
  const size_t block_bytes = sizeof(block_q4_K);
  for (int64_t r0 = 0; r0 < w.rows; r0 += kGroup) {
    const uint8_t* src = w.data + static_cast<size_t>(r0) * w.row_bytes;
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t* b = src + static_cast<size_t>(i) * kGroup * block_bytes;
      for (int64_t r = 0; r < kGroup; ++r) {
        uint8_t* out = dst + static_cast<size_t>(r0 + r) * w.row_bytes + static_cast<size_t>(i) * block_bytes;
        for (int j = 0; j < 4; ++j) std::memcpy(out + 4 * j, b + kQsBytes + 64 * j + 4 * r, 4);  // the header
        for (int g = 0; g < 4; ++g) {
          for (int c = 0; c < 8; ++c) std::memcpy(out + 16 + 32 * g + 4 * c, b + 512 * g + 64 * c + 4 * r, 4);
        }
      }
    }
  }
}

std::shared_ptr<uint8_t> interleave_all(std::span<MatrixView* const> views, bool release_source, int threads) {
  constexpr size_t kAlign = 64;
  constexpr size_t kHuge = size_t{2} << 20;
  auto bytes_of = [](const MatrixView& w) { return static_cast<size_t>(w.rows) * w.row_bytes; };
  size_t total = 0;
  for (MatrixView* v : views) {
    if (can_interleave(*v)) total += (bytes_of(*v) + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return nullptr;
  if (threads < 1) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::optional<ThreadPool> pool;
  if (threads > 1) pool.emplace(threads);
  const size_t cap = (total + kHuge - 1) / kHuge * kHuge;
  auto* block = static_cast<uint8_t*>(::operator new(cap, std::align_val_t{kHuge}));
  madvise(block, cap, MADV_HUGEPAGE);  // advice only: without THP the block is ordinary pages
  std::shared_ptr<uint8_t> owned(block, [](uint8_t* q) { ::operator delete(q, std::align_val_t{kHuge}); });
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  size_t at = 0;
  for (MatrixView* v : views) {
    if (!can_interleave(*v)) continue;
    const size_t bytes = bytes_of(*v);
    const auto src = reinterpret_cast<uintptr_t>(v->data);
    *v = interleave_rows(*v, block + at, pool ? &*pool : nullptr);
    at += (bytes + kAlign - 1) / kAlign * kAlign;
    if (release_source) {
      const uintptr_t begin = (src + page - 1) / page * page;
      const uintptr_t end = (src + bytes) / page * page;
      if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    }
  }
  return owned;
}

namespace detail {

MatrixView plain_copy(const MatrixView& w, std::vector<uint8_t>& buf) {
  buf.resize(static_cast<size_t>(w.rows) * w.row_bytes);
  deinterleave_rows(w, buf.data());
  MatrixView v = w;
  v.data = buf.data();
  v.interleaved = false;
  return v;
}

}  // namespace detail
}  // namespace car::tensor
