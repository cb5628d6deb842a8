// StringTable: an immutable-after-build hash map from byte strings to int32 values, built for vocabularies.
//
// Vocabularies have up to a few hundred thousand tokens and merges that must be indexed at every model load;
// node-based maps spend most of that time allocating and chasing pointers. Here keys are copied into one
// arena (a byte vector addressed by offset, so moving the table keeps everything valid) and indexed by an
// open-addressing array of 16-byte slots (linear probing, load factor <= 1/2, each slot caching half the
// key's hash).
//
// Not thread-safe while being built; once built, find() is const and safe from many threads.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace car::tokenizer {

class StringTable {
 public:
  static constexpr int32_t kAbsent = -1;

  /// Prepares for `n` keys totalling about `bytes` bytes (optional; avoids regrowth).
  void reserve(size_t n, size_t bytes = 0);
  /// Inserts `key` -> `value`, or replaces the value of an existing key. False only when the table would
  /// exceed its limits (4 GiB of key bytes or 2^31 keys).
  bool assign(std::string_view key, int32_t value);
  /// Inserts `key` -> `value` unless the key is present (then keeps the first value). False as for assign().
  bool insert_first(std::string_view key, int32_t value);
  /// The value of `key`, or kAbsent.
  int32_t find(std::string_view key) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint32_t tag = 0;  // the high half of the key's hash (the low half picks the slot)
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t value = kAbsent;  // kAbsent marks an empty slot (stored values are never negative)
  };
  static uint64_t hash_of(std::string_view key);
  size_t probe(std::string_view key, uint64_t hash) const;  // the slot holding `key`, or the empty one to use
  bool put(std::string_view key, int32_t value, bool replace);
  void grow();

  std::vector<char> arena_;
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace car::tokenizer
