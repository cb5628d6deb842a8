// Overflow-checked unsigned arithmetic for sizes read from untrusted files.
#pragma once

#include <cstdint>
#include <optional>

namespace car {

/// a + b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a * b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// Round `v` up to a multiple of `align` (a power of two or any positive number), or nullopt on overflow.
inline std::optional<uint64_t> checked_align_up(uint64_t v, uint64_t align) {
  if (align == 0) return std::nullopt;
  uint64_t rem = v % align;
  if (rem == 0) return v;
  return checked_add(v, align - rem);
}

}  // namespace car
