// AlignedScratch: a grow-only, 64-byte aligned buffer, one per thread (thread_local) in the matmul tiles that
// pack weights or keep state between calls. Never shrinks; freed with its thread.
#pragma once

#include <cstddef>
#include <new>

namespace car::tensor::detail {

struct AlignedScratch {
  void* p = nullptr;
  std::size_t size = 0;
  AlignedScratch() = default;
  AlignedScratch(const AlignedScratch&) = delete;
  AlignedScratch& operator=(const AlignedScratch&) = delete;
  ~AlignedScratch() { ::operator delete(p, std::align_val_t{64}); }
  /// At least `need` bytes, 64-byte aligned; earlier contents are lost when it grows.
  void* get(std::size_t need) {
    if (size < need) {
      ::operator delete(p, std::align_val_t{64});
      p = ::operator new(need, std::align_val_t{64});
      size = need;
    }
    return p;
  }
};

}  // namespace car::tensor::detail
