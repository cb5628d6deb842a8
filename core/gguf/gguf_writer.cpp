#include "core/gguf/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "core/util/checked_math.h"
#include "core/util/error_codes.h"

namespace car::gguf {
namespace {

// Receives the serialized file piece by piece (so write() can stream to disk without a second copy).
using Sink = std::function<void(const void* data, size_t n)>;

class Encoder {
 public:
  explicit Encoder(const Sink& sink) : sink_(sink) {}

  template <typename T>
  void put(T v) {
    sink_(&v, sizeof v);
    pos_ += sizeof v;
  }
  void put_bytes(const void* data, size_t n) {
    if (n == 0) return;
    sink_(data, n);
    pos_ += n;
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    put_bytes(s.data(), s.size());
  }
  void pad_to(uint64_t align) {
    static constexpr uint8_t kZeros[256] = {};
    uint64_t target = *checked_align_up(pos_, align);
    while (pos_ < target) put_bytes(kZeros, static_cast<size_t>(std::min<uint64_t>(target - pos_, sizeof kZeros)));
  }
  uint64_t pos() const { return pos_; }

  void put_value(const Value& v) {
    switch (v.type()) {
      case ValueType::UINT8: put(*v.get_if<uint8_t>()); break;
      case ValueType::INT8: put(*v.get_if<int8_t>()); break;
      case ValueType::UINT16: put(*v.get_if<uint16_t>()); break;
      case ValueType::INT16: put(*v.get_if<int16_t>()); break;
      case ValueType::UINT32: put(*v.get_if<uint32_t>()); break;
      case ValueType::INT32: put(*v.get_if<int32_t>()); break;
      case ValueType::FLOAT32: put(*v.get_if<float>()); break;
      case ValueType::BOOL: put<uint8_t>(*v.get_if<bool>() ? 1 : 0); break;
      case ValueType::STRING: put_string(*v.get_if<std::string>()); break;
      case ValueType::UINT64: put(*v.get_if<uint64_t>()); break;
      case ValueType::INT64: put(*v.get_if<int64_t>()); break;
      case ValueType::FLOAT64: put(*v.get_if<double>()); break;
      case ValueType::ARRAY: {
        const auto& a = *v.get_if<ArrayValue>();
        put<uint32_t>(static_cast<uint32_t>(a.elem_type));
        put<uint64_t>(a.items.size());
        for (const auto& item : a.items) {
          CAR_CHECK(item.type() == a.elem_type);  // an array's items all have its element type
          put_value(item);
        }
        break;
      }
    }
  }

 private:
  const Sink& sink_;
  uint64_t pos_ = 0;
};

}  // namespace

void GgufWriter::set(std::string key, Value value) {
  for (auto& kv : kv_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kv_.push_back(KeyValue{std::move(key), std::move(value)});
}

Result<uint64_t> GgufWriter::check_tensor(const std::string& name, GgmlType type,
                                          const std::vector<uint64_t>& shape) const {
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxDims)) {
    return make_error(errc::kGgufBadDims, "tensor " + name + ": " + std::to_string(shape.size()) +
                                              " dims, expected 1.." + std::to_string(kMaxDims));
  }
  uint64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0)
      return make_error(errc::kGgufBadDims, "tensor " + name + ": dim " + std::to_string(d) + " is 0");
    auto p = checked_mul(n, shape[d]);
    if (!p || *p > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return make_error(errc::kGgufBadDims, "tensor " + name + ": element count overflows");
    }
    n = *p;
  }
  auto row = ggml_row_bytes(type, shape[0]);
  if (!row) {
    return make_error(errc::kGgufBadShape, "tensor " + name + ": row length " + std::to_string(shape[0]) +
                                               " is not a multiple of " + std::string(ggml_type_name(type)) +
                                               "'s block size " +
                                               std::to_string(ggml_traits(type).block_size));
  }
  auto want = checked_mul(*row, n / shape[0]);
  if (!want) return make_error(errc::kGgufBadDims, "tensor " + name + ": byte size overflows");
  for (const auto& t : tensors_) {
    if (t.name == name) return make_error(errc::kGgufDuplicateTensor, "duplicate tensor name '" + name + "'");
  }
  return *want;
}

