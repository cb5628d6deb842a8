// GgufFile: a parsed, validated, read-only view of a GGUF file (versions 2 and 3).
//
// On-disk layout (all little-endian):
//
//   magic          u32   "GGUF" (0x46554747)
//   version        u32   2 or 3 (1 and anything else are rejected by name)
//   tensor_count   u64
//   kv_count       u64
//   kv[kv_count]:  key: gguf_string, value_type: u32, value
//   tensor_info[tensor_count]:
//                  name: gguf_string, n_dims: u32 (1..4), ne[n_dims]: u64, type: u32 (ggml type id),
//                  offset: u64 (relative to the data section, a multiple of the alignment)
//   padding        to `general.alignment` (u32 key, default 32)
//   data section   tensor bytes
//
//   gguf_string = u64 length + bytes (not NUL-terminated)
//   value types:  0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (u8), 8 string,
//                 9 array (u32 element type + u64 count + elements; arrays may nest), 10 u64, 11 i64, 12 f64
//
// The file is treated as hostile: every count, length, offset and size is checked against the file size with
// overflow-safe arithmetic before anything is allocated or read; a violation returns an Error whose code
// names the kind (see GgufErrorCode below) and whose message names the field and the numbers.
//
// Ownership: open() maps the file and the GgufFile owns the mapping; parse() works on caller-owned bytes
// that must outlive the object. Tensor data views point into that memory. Immutable after construction, so
// safe to share across threads.
//
// A mapped file can change under the reader (rewritten or truncated in place by another process). With the
// fault guard installed (core/util/fault_guard.h), reads past a shrunken end see zeros and set faulted();
// check_intact() says whether anything read so far can be trusted, check_current(path) whether `path`
// still names the file that was opened. A file that changed is dropped and opened again, never reused.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/util/error_codes.h"
#include "core/util/mapped_file.h"
#include "core/util/result.h"

namespace car::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

// Error codes returned by the reader and the writer: car::errc::kGguf* (core/util/error_codes.h).

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);

struct Value;
/// An array value: its element type and elements (elements may themselves be arrays).
struct ArrayValue {
  ValueType elem_type = ValueType::UINT8;
  std::vector<Value> items;
  /// Same element type and equal items (deep).
  friend bool operator==(const ArrayValue& a, const ArrayValue& b);
};

/// One metadata value. The variant's index equals the ValueType id, so `type()` is `index()`.
struct Value {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                               ArrayValue, uint64_t, int64_t, double>;
  Storage v;

  ValueType type() const { return static_cast<ValueType>(v.index()); }
  template <typename T>
  const T* get_if() const { return std::get_if<T>(&v); }
  /// Any integer type (signed or unsigned, and bool) widened to int64; nullopt otherwise or if a u64 > INT64_MAX.
  std::optional<int64_t> as_int() const;
  /// Any integer or float type as double.
  std::optional<double> as_double() const;
  /// Same type and equal value (deep for arrays; floats compare with ==).
  friend bool operator==(const Value& a, const Value& b) { return a.v == b.v; }
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, kMaxDims> ne{1, 1, 1, 1};  ///< ggml order: ne[0] is the row length
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;   ///< relative to the data section, as stored
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;  ///< size of the data in the file
  uint64_t rows() const { return n_elements / ne[0]; }
};

class GgufFile {
 public:
  /// mmap `path` and parse it.
  static Result<std::shared_ptr<const GgufFile>> open(const std::string& path);
  /// Parse bytes the caller owns (they must outlive the result). Used by tests and the fuzzer.
  static Result<std::shared_ptr<const GgufFile>> parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  ///< absolute file offset of the data section
  uint64_t file_size() const { return bytes_.size(); }
  const std::string& path() const { return path_; }     ///< empty for parse()
  /// The descriptor of the mapped file (-1 for parse()), for positional reads.
  int fd() const { return file_.fd(); }
  /// The mapped file as it was at open (zeros for parse()).
  const FileIdentity& identity() const { return file_.identity(); }
  /// Whether a read of the mapping faulted because the file shrank (always false for parse()).
  bool faulted() const { return file_.faulted(); }
  /// OK when no read faulted and the open file was not modified since open (see MappedFile); always OK for
  /// parse(). Error io_error.
  Result<void> check_intact() const { return file_.check_unchanged(); }
  /// check_intact(), and `path` still names the opened file (same device, inode, size and mtime).
  /// Errors: not_found, io_error. OK for parse().
  Result<void> check_current(const std::string& path) const;

  /// Metadata in file order.
  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  /// Typed accessors. Errors: missing_key (naming it), type_mismatch (naming key, expected and actual type).
  /// get_uint/get_int accept any integer type whose value fits; get_float accepts f32/f64.
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  /// An array; `elem` set means the element type must match it.
  Result<const ArrayValue*> get_array(std::string_view key, std::optional<ValueType> elem = std::nullopt) const;
  /// The value or `fallback` when the key is absent; a present key of the wrong type is still an error.
  Result<uint64_t> get_uint_or(std::string_view key, uint64_t fallback) const;
  Result<double> get_float_or(std::string_view key, double fallback) const;
  Result<bool> get_bool_or(std::string_view key, bool fallback) const;
  Result<std::string> get_string_or(std::string_view key, std::string fallback) const;

  /// Tensors in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  /// The tensor's bytes in the file (validated in range at parse time).
  std::span<const uint8_t> tensor_data(const TensorInfo& t) const;
  /// Absolute file offset of a tensor's data.
  uint64_t tensor_file_offset(const TensorInfo& t) const { return data_offset_ + t.offset; }
  /// Whole-file bytes.
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  GgufFile() = default;
  static Result<std::shared_ptr<const GgufFile>> parse_into(std::shared_ptr<GgufFile> f);

  MappedFile file_;                  // empty for parse()
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace car::gguf
