#include "core/gguf/gguf_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "core/util/checked_math.h"
#include "core/util/error_codes.h"

namespace car::gguf {
namespace {

// Arrays may nest; a hostile file must not be able to recurse the parser off the stack.
constexpr int kMaxArrayDepth = 16;

// Minimum encoded size of one element of each value type, used to bound counts before allocating.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;        // u64 length, possibly empty
    case ValueType::ARRAY: return 4 + 8;     // element type + count, possibly empty
  }
  return 1;
}

bool valid_value_type(uint32_t id) { return id <= static_cast<uint32_t>(ValueType::FLOAT64); }

std::string num(uint64_t v) { return std::to_string(v); }

// Bounds-checked little-endian reader over the file bytes. Every read names the field it is reading, so
// an error says what was being read and where.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return bytes_.size(); }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  Result<T> read(const std::string& field) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> read_string(const std::string& field) {
    if (remaining() < 8) return truncated(field + " length", 8);
    auto len = read<uint64_t>(field);
    if (*len > remaining()) {
      return make_error(errc::kGgufTruncated, field + ": string length " + num(*len) + " at offset " +
                                                  num(pos_ - 8) + " runs past end of file (" +
                                                  num(remaining()) + " bytes left, size " + num(size()) +
                                                  ")");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(*len));
    pos_ += *len;
    return s;
  }

 private:
  Error truncated(const std::string& field, uint64_t want) const {
    return make_error(errc::kGgufTruncated, field + ": needs " + num(want) + " bytes at offset " + num(pos_) +
                                                ", past end of file (size " + num(size()) + ")");
  }

  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

std::string type_desc(const Value& v) {
  std::string s(value_type_name(v.type()));
  if (const auto* a = v.get_if<ArrayValue>()) s += "[" + std::string(value_type_name(a->elem_type)) + "]";
  return s;
}

Result<Value> read_value(Cursor& c, ValueType type, const std::string& field, int depth);

Result<Value> read_array(Cursor& c, const std::string& field, int depth) {
  if (depth >= kMaxArrayDepth) {
    return make_error(errc::kGgufBadValueType,
                      field + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
  }
  auto elem = c.read<uint32_t>(field + " element type");
  if (!elem) return elem.error();
  if (!valid_value_type(*elem)) {
    return make_error(errc::kGgufBadValueType, field + ": unknown array element type " + num(*elem));
  }
  const auto elem_type = static_cast<ValueType>(*elem);
  auto count = c.read<uint64_t>(field + " array count");
  if (!count) return count.error();
  const uint64_t min_size = min_encoded_size(elem_type);
  if (*count > c.remaining() / min_size) {
    return make_error(errc::kGgufTooLarge,
                      field + ": array of " + num(*count) + " " + std::string(value_type_name(elem_type)) +
                          " needs at least " +
                          (checked_mul(*count, min_size) ? num(*count * min_size) : "> 2^64") +
                          " bytes, only " + num(c.remaining()) + " left (file size " + num(c.size()) + ")");
  }
  ArrayValue arr;
  arr.elem_type = elem_type;
  arr.items.reserve(static_cast<size_t>(*count));  // bounded by the remaining bytes, checked above
  for (uint64_t i = 0; i < *count; ++i) {
    // Items are read under the array's field name (no per-item string building on the hot path of
    // 150k-token vocabularies); an error gets the item's index spliced in after that name.
    auto v = read_value(c, elem_type, field, depth + 1);
    if (!v) {
      Error e = v.error();
      if (e.message.rfind(field, 0) == 0) e.message.insert(field.size(), "[" + num(i) + "]");
      return e;
    }
    arr.items.push_back(std::move(*v));
  }
  return Value{std::move(arr)};
}

Result<Value> read_value(Cursor& c, ValueType type, const std::string& field, int depth) {
  auto wrap = [](auto r) -> Result<Value> {
    if (!r) return r.error();
    return Value{*r};
  };
  switch (type) {
    case ValueType::UINT8: return wrap(c.read<uint8_t>(field));
    case ValueType::INT8: return wrap(c.read<int8_t>(field));
    case ValueType::UINT16: return wrap(c.read<uint16_t>(field));
    case ValueType::INT16: return wrap(c.read<int16_t>(field));
    case ValueType::UINT32: return wrap(c.read<uint32_t>(field));
    case ValueType::INT32: return wrap(c.read<int32_t>(field));
    case ValueType::FLOAT32: return wrap(c.read<float>(field));
    case ValueType::UINT64: return wrap(c.read<uint64_t>(field));
    case ValueType::INT64: return wrap(c.read<int64_t>(field));
    case ValueType::FLOAT64: return wrap(c.read<double>(field));
    case ValueType::BOOL: {
      auto b = c.read<uint8_t>(field);
      if (!b) return b.error();
      if (*b > 1) {
        return make_error(errc::kGgufBadValueType, field + ": bool value " + num(*b) + " is neither 0 nor 1");
      }
      return Value{*b == 1};
    }
    case ValueType::STRING: {
      auto s = c.read_string(field);
      if (!s) return s.error();
      return Value{std::move(*s)};
    }
    case ValueType::ARRAY: return read_array(c, field, depth);
  }
  return make_error(errc::kGgufBadValueType, field + ": unknown value type");
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

std::optional<int64_t> Value::as_int() const {
  switch (type()) {
    case ValueType::UINT8: return *get_if<uint8_t>();
    case ValueType::INT8: return *get_if<int8_t>();
    case ValueType::UINT16: return *get_if<uint16_t>();
    case ValueType::INT16: return *get_if<int16_t>();
    case ValueType::UINT32: return *get_if<uint32_t>();
    case ValueType::INT32: return *get_if<int32_t>();
    case ValueType::BOOL: return *get_if<bool>() ? 1 : 0;
    case ValueType::INT64: return *get_if<int64_t>();
    case ValueType::UINT64: {
      uint64_t u = *get_if<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(u);
    }
    default: return std::nullopt;
  }
}

bool operator==(const ArrayValue& a, const ArrayValue& b) {
  return a.elem_type == b.elem_type && a.items == b.items;
}

std::optional<double> Value::as_double() const {
  if (const auto* f = get_if<float>()) return *f;
  if (const auto* d = get_if<double>()) return *d;
  if (const auto* u = get_if<uint64_t>()) return static_cast<double>(*u);
  if (auto i = as_int()) return static_cast<double>(*i);
  return std::nullopt;
}

Result<std::shared_ptr<const GgufFile>> GgufFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped) return mapped.error();
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->file_ = std::move(*mapped);
  f->bytes_ = f->file_.bytes();
  f->path_ = path;
  const std::shared_ptr<const GgufFile> opened = f;
  auto r = parse_into(std::move(f));
  // A file that shrank or changed while it was parsed was read (partly) as zeros or as a mix of two
  // versions: report that, not what the parser made of it.
  if (auto intact = opened->check_intact(); !intact) return intact.error();
  if (!r) return make_error(r.error().code, path + ": " + r.error().message);
  return r;
}

