// GgufWriter: builds a GGUF v3 file in memory order and writes it out.
//
// Add metadata (any value type, arrays nested) and tensors (raw bytes of any ggml type) in the order they
// should appear; write() lays out the header, tensor infos, alignment padding (general.alignment if set,
// else 32) and the data section with each tensor aligned. Not thread-safe.
//
// A tensor's data can be given up front (add_tensor) or produced at write time (add_tensor_streamed): the
// header and tensor infos need only shapes and types, so write() emits them first and then asks each
// producer in turn for its bytes, passing them straight to the file in large writes. A model built from
// producers is never whole in memory: peak memory is what one producer holds at a time plus the write
// buffer (kWriteBuffer). Producers run in tensor order, once per to_bytes() / write() call.
#pragma once

#include <cstdint>
#include <functional>
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

  /// Receives a tensor's bytes in order, in pieces of any size.
  using ByteSink = std::function<void(const void* data, size_t n)>;
  /// Writes one tensor's data to the sink: exactly the type's size for the shape, in order (a mismatch is a
  /// programming error and aborts). Called at serialization time, in tensor order; must not throw.
  using TensorProducer = std::function<void(const ByteSink& out)>;

  /// Add a tensor whose data `produce` generates when the file is serialized. Same checks as add_tensor.
  Result<void> add_tensor_streamed(std::string name, GgmlType type, std::vector<uint64_t> shape,
                                   TensorProducer produce);

  /// Bytes write() gathers before each write(2) call; larger pieces go to the file directly.
  static constexpr size_t kWriteBuffer = size_t{8} << 20;

  /// Serialize to bytes / write to a file (atomically via a temporary file and rename).
  std::vector<uint8_t> to_bytes() const;
  Result<void> write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> shape;
    uint64_t n_bytes = 0;
    std::vector<uint8_t> data;  ///< the bytes, when given up front
    TensorProducer produce;     ///< else their producer
  };
  /// The checks shared by add_tensor / add_tensor_streamed; the data size that type and shape need.
  Result<uint64_t> check_tensor(const std::string& name, GgmlType type,
                                const std::vector<uint64_t>& shape) const;
  std::vector<KeyValue> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace car::gguf
