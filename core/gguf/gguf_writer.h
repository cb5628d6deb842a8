// GgufWriter: builds a GGUF v3 file in memory order and writes it out.
//
// Add metadata (any value type, arrays nested) and tensors (raw bytes of any ggml type) in the order they
// should appear; write() lays out the header, tensor infos, alignment padding (general.alignment if set,
// else 32) and the data section with each tensor aligned. Not thread-safe; single use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/util/result.h"

namespace car::gguf {

class GgufWriter {
 public:
  void set(std::string key, Value value);  ///< replaces an existing key, keeping its position
  void set_u32(std::string key, uint32_t v) { set(std::move(key), Value{v}); }
  void set_i32(std::string key, int32_t v) { set(std::move(key), Value{v}); }
  void set_u64(std::string key, uint64_t v) { set(std::move(key), Value{v}); }
  void set_f32(std::string key, float v) { set(std::move(key), Value{v}); }
  void set_bool(std::string key, bool v) { set(std::move(key), Value{v}); }
  void set_string(std::string key, std::string v) { set(std::move(key), Value{std::move(v)}); }
  void set_array(std::string key, ArrayValue v) { set(std::move(key), Value{std::move(v)}); }

  /// Add a tensor. `shape` in ggml order (shape[0] = row length), 1..4 dims. `data` must be exactly the
  /// type's size for that shape. Errors: bad_dims, bad_shape, duplicate_tensor.
  Result<void> add_tensor(std::string name, GgmlType type, std::vector<uint64_t> shape, std::vector<uint8_t> data);

  /// Serialize to bytes / write to a file (atomically via a temporary file and rename).
  std::vector<uint8_t> to_bytes() const;
  Result<void> write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<KeyValue> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace car::gguf