Result<void> GgufFile::check_current(const std::string& path) const {
  if (file_.fd() < 0) return {};
  if (auto intact = check_intact(); !intact) return intact;
  return file_.matches(path);
}

Result<std::shared_ptr<const GgufFile>> GgufFile::parse(std::span<const uint8_t> bytes) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->bytes_ = bytes;
  return parse_into(std::move(f));
}

Result<std::shared_ptr<const GgufFile>> GgufFile::parse_into(std::shared_ptr<GgufFile> f) {
  Cursor c(f->bytes_);

  // Header.
  auto magic = c.read<uint32_t>("magic");
  if (!magic) return magic.error();
  if (*magic != kMagic) {
    char shown[5] = {0, 0, 0, 0, 0};
    std::memcpy(shown, &*magic, 4);
    for (char& ch : shown) {
      if (ch != 0 && (ch < 0x20 || ch > 0x7e)) ch = '?';
    }
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", *magic);
    return make_error(errc::kGgufBadMagic, "bad magic 0x" + std::string(hex) + " (\"" + std::string(shown) +
                                               "\"), expected \"GGUF\"");
  }
  auto version = c.read<uint32_t>("version");
  if (!version) return version.error();
  if (*version == 1) {
    return make_error(errc::kGgufBadVersion, "GGUF version 1 is not supported (only versions 2 and 3)");
  }
  if (*version != 2 && *version != 3) {
    std::string msg = "unknown GGUF version " + num(*version) + " (supported: 2 and 3)";
    if (*version == 0x02000000u || *version == 0x03000000u) msg += "; the file looks big-endian";
    return make_error(errc::kGgufBadVersion, msg);
  }
  f->version_ = *version;
  auto tensor_count = c.read<uint64_t>("tensor_count");
  if (!tensor_count) return tensor_count.error();
  auto kv_count = c.read<uint64_t>("kv_count");
  if (!kv_count) return kv_count.error();

  // Each kv needs a key length (8), a value type (4) and at least one value byte; each tensor info at least
  // a name length (8), n_dims (4), one dim (8), a type (4) and an offset (8).
  constexpr uint64_t kMinKv = 8 + 4 + 1;
  constexpr uint64_t kMinTensorInfo = 8 + 4 + 8 + 4 + 8;
  if (*kv_count > c.remaining() / kMinKv) {
    return make_error(errc::kGgufTooLarge, "kv_count " + num(*kv_count) + " needs at least " + num(kMinKv) +
                                               " bytes each, only " + num(c.remaining()) +
                                               " bytes left (file size " + num(c.size()) + ")");
  }
  if (*tensor_count > c.remaining() / kMinTensorInfo) {
    return make_error(errc::kGgufTooLarge, "tensor_count " + num(*tensor_count) + " needs at least " +
                                               num(kMinTensorInfo) + " bytes each, only " +
                                               num(c.remaining()) + " bytes left (file size " +
                                               num(c.size()) + ")");
  }

  // Metadata.
  f->kv_.reserve(static_cast<size_t>(*kv_count));
  for (uint64_t i = 0; i < *kv_count; ++i) {
    const std::string where = "metadata[" + num(i) + "]";
    auto key = c.read_string(where + " key");
    if (!key) return key.error();
    const std::string field = "metadata key '" + *key + "'";
    auto type = c.read<uint32_t>(field + " value type");
    if (!type) return type.error();
    if (!valid_value_type(*type)) {
      return make_error(errc::kGgufBadValueType, field + ": unknown value type " + num(*type));
    }
    auto value = read_value(c, static_cast<ValueType>(*type), field, 0);
    if (!value) return value.error();
    if (f->kv_index_.count(*key) != 0) {
      return make_error(errc::kGgufDuplicateKey, "duplicate metadata key '" + *key + "' (entries " +
                                                     num(f->kv_index_[*key]) + " and " + num(i) + ")");
    }
    f->kv_index_.emplace(*key, f->kv_.size());
    f->kv_.push_back(KeyValue{std::move(*key), std::move(*value)});
  }

  // Alignment.
  if (const Value* a = f->find("general.alignment")) {
    const auto* u = a->get_if<uint32_t>();
    if (u == nullptr) {
      return make_error(errc::kGgufBadAlignment,
                        "general.alignment has type " + type_desc(*a) + ", expected uint32");
    }
    if (*u == 0 || (*u & (*u - 1)) != 0) {
      return make_error(errc::kGgufBadAlignment, "general.alignment " + num(*u) + " is not a power of two");
    }
    f->alignment_ = *u;
  }

  // Tensor infos.
  f->tensors_.reserve(static_cast<size_t>(*tensor_count));
  for (uint64_t i = 0; i < *tensor_count; ++i) {
    const std::string where = "tensor_info[" + num(i) + "]";
    auto name = c.read_string(where + " name");
    if (!name) return name.error();
    const std::string field = "tensor " + *name;
    TensorInfo t;
    t.name = std::move(*name);
    auto n_dims = c.read<uint32_t>(field + " n_dims");
    if (!n_dims) return n_dims.error();
    if (*n_dims == 0 || *n_dims > static_cast<uint32_t>(kMaxDims)) {
      return make_error(errc::kGgufBadDims,
                        field + ": n_dims " + num(*n_dims) + " not in 1.." + num(kMaxDims));
    }
    t.n_dims = *n_dims;
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      auto ne = c.read<uint64_t>(field + " ne[" + num(d) + "]");
      if (!ne) return ne.error();
      if (*ne == 0) return make_error(errc::kGgufBadDims, field + ": ne[" + num(d) + "] is 0");
      if (*ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(errc::kGgufBadDims,
                          field + ": ne[" + num(d) + "] = " + num(*ne) + " exceeds 2^63-1");
      }
      auto prod = checked_mul(n_elements, *ne);
      if (!prod || *prod > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return make_error(errc::kGgufBadDims,
                          field + ": element count overflows 2^63-1 at ne[" + num(d) + "] = " + num(*ne));
      }
      n_elements = *prod;
      t.ne[d] = *ne;
    }
    t.n_elements = n_elements;
    auto type_id = c.read<uint32_t>(field + " type");
    if (!type_id) return type_id.error();
    auto traits = ggml_type_traits(*type_id);
    if (!traits) return make_error(errc::kGgufUnknownType, field + ": unknown ggml type id " + num(*type_id));
    t.type = traits->type;
    if (t.ne[0] % traits->block_size != 0) {
      return make_error(errc::kGgufBadShape, field + ": row length ne[0] = " + num(t.ne[0]) +
                                                 " is not a multiple of " + std::string(traits->name) +
                                                 "'s block size " + num(traits->block_size));
    }
    auto bytes = checked_mul(t.ne[0] / traits->block_size, traits->bytes_per_block);
    if (bytes) bytes = checked_mul(*bytes, t.rows());
    if (!bytes) return make_error(errc::kGgufBadDims, field + ": data size overflows 64 bits");
    t.n_bytes = *bytes;
    auto offset = c.read<uint64_t>(field + " offset");
    if (!offset) return offset.error();
    if (*offset % f->alignment_ != 0) {
      return make_error(errc::kGgufMisaligned, field + ": data offset " + num(*offset) +
                                                   " is not a multiple of the " + "alignment " +
                                                   num(f->alignment_));
    }
    t.offset = *offset;
    if (f->tensor_index_.count(t.name) != 0) {
      return make_error(errc::kGgufDuplicateTensor, "duplicate tensor name '" + t.name + "' (tensor_info " +
                                                        num(f->tensor_index_[t.name]) + " and " + num(i) +
                                                        ")");
    }
    f->tensor_index_.emplace(t.name, f->tensors_.size());
    f->tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment after the tensor infos.
  auto data_offset = checked_align_up(c.pos(), f->alignment_);
  if (!data_offset) return make_error(errc::kGgufTooLarge, "data section offset overflows 64 bits");
  f->data_offset_ = *data_offset;

  for (const auto& t : f->tensors_) {
    auto begin = checked_add(f->data_offset_, t.offset);
    auto end = begin ? checked_add(*begin, t.n_bytes) : std::nullopt;
    if (!end || *end > c.size()) {
      return make_error(errc::kGgufOutOfBounds,
                        "tensor " + t.name + ": data [" + num(t.offset) + ", " +
                            (checked_add(t.offset, t.n_bytes) ? num(t.offset + t.n_bytes) : "> 2^64") +
                            ") at data section " + num(f->data_offset_) + " past end of file (size " +
                            num(c.size()) + ")");
    }
  }

  // No two tensors may share bytes.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f->tensors_.size());
  for (const auto& t : f->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (prev.offset + prev.n_bytes > cur.offset) {
      return make_error(errc::kGgufOverlap, "tensor " + cur.name + ": data [" + num(cur.offset) + ", " +
                                                num(cur.offset + cur.n_bytes) + ") overlaps tensor " +
                                                prev.name + " [" + num(prev.offset) + ", " +
                                                num(prev.offset + prev.n_bytes) + ")");
    }
  }
  return std::shared_ptr<const GgufFile>(std::move(f));
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const TensorInfo& t) const {
  return bytes_.subspan(static_cast<size_t>(data_offset_ + t.offset), static_cast<size_t>(t.n_bytes));
}

