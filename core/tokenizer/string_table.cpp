#include "core/tokenizer/string_table.h"

#include <cstring>
#include <functional>
#include <limits>

#include "core/util/result.h"

namespace car::tokenizer {

uint64_t StringTable::hash_of(std::string_view key) {
  // FNV-1a, 64-bit, followed by a final mix so that the low bits (the slot index) depend on every byte.
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : key) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

void StringTable::reserve(size_t n, size_t bytes) {
  arena_.reserve(bytes);
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(cap, Slot{});
  for (const Slot& s : old) {
    if (s.value == kAbsent) continue;
    size_t i = hash_of(std::string_view(arena_.data() + s.offset, s.length)) & (cap - 1);
    while (slots_[i].value != kAbsent) i = (i + 1) & (cap - 1);
    slots_[i] = s;
  }
}

void StringTable::grow() {
  reserve(slots_.empty() ? 8 : slots_.size());
}

size_t StringTable::probe(std::string_view key, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  for (;;) {
    const Slot& s = slots_[i];
    if (s.value == kAbsent) return i;
    if (s.tag == static_cast<uint32_t>(hash >> 32) && s.length == key.size() &&
        (key.empty() || std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)) {
      return i;
    }
    i = (i + 1) & mask;
  }
}

bool StringTable::put(std::string_view key, int32_t value, bool replace) {
  CAR_CHECK(value >= 0);
  if (2 * (size_ + 1) > slots_.size()) grow();
  const uint64_t hash = hash_of(key);
  const size_t i = probe(key, hash);
  Slot& s = slots_[i];
  if (s.value != kAbsent) {
    if (replace) s.value = value;
    return true;
  }
  if (arena_.size() + key.size() > std::numeric_limits<uint32_t>::max() ||
      size_ >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return false;
  }
  s.tag = static_cast<uint32_t>(hash >> 32);
  s.offset = static_cast<uint32_t>(arena_.size());
  s.length = static_cast<uint32_t>(key.size());
  s.value = value;
  arena_.insert(arena_.end(), key.begin(), key.end());
  ++size_;
  return true;
}

bool StringTable::assign(std::string_view key, int32_t value) {
  return put(key, value, true);
}
bool StringTable::insert_first(std::string_view key, int32_t value) {
  return put(key, value, false);
}

int32_t StringTable::find(std::string_view key) const {
  if (slots_.empty()) return kAbsent;
  return slots_[probe(key, hash_of(key))].value;
}

}  // namespace car::tokenizer
