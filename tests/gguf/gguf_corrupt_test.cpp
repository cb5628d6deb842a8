// The reader against deliberately corrupt files: an enum of corruptions, each applied to a valid file and
// expected to be rejected with its own error code, plus truncation at every byte of the header and
// random byte mutations (which must fail cleanly or parse, never crash).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "tests/test_support.h"

namespace car::gguf {
namespace {

// A low-level GGUF encoder that writes whatever it is told, so tests can produce files the writer never
// would. `Spec` describes a file; corruptions edit the spec (or the encoded bytes) before parsing.
struct RawKv {
  std::string key;
  uint32_t type;
  std::vector<uint8_t> payload;  // the encoded value, after the type id
};

struct RawTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t n_dims_override = 0;  // when non-zero, written instead of dims.size()
  uint32_t type;
  uint64_t offset;
};

struct Spec {
  uint32_t magic = kMagic;
  uint32_t version = 3;
  std::optional<uint64_t> kv_count;      // override of kvs.size()
  std::optional<uint64_t> tensor_count;  // override of tensors.size()
  std::vector<RawKv> kvs;
  std::vector<RawTensor> tensors;
  uint64_t alignment = 32;
  uint64_t data_bytes = 0;  // size of the data section (zeros)
};

struct Encoded {
  std::vector<uint8_t> bytes;
  size_t kv_begin = 0;
  size_t info_begin = 0;
  size_t info_end = 0;
  size_t data_begin = 0;
};

class Buf {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void put_string(const std::string& s, std::optional<uint64_t> len = std::nullopt) {
    put<uint64_t>(len.value_or(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> b;
};

template <typename T>
std::vector<uint8_t> enc(T v) {
  Buf b;
  b.put(v);
  return b.b;
}
std::vector<uint8_t> enc_string(const std::string& s) {
  Buf b;
  b.put_string(s);
  return b.b;
}

Encoded encode(const Spec& s) {
  Buf b;
  Encoded e;
  b.put(s.magic);
  b.put(s.version);
  b.put<uint64_t>(s.tensor_count.value_or(s.tensors.size()));
  b.put<uint64_t>(s.kv_count.value_or(s.kvs.size()));
  e.kv_begin = b.b.size();
  for (const auto& kv : s.kvs) {
    b.put_string(kv.key);
    b.put(kv.type);
    b.b.insert(b.b.end(), kv.payload.begin(), kv.payload.end());
  }
  e.info_begin = b.b.size();
  for (const auto& t : s.tensors) {
    b.put_string(t.name);
    b.put<uint32_t>(t.n_dims_override != 0 ? t.n_dims_override : static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) b.put(d);
    b.put(t.type);
    b.put(t.offset);
  }
  e.info_end = b.b.size();
  while (b.b.size() % s.alignment != 0) b.b.push_back(0);
  e.data_begin = b.b.size();
  b.b.resize(b.b.size() + s.data_bytes, 0);
  e.bytes = std::move(b.b);
  return e;
}

// A valid file: a few metadata values (incl. an array) and three F32/Q8_0 tensors.
Spec baseline() {
  Spec s;
  s.kvs.push_back({"general.architecture", 8, enc_string("llama")});
  s.kvs.push_back({"llama.block_count", 4, enc<uint32_t>(2)});
  Buf arr;
  arr.put<uint32_t>(8);  // array of strings
  arr.put<uint64_t>(3);
  arr.put_string("<unk>");
  arr.put_string("<s>");
  arr.put_string("</s>");
  s.kvs.push_back({"tokenizer.ggml.tokens", 9, arr.b});
  s.tensors.push_back({"token_embd.weight", {8, 3}, 0, 0, 0});          // F32: 96 bytes
  s.tensors.push_back({"blk.0.attn_q.weight", {32, 2}, 0, 8, 96});      // Q8_0: 68 bytes -> [96, 164)
  s.tensors.push_back({"blk.3.ffn_down_exps.weight", {4}, 0, 0, 192});  // F32: 16 bytes -> [192, 208)
  s.data_bytes = 224;
  return s;
}

enum class Corruption {
  empty_file,
  bad_magic,
  version_1,
  version_unknown,
  version_big_endian,
  kv_count_huge,
  tensor_count_huge,
  key_length_past_eof,
  string_length_past_eof,
  huge_array_count,
  huge_nested_array_count,
  unknown_value_type,
  unknown_array_elem_type,
  bad_bool,
  arrays_nested_too_deep,
  duplicate_key,
  alignment_zero,
  alignment_not_power_of_two,
  alignment_wrong_type,
  n_dims_zero,
  n_dims_five,
  zero_dim,
  dim_above_int64,
  dims_product_overflow,
  unknown_type_retired,
  unknown_type_large,
  row_not_block_multiple,
  tensor_name_past_eof,
  duplicate_tensor,
  misaligned_offset,
  offset_past_eof,
  offset_overflow,
  data_past_eof,
  overlapping_tensors,
  tensor_size_overflow,
};

struct Case {
  Corruption c;
  const char* name;
  const char* code;
  const char* message_part;  // a piece the message must contain
};

const Case kCases[] = {
    {Corruption::empty_file, "empty_file", errc::kGgufTruncated, "magic"},
    {Corruption::bad_magic, "bad_magic", errc::kGgufBadMagic, "GGUF"},
    {Corruption::version_1, "version_1", errc::kGgufBadVersion, "version 1"},
    {Corruption::version_unknown, "version_unknown", errc::kGgufBadVersion, "version 7"},
    {Corruption::version_big_endian, "version_big_endian", errc::kGgufBadVersion, "big-endian"},
    {Corruption::kv_count_huge, "kv_count_huge", errc::kGgufTooLarge, "kv_count"},
    {Corruption::tensor_count_huge, "tensor_count_huge", errc::kGgufTooLarge, "tensor_count"},
    {Corruption::key_length_past_eof, "key_length_past_eof", errc::kGgufTruncated, "metadata[0] key"},
    {Corruption::string_length_past_eof, "string_length_past_eof", errc::kGgufTruncated,
     "general.architecture"},
    {Corruption::huge_array_count, "huge_array_count", errc::kGgufTooLarge, "tokenizer.ggml.tokens"},
    {Corruption::huge_nested_array_count, "huge_nested_array_count", errc::kGgufTooLarge, "'nested'[0]"},
    {Corruption::unknown_value_type, "unknown_value_type", errc::kGgufBadValueType, "value type 13"},
    {Corruption::unknown_array_elem_type, "unknown_array_elem_type", errc::kGgufBadValueType,
     "element type 99"},
    {Corruption::bad_bool, "bad_bool", errc::kGgufBadValueType, "bool value 2"},
    {Corruption::arrays_nested_too_deep, "arrays_nested_too_deep", errc::kGgufBadValueType, "nested deeper"},
    {Corruption::duplicate_key, "duplicate_key", errc::kGgufDuplicateKey, "llama.block_count"},
    {Corruption::alignment_zero, "alignment_zero", errc::kGgufBadAlignment, "general.alignment 0"},
    {Corruption::alignment_not_power_of_two, "alignment_not_power_of_two", errc::kGgufBadAlignment, "48"},
    {Corruption::alignment_wrong_type, "alignment_wrong_type", errc::kGgufBadAlignment, "uint64"},
    {Corruption::n_dims_zero, "n_dims_zero", errc::kGgufBadDims, "n_dims 0"},
    {Corruption::n_dims_five, "n_dims_five", errc::kGgufBadDims, "n_dims 5"},
    {Corruption::zero_dim, "zero_dim", errc::kGgufBadDims, "ne[1] is 0"},
    {Corruption::dim_above_int64, "dim_above_int64", errc::kGgufBadDims, "2^63"},
    {Corruption::dims_product_overflow, "dims_product_overflow", errc::kGgufBadDims, "overflows"},
    {Corruption::unknown_type_retired, "unknown_type_retired", errc::kGgufUnknownType, "type id 4"},
    {Corruption::unknown_type_large, "unknown_type_large", errc::kGgufUnknownType, "type id 1000"},
    {Corruption::row_not_block_multiple, "row_not_block_multiple", errc::kGgufBadShape, "block size 32"},
    {Corruption::tensor_name_past_eof, "tensor_name_past_eof", errc::kGgufTruncated, "tensor_info[1] name"},
    {Corruption::duplicate_tensor, "duplicate_tensor", errc::kGgufDuplicateTensor, "token_embd.weight"},
    {Corruption::misaligned_offset, "misaligned_offset", errc::kGgufMisaligned, "100"},
    {Corruption::offset_past_eof, "offset_past_eof", errc::kGgufOutOfBounds,
     "blk.3.ffn_down_exps.weight: data"},
    {Corruption::offset_overflow, "offset_overflow", errc::kGgufOutOfBounds, "past end of file"},
    {Corruption::data_past_eof, "data_past_eof", errc::kGgufOutOfBounds, "past end of file"},
    {Corruption::overlapping_tensors, "overlapping_tensors", errc::kGgufOverlap, "overlaps"},
    {Corruption::tensor_size_overflow, "tensor_size_overflow", errc::kGgufBadDims, "overflows"},
};

std::vector<uint8_t> make_corrupt(Corruption c) {
  Spec s = baseline();
  switch (c) {
    case Corruption::empty_file: return {};
    case Corruption::bad_magic: s.magic = 0x46554746; break;  // "FGUF"
    case Corruption::version_1: s.version = 1; break;
    case Corruption::version_unknown: s.version = 7; break;
    case Corruption::version_big_endian: s.version = 0x03000000; break;
    case Corruption::kv_count_huge: s.kv_count = uint64_t{1} << 62; break;
    case Corruption::tensor_count_huge: s.tensor_count = ~uint64_t{0}; break;
    case Corruption::key_length_past_eof: {
      auto e = encode(s);
      const uint64_t huge = 1ull << 40;
      std::memcpy(e.bytes.data() + e.kv_begin, &huge, 8);
      return e.bytes;
    }
    case Corruption::string_length_past_eof: {
      Buf b;
      b.put<uint64_t>(5000000);
      b.b.insert(b.b.end(), {'l', 'l'});
      s.kvs[0].payload = b.b;
      break;
    }
    case Corruption::huge_array_count: {
      Buf b;
      b.put<uint32_t>(8);
      b.put<uint64_t>(uint64_t{1} << 61);
      s.kvs[2].payload = b.b;
      break;
    }
    case Corruption::huge_nested_array_count: {
      Buf b;
      b.put<uint32_t>(9);  // array of arrays
      b.put<uint64_t>(1);
      b.put<uint32_t>(0);  // inner: u8, count 2^50
      b.put<uint64_t>(uint64_t{1} << 50);
      s.kvs.push_back({"nested", 9, b.b});
      break;
    }
    case Corruption::unknown_value_type: s.kvs[1].type = 13; break;
    case Corruption::unknown_array_elem_type: {
      Buf b;
      b.put<uint32_t>(99);
      b.put<uint64_t>(0);
      s.kvs[2].payload = b.b;
      break;
    }
    case Corruption::bad_bool: s.kvs.push_back({"flag", 7, {2}}); break;
    case Corruption::arrays_nested_too_deep: {
      // 40 levels of single-element arrays around an empty u8 array.
      Buf inner;
      inner.put<uint32_t>(0);
      inner.put<uint64_t>(0);
      std::vector<uint8_t> payload = inner.b;
      for (int i = 0; i < 40; ++i) {
        Buf b;
        b.put<uint32_t>(9);
        b.put<uint64_t>(1);
        b.b.insert(b.b.end(), payload.begin(), payload.end());
        payload = b.b;
      }
      s.kvs.push_back({"deep", 9, payload});
      break;
    }
    case Corruption::duplicate_key: s.kvs.push_back({"llama.block_count", 4, enc<uint32_t>(3)}); break;
    case Corruption::alignment_zero: s.kvs.push_back({"general.alignment", 4, enc<uint32_t>(0)}); break;
    case Corruption::alignment_not_power_of_two:
      s.kvs.push_back({"general.alignment", 4, enc<uint32_t>(48)});
      break;
    case Corruption::alignment_wrong_type: s.kvs.push_back({"general.alignment", 10, enc<uint64_t>(32)}); break;
    case Corruption::n_dims_zero:
      s.tensors[0].dims = {};
      break;
    case Corruption::n_dims_five: s.tensors[0].dims = {8, 3, 1, 1, 1}; break;
    case Corruption::zero_dim: s.tensors[0].dims = {8, 0}; break;
    case Corruption::dim_above_int64: s.tensors[0].dims = {8, uint64_t{1} << 63}; break;
    case Corruption::dims_product_overflow: s.tensors[0].dims = {1ull << 32, 1ull << 31, 4}; break;
    case Corruption::unknown_type_retired: s.tensors[0].type = 4; break;
    case Corruption::unknown_type_large: s.tensors[0].type = 1000; break;
    case Corruption::row_not_block_multiple: s.tensors[1].dims = {48, 2}; break;
    case Corruption::tensor_name_past_eof: {
      auto e = encode(s);
      // tensor_info[1] starts after tensor_info[0]: name (8 + 17), n_dims 4, 2 dims 16, type 4, offset 8.
      const size_t at = e.info_begin + 8 + 17 + 4 + 16 + 4 + 8;
      const uint64_t huge = 1ull << 33;
      std::memcpy(e.bytes.data() + at, &huge, 8);
      return e.bytes;
    }
    case Corruption::duplicate_tensor: s.tensors[2].name = "token_embd.weight"; break;
    case Corruption::misaligned_offset: s.tensors[2].offset = 100; break;
    case Corruption::offset_past_eof: s.tensors[2].offset = 1 << 20; break;
    case Corruption::offset_overflow: s.tensors[2].offset = ~uint64_t{31}; break;
    case Corruption::data_past_eof: s.data_bytes = 200; break;  // last tensor needs [192, 208)
    case Corruption::overlapping_tensors: s.tensors[1].offset = 64; break;  // [64, 132) vs [0, 96)
    case Corruption::tensor_size_overflow: s.tensors[0].dims = {1ull << 40, 1ull << 22}; break;  // * 4 bytes
  }
  return encode(s).bytes;
}

TEST(GgufCorrupt, BaselineIsValid) {
  const auto bytes = encode(baseline()).bytes;
  auto g = GgufFile::parse(bytes);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ((*g)->tensors().size(), 3u);
  EXPECT_EQ((*g)->metadata().size(), 3u);
}

class GgufCorruptCase : public ::testing::TestWithParam<Case> {};

TEST_P(GgufCorruptCase, RejectedWithTheRightCode) {
  const Case& c = GetParam();
  const auto bytes = make_corrupt(c.c);
  auto g = GgufFile::parse(bytes);
  ASSERT_FALSE(g.ok()) << c.name << " was accepted";
  EXPECT_EQ(g.error().code, c.code) << g.error().message;
  EXPECT_NE(g.error().message.find(c.message_part), std::string::npos)
      << "message \"" << g.error().message << "\" lacks \"" << c.message_part << "\"";
}

INSTANTIATE_TEST_SUITE_P(All, GgufCorruptCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(GgufCorrupt, EveryCorruptionHasACase) {
  // The enum and the table stay in step: the last enumerator's value + 1 cases.
  EXPECT_EQ(std::size(kCases), static_cast<size_t>(Corruption::tensor_size_overflow) + 1);
  for (size_t i = 0; i < std::size(kCases); ++i) EXPECT_EQ(static_cast<size_t>(kCases[i].c), i);
}

// Cutting the file anywhere before its end: inside the fixed header the error is `truncated`; inside the
// metadata and tensor infos it is `truncated`, or `too_large` when a count (kv_count, tensor_count, an
// array's count) no longer fits in what is left; once the infos are complete but the data is not, it is
// `out_of_bounds`.
TEST(GgufCorrupt, TruncatedAtEveryLength) {
  const Spec spec = baseline();
  const Encoded e = encode(spec);
  const size_t header = 24;
  size_t n_truncated = 0;
  size_t n_too_large = 0;
  const size_t data_end = e.data_begin + 208;  // end of the last tensor's data; the rest is padding
  ASSERT_LE(data_end, e.bytes.size());
  for (size_t cut = 0; cut < data_end; ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(e.bytes.size()));
    std::vector<uint8_t> part(e.bytes.begin(), e.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    auto g = GgufFile::parse(part);
    ASSERT_FALSE(g.ok());
    const std::string& code = g.error().code;
    if (cut < header) {
      EXPECT_EQ(code, errc::kGgufTruncated) << g.error().message;
    } else if (cut < e.info_end) {
      const uint64_t left = cut - header;
      if (spec.kvs.size() * 13 > left || spec.tensors.size() * 32 > left) {
        EXPECT_EQ(code, errc::kGgufTooLarge) << g.error().message;
      } else {
        EXPECT_TRUE(code == errc::kGgufTruncated || code == errc::kGgufTooLarge)
            << code << ": " << g.error().message;
      }
      n_truncated += code == errc::kGgufTruncated;
      n_too_large += code == errc::kGgufTooLarge;
    } else {
      EXPECT_EQ(code, errc::kGgufOutOfBounds) << g.error().message;
    }
  }
  EXPECT_GT(n_truncated, 0u);
  EXPECT_GT(n_too_large, 0u);
}

// A file with no tensors needs no data section, so it may end right after the metadata.
TEST(GgufCorrupt, NoTensorsNeedsNoPadding) {
  Spec s = baseline();
  s.tensors.clear();
  s.data_bytes = 0;
  Encoded e = encode(s);
  e.bytes.resize(e.info_end);
  auto g = GgufFile::parse(e.bytes);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE((*g)->tensors().empty());
}

TEST(GgufCorrupt, VersionTwoAccepted) {
  Spec s = baseline();
  s.version = 2;
  const auto bytes = encode(s).bytes;
  auto g = GgufFile::parse(bytes);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ((*g)->version(), 2u);
}

// Random byte flips of a valid file (header region mostly): every result is a clean accept or reject.
// Under ASan/UBSan this doubles as a small deterministic fuzz run.
TEST(GgufCorrupt, RandomMutationsNeverCrash) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("general.alignment", 32);
  ArrayValue a;
  a.elem_type = ValueType::INT32;
  for (int i = 0; i < 5; ++i) a.items.push_back(Value{int32_t{i}});
  w.set_array("arr", a);
  ASSERT_TRUE(w.add_tensor("t0", GgmlType::F32, {4, 2}, std::vector<uint8_t>(32, 1)).ok());
  ASSERT_TRUE(w.add_tensor("t1", GgmlType::Q8_0, {32}, std::vector<uint8_t>(34, 2)).ok());
  const auto base = w.to_bytes();
  std::mt19937 rng(12345);
  size_t accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    auto m = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t pos = rng() % std::min<size_t>(m.size(), 256);
      m[pos] = static_cast<uint8_t>(rng());
    }
    if (rng() % 8 == 0) m.resize(rng() % m.size());
    auto g = GgufFile::parse(m);
    if (g.ok()) {
      ++accepted;
      for (const auto& t : (*g)->tensors()) {
        auto d = (*g)->tensor_data(t);
        EXPECT_LE(d.data() + d.size(), m.data() + m.size());
      }
    } else {
      EXPECT_FALSE(g.error().code.empty());
      EXPECT_FALSE(g.error().message.empty());
    }
  }
  EXPECT_GT(accepted, 0u);  // some flips land in harmless bytes
}

TEST(GgufOpen, MissingFileAndDirectory) {
  car::testing::TempDir dir;
  auto missing = GgufFile::open((dir / "nope.gguf").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "not_found");
  auto d = GgufFile::open(dir.path().string());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, "io_error");
}

TEST(GgufOpen, ErrorsNameThePath) {
  car::testing::TempDir dir;
  const auto path = (dir / "bad.gguf").string();
  const auto bytes = make_corrupt(Corruption::offset_past_eof);
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  auto g = GgufFile::open(path);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code, errc::kGgufOutOfBounds);
  EXPECT_EQ(g.error().message.rfind(path, 0), 0u) << g.error().message;
  EXPECT_NE(g.error().message.find("(size " + std::to_string(bytes.size()) + ")"), std::string::npos)
      << g.error().message;
}

}  // namespace
}  // namespace car::gguf