namespace {

Error missing(std::string_view key) {
  return make_error(errc::kGgufMissingKey, "metadata key '" + std::string(key) + "' is missing");
}

Error mismatch(std::string_view key, std::string_view expected, const Value& v) {
  return make_error(errc::kGgufTypeMismatch, "metadata key '" + std::string(key) + "': expected " +
                                                 std::string(expected) + ", found " + type_desc(v));
}

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64: return true;
    default: return false;
  }
}

}  // namespace

Result<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (!is_integer(v->type())) return mismatch(key, "an unsigned integer", *v);
  if (const auto* u = v->get_if<uint64_t>()) return *u;
  int64_t i = *v->as_int();
  if (i < 0) {
    return make_error(errc::kGgufTypeMismatch, "metadata key '" + std::string(key) +
                                                   "': expected an unsigned integer, "
                                                   "found negative " +
                                                   std::string(value_type_name(v->type())) + " " +
                                                   std::to_string(i));
  }
  return static_cast<uint64_t>(i);
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (!is_integer(v->type())) return mismatch(key, "an integer", *v);
  auto i = v->as_int();
  if (!i) {
    const auto* u = v->get_if<uint64_t>();
    return make_error(errc::kGgufTypeMismatch, "metadata key '" + std::string(key) + "': uint64 value " +
                                                   (u != nullptr ? num(*u) : std::string("?")) +
                                                   " does not fit int64");
  }
  return *i;
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* f = v->get_if<float>()) return static_cast<double>(*f);
  if (const auto* d = v->get_if<double>()) return *d;
  return mismatch(key, "float32 or float64", *v);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* b = v->get_if<bool>()) return *b;
  return mismatch(key, "bool", *v);
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* s = v->get_if<std::string>()) return *s;
  return mismatch(key, "string", *v);
}

Result<const ArrayValue*> GgufFile::get_array(std::string_view key, std::optional<ValueType> elem) const {
  const Value* v = find(key);
  if (v == nullptr) return missing(key);
  const auto* a = v->get_if<ArrayValue>();
  if (a == nullptr || (elem && a->elem_type != *elem)) {
    std::string expected = "array";
    if (elem) expected += "[" + std::string(value_type_name(*elem)) + "]";
    return mismatch(key, expected, *v);
  }
  return a;
}

Result<uint64_t> GgufFile::get_uint_or(std::string_view key, uint64_t fallback) const {
  if (!has(key)) return fallback;
  return get_uint(key);
}

Result<double> GgufFile::get_float_or(std::string_view key, double fallback) const {
  if (!has(key)) return fallback;
  return get_float(key);
}

Result<bool> GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  if (!has(key)) return fallback;
  return get_bool(key);
}

Result<std::string> GgufFile::get_string_or(std::string_view key, std::string fallback) const {
  if (!has(key)) return fallback;
  return get_string(key);
}

}  // namespace car::gguf