Result<void> GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> shape,
                                    std::vector<uint8_t> data) {
  auto want = check_tensor(name, type, shape);
  if (!want) return want.error();
  if (*want != data.size()) {
    return make_error(errc::kGgufBadShape, "tensor " + name + ": " + std::to_string(data.size()) +
                                               " bytes of data, " + std::string(ggml_type_name(type)) +
                                               " of this shape needs " + std::to_string(*want));
  }
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(shape), *want, std::move(data), {}});
  return {};
}

Result<void> GgufWriter::add_tensor_streamed(std::string name, GgmlType type, std::vector<uint64_t> shape,
                                             TensorProducer produce) {
  CAR_CHECK(produce != nullptr);
  auto want = check_tensor(name, type, shape);
  if (!want) return want.error();
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(shape), *want, {}, std::move(produce)});
  return {};
}

namespace {

uint64_t writer_alignment(const std::vector<KeyValue>& kv) {
  for (const auto& e : kv) {
    if (e.key != "general.alignment") continue;
    const auto* a = e.value.get_if<uint32_t>();
    // The writer's caller is trusted code: a bad alignment is a programming error.
    CAR_CHECK(a != nullptr && *a != 0 && (*a & (*a - 1)) == 0);
    return *a;
  }
  return kDefaultAlignment;
}

}  // namespace

// Serialize the whole file through `sink`.
static void serialize(const std::vector<KeyValue>& kv, const auto& tensors, const Sink& sink) {
  const uint64_t align = writer_alignment(kv);
  Encoder e(sink);
  e.put<uint32_t>(kMagic);
  e.put<uint32_t>(3);
  e.put<uint64_t>(tensors.size());
  e.put<uint64_t>(kv.size());
  for (const auto& entry : kv) {
    e.put_string(entry.key);
    e.put<uint32_t>(static_cast<uint32_t>(entry.value.type()));
    e.put_value(entry.value);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    e.put_string(t.name);
    e.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (uint64_t d : t.shape) e.put<uint64_t>(d);
    e.put<uint32_t>(static_cast<uint32_t>(t.type));
    e.put<uint64_t>(offset);
    offset = *checked_align_up(offset + t.n_bytes, align);
  }
  e.pad_to(align);
  for (const auto& t : tensors) {
    if (t.produce) {
      uint64_t produced = 0;
      const GgufWriter::ByteSink out = [&](const void* data, size_t n) {
        produced += n;
        CAR_CHECK(produced <= t.n_bytes);  // a producer must not write past its tensor
        e.put_bytes(data, n);
      };
      t.produce(out);
      CAR_CHECK(produced == t.n_bytes);  // ... nor stop short of it
    } else {
      e.put_bytes(t.data.data(), t.data.size());
    }
    e.pad_to(align);
  }
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.n_bytes;
  out.reserve(total + (size_t{1} << 16));
  Sink sink = [&out](const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out.insert(out.end(), p, p + n);
  };
  serialize(kv_, tensors_, sink);
  return out;
}

Result<void> GgufWriter::write(const std::string& path) const {
  std::string tmp = path + ".tmp-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    int err = errno;
    return make_error(errc::kIoError, "create temporary file for " + path + ": " + std::strerror(err));
  }
  int write_errno = 0;
  auto write_all = [&](const uint8_t* p, size_t n) {
    while (write_errno == 0 && n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        write_errno = errno;
        break;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  // Small pieces (header fields, padding, producers' short runs) are gathered into one large write;
  // pieces of a buffer's size or more go out directly after what is pending.
  std::vector<uint8_t> buffer;
  buffer.reserve(kWriteBuffer);
  auto flush = [&] {
    write_all(buffer.data(), buffer.size());
    buffer.clear();
  };
  Sink sink = [&](const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    if (n >= kWriteBuffer) {
      flush();
      write_all(p, n);
      return;
    }
    if (buffer.size() + n > kWriteBuffer) flush();
    buffer.insert(buffer.end(), p, p + n);
  };
  serialize(kv_, tensors_, sink);
  flush();
  // mkstemp creates the file 0600; a model file is ordinary data.
  if (write_errno == 0 && ::fchmod(fd, 0644) != 0) write_errno = errno;
  if (::close(fd) != 0 && write_errno == 0) write_errno = errno;
  if (write_errno == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) write_errno = errno;
  if (write_errno != 0) {
    ::unlink(tmp.c_str());
    return make_error(errc::kIoError, "write " + path + ": " + std::strerror(write_errno));
  }
  return {};
}

}  // namespace car::gguf
