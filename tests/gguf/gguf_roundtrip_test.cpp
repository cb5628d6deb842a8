// Writer -> reader round trips: every value type, nested arrays, tensors of several types, alignment.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "tests/test_support.h"

namespace car::gguf {
namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// The value of `key` if present with exactly type T.
template <typename T>
std::optional<T> scalar(const GgufFile& f, std::string_view key) {
  const Value* v = f.find(key);
  if (v == nullptr || v->get_if<T>() == nullptr) return std::nullopt;
  return *v->get_if<T>();
}

ArrayValue array_of(ValueType t, std::vector<Value> items) {
  ArrayValue a;
  a.elem_type = t;
  a.items = std::move(items);
  return a;
}

TEST(GgufRoundTrip, EveryValueType) {
  GgufWriter w;
  w.set("u8", Value{uint8_t{200}});
  w.set("i8", Value{int8_t{-100}});
  w.set("u16", Value{uint16_t{65000}});
  w.set("i16", Value{int16_t{-32000}});
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set_f32("f32", 1.5f);
  w.set_bool("bool_t", true);
  w.set_bool("bool_f", false);
  w.set_string("str", std::string("h\xc3\xa9llo\0world", 12));
  w.set_string("empty", "");
  w.set_u64("u64", std::numeric_limits<uint64_t>::max());
  w.set("i64", Value{std::numeric_limits<int64_t>::min()});
  w.set("f64", Value{3.141592653589793});
  w.set_array("arr_i32", array_of(ValueType::INT32, {Value{int32_t{1}}, Value{int32_t{-2}}, Value{int32_t{3}}}));
  w.set_array("arr_str", array_of(ValueType::STRING, {Value{std::string("a")}, Value{std::string("")}}));
  w.set_array("arr_empty", array_of(ValueType::FLOAT32, {}));
  ArrayValue inner1 = array_of(ValueType::UINT8, {Value{uint8_t{1}}, Value{uint8_t{2}}});
  ArrayValue inner2 = array_of(ValueType::UINT8, {});
  ArrayValue nested = array_of(ValueType::ARRAY, {Value{inner1}, Value{inner2}});
  w.set_array("nested", array_of(ValueType::ARRAY, {Value{nested}}));

  const auto bytes = w.to_bytes();
  auto g = GgufFile::parse(bytes);
  ASSERT_TRUE(g.ok()) << g.error().message;
  const GgufFile& f = **g;
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(f.metadata()[0].key, "u8");  // file order kept
  EXPECT_EQ(scalar<uint8_t>(f, "u8"), 200);
  EXPECT_EQ(scalar<int8_t>(f, "i8"), -100);
  EXPECT_EQ(scalar<uint16_t>(f, "u16"), 65000);
  EXPECT_EQ(scalar<int16_t>(f, "i16"), -32000);
  EXPECT_EQ(f.get_uint("u32").value(), 4000000000u);
  EXPECT_EQ(f.get_int("i32").value(), -2000000000);
  EXPECT_EQ(f.get_float("f32").value(), 1.5);
  EXPECT_TRUE(f.get_bool("bool_t").value());
  EXPECT_FALSE(f.get_bool("bool_f").value());
  EXPECT_EQ(f.get_string("str").value(), std::string("h\xc3\xa9llo\0world", 12));
  EXPECT_EQ(f.get_string("empty").value(), "");
  EXPECT_EQ(f.get_uint("u64").value(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_int("i64").value(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("f64").value(), 3.141592653589793);
  for (const auto& kv : f.metadata()) EXPECT_EQ(static_cast<int>(kv.value.type()), kv.value.v.index());

  auto a = f.get_array("arr_i32", ValueType::INT32);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ((*a)->items.size(), 3u);
  EXPECT_EQ((*a)->items[1].as_int(), -2);
  auto s = f.get_array("arr_str", ValueType::STRING);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->items[0].v, Value::Storage{std::string("a")});
  EXPECT_EQ((*s)->items[1].v, Value::Storage{std::string()});
  auto e = f.get_array("arr_empty", ValueType::FLOAT32);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE((*e)->items.empty());

  auto n = f.get_array("nested", ValueType::ARRAY);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ((*n)->items.size(), 1u);
  const auto* lvl1 = (*n)->items[0].get_if<ArrayValue>();
  ASSERT_NE(lvl1, nullptr);
  ASSERT_EQ(lvl1->elem_type, ValueType::ARRAY);
  ASSERT_EQ(lvl1->items.size(), 2u);
  const auto* lvl2 = lvl1->items[0].get_if<ArrayValue>();
  ASSERT_NE(lvl2, nullptr);
  EXPECT_EQ(lvl2->elem_type, ValueType::UINT8);
  ASSERT_EQ(lvl2->items.size(), 2u);
  EXPECT_EQ(lvl2->items[1].as_int(), 2);
  const auto* empty_inner = lvl1->items[1].get_if<ArrayValue>();
  ASSERT_NE(empty_inner, nullptr);
  EXPECT_TRUE(empty_inner->items.empty());

  // Writing the parsed metadata back gives the same bytes.
  GgufWriter again;
  for (const auto& kv : f.metadata()) again.set(kv.key, kv.value);
  EXPECT_EQ(again.to_bytes(), bytes);
}

TEST(GgufRoundTrip, SetReplacesInPlace) {
  GgufWriter w;
  w.set_u32("a", 1);
  w.set_u32("b", 2);
  w.set_string("a", "x");
  const auto bytes = w.to_bytes();  // must outlive the parsed view
  auto g = GgufFile::parse(bytes);
  ASSERT_TRUE(g.ok());
  ASSERT_EQ((*g)->metadata().size(), 2u);
  EXPECT_EQ((*g)->metadata()[0].key, "a");
  EXPECT_EQ((*g)->get_string("a").value(), "x");
}

TEST(GgufRoundTrip, TensorsAndDefaultAlignment) {
  GgufWriter w;
  w.set_string("general.architecture", "test");
  const auto t0 = pattern(4 * 3, 1);            // F32 [3]
  const auto t1 = pattern(34 * 2 * 5, 2);       // Q8_0 [64, 5]
  const auto t2 = pattern(144 * 1 * 2 * 3, 3);  // Q4_K [256, 2, 3]
  const auto t3 = pattern(2 * 2 * 2 * 2 * 2, 4);  // F16 [2, 2, 2, 2]
  ASSERT_TRUE(w.add_tensor("a", GgmlType::F32, {3}, t0).ok());
  ASSERT_TRUE(w.add_tensor("b", GgmlType::Q8_0, {64, 5}, t1).ok());
  ASSERT_TRUE(w.add_tensor("c", GgmlType::Q4_K, {256, 2, 3}, t2).ok());
  ASSERT_TRUE(w.add_tensor("d", GgmlType::F16, {2, 2, 2, 2}, t3).ok());
  const auto bytes = w.to_bytes();
  auto g = GgufFile::parse(bytes);
  ASSERT_TRUE(g.ok()) << g.error().message;
  const GgufFile& f = **g;
  EXPECT_EQ(f.alignment(), kDefaultAlignment);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.file_size() % 32, 0u);  // padded after the last tensor too
  ASSERT_EQ(f.tensors().size(), 4u);
  const std::vector<std::vector<uint8_t>> data{t0, t1, t2, t3};
  for (size_t i = 0; i < 4; ++i) {
    const auto& t = f.tensors()[i];
    EXPECT_EQ(t.offset % 32, 0u);
    auto view = f.tensor_data(t);
    ASSERT_EQ(view.size(), data[i].size());
    EXPECT_EQ(0, std::memcmp(view.data(), data[i].data(), view.size()));
  }
  const TensorInfo* c = f.find_tensor("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->type, GgmlType::Q4_K);
  EXPECT_EQ(c->n_dims, 3u);
  EXPECT_EQ(c->ne[0], 256u);
  EXPECT_EQ(c->ne[1], 2u);
  EXPECT_EQ(c->ne[2], 3u);
  EXPECT_EQ(c->ne[3], 1u);
  EXPECT_EQ(c->n_elements, 256u * 6);
  EXPECT_EQ(c->rows(), 6u);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST(GgufRoundTrip, CustomAlignment) {
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(align);
    GgufWriter w;
    w.set_u32("general.alignment", align);
    ASSERT_TRUE(w.add_tensor("x", GgmlType::I8, {3}, pattern(3, 9)).ok());
    ASSERT_TRUE(w.add_tensor("y", GgmlType::I8, {5}, pattern(5, 10)).ok());
    const auto bytes = w.to_bytes();  // must outlive the parsed view
    auto g = GgufFile::parse(bytes);
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ((*g)->alignment(), align);
    EXPECT_EQ((*g)->data_offset() % align, 0u);
    EXPECT_EQ((*g)->find_tensor("y")->offset % align, 0u);
    EXPECT_EQ((*g)->tensor_data(*(*g)->find_tensor("y"))[0], 10);
  }
}

TEST(GgufRoundTrip, WriteToFileAndOpen) {
  car::testing::TempDir dir;
  GgufWriter w;
  w.set_string("general.name", "file");
  ASSERT_TRUE(w.add_tensor("w", GgmlType::F32, {4, 2}, pattern(32, 5)).ok());
  const auto path = (dir / "m.gguf").string();
  ASSERT_TRUE(w.write(path).ok());
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ((*g)->path(), path);
  EXPECT_GE((*g)->fd(), 0);
  EXPECT_EQ((*g)->get_string("general.name").value(), "file");
  EXPECT_EQ((*g)->tensor_file_offset(*(*g)->find_tensor("w")), (*g)->data_offset());
  // No temporary files are left behind.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);
  EXPECT_FALSE(w.write((dir / "missing-dir" / "m.gguf").string()).ok());
}

TEST(GgufWriter, RejectsBadTensors) {
  GgufWriter w;
  EXPECT_EQ(w.add_tensor("a", GgmlType::F32, {}, {}).error().code, errc::kGgufBadDims);
  EXPECT_EQ(w.add_tensor("a", GgmlType::F32, {1, 1, 1, 1, 1}, pattern(4, 0)).error().code,
            errc::kGgufBadDims);
  EXPECT_EQ(w.add_tensor("a", GgmlType::F32, {0}, {}).error().code, errc::kGgufBadDims);
  EXPECT_EQ(w.add_tensor("a", GgmlType::Q4_K, {100}, pattern(144, 0)).error().code, errc::kGgufBadShape);
  EXPECT_EQ(w.add_tensor("a", GgmlType::F32, {2}, pattern(4, 0)).error().code, errc::kGgufBadShape);
  ASSERT_TRUE(w.add_tensor("a", GgmlType::F32, {1}, pattern(4, 0)).ok());
  EXPECT_EQ(w.add_tensor("a", GgmlType::F32, {1}, pattern(4, 0)).error().code, errc::kGgufDuplicateTensor);
}

// Streamed tensors: the producer's pieces (of any size) land in order, at the offsets the header
// announced, and the file is the same as with the data given up front; producers run once per
// serialization, in tensor order.
TEST(GgufWriter, StreamedTensorsEqualTensorsGivenUpFront) {
  car::testing::TempDir dir;
  const auto a = pattern(4 * 7, 1);        // F32 [7]
  const auto b = pattern(144 * 2 * 3, 2);  // Q4_K [256, 2, 3]
  const auto c = pattern(5, 3);            // I8 [5]
  GgufWriter up_front;
  GgufWriter streamed;
  for (GgufWriter* w : {&up_front, &streamed}) {
    w->set_string("general.name", "s");
    w->set_u32("general.alignment", 64);
  }
  ASSERT_TRUE(up_front.add_tensor("a", GgmlType::F32, {7}, a).ok());
  ASSERT_TRUE(up_front.add_tensor("b", GgmlType::Q4_K, {256, 2, 3}, b).ok());
  ASSERT_TRUE(up_front.add_tensor("c", GgmlType::I8, {5}, c).ok());
  std::vector<std::string> calls;
  // Pieces of 1, 2, 3, ... bytes, then whatever is left.
  auto piecewise = [&calls](std::string name, std::vector<uint8_t> data) {
    return [&calls, name, data](const GgufWriter::ByteSink& out) {
      calls.push_back(name);
      size_t at = 0;
      for (size_t n = 1; at < data.size(); ++n) {
        const size_t k = std::min(n, data.size() - at);
        out(data.data() + at, k);
        at += k;
      }
    };
  };
  ASSERT_TRUE(streamed.add_tensor_streamed("a", GgmlType::F32, {7}, piecewise("a", a)).ok());
  ASSERT_TRUE(streamed.add_tensor_streamed("b", GgmlType::Q4_K, {256, 2, 3}, piecewise("b", b)).ok());
  ASSERT_TRUE(streamed.add_tensor("c", GgmlType::I8, {5}, c).ok());  // the two kinds mix
  EXPECT_TRUE(calls.empty());  // nothing is produced before serialization
  const auto want = up_front.to_bytes();
  EXPECT_EQ(streamed.to_bytes(), want);
  EXPECT_EQ(calls, (std::vector<std::string>{"a", "b"}));
  const auto path = (dir / "s.gguf").string();
  ASSERT_TRUE(streamed.write(path).ok());
  EXPECT_EQ(calls, (std::vector<std::string>{"a", "b", "a", "b"}));
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, want);
  auto g = GgufFile::parse(want);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto view = (*g)->tensor_data(*(*g)->find_tensor("b"));
  ASSERT_EQ(view.size(), b.size());
  EXPECT_EQ(0, std::memcmp(view.data(), b.data(), b.size()));
}

// write() with pieces larger and smaller than its buffer, crossing it: the file is the bytes in order.
TEST(GgufWriter, StreamedPiecesAroundTheWriteBuffer) {
  car::testing::TempDir dir;
  const size_t big = GgufWriter::kWriteBuffer + 4096 + 3;
  const auto data = pattern(3 * big, 7);
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor_streamed("x", GgmlType::I8, {data.size()}, [&](const GgufWriter::ByteSink& out) {
                 out(data.data(), 100);        // small: buffered
                 out(data.data() + 100, big);  // large: direct, after the pending
                 out(data.data() + 100 + big, GgufWriter::kWriteBuffer - 1);  // fills the buffer up
                 const size_t at = 100 + big + GgufWriter::kWriteBuffer - 1;
                 out(data.data() + at, data.size() - at);
               }).ok());
  const auto path = (dir / "big.gguf").string();
  ASSERT_TRUE(w.write(path).ok());
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto view = (*g)->tensor_data(*(*g)->find_tensor("x"));
  ASSERT_EQ(view.size(), data.size());
  EXPECT_EQ(0, std::memcmp(view.data(), data.data(), data.size()));
}

TEST(GgufWriter, StreamedTensorChecks) {
  GgufWriter w;
  auto nothing = [](const GgufWriter::ByteSink&) {};
  EXPECT_EQ(w.add_tensor_streamed("a", GgmlType::F32, {}, nothing).error().code, errc::kGgufBadDims);
  EXPECT_EQ(w.add_tensor_streamed("a", GgmlType::Q4_K, {100}, nothing).error().code, errc::kGgufBadShape);
  ASSERT_TRUE(w.add_tensor_streamed("a", GgmlType::F32, {2}, nothing).ok());
  EXPECT_EQ(w.add_tensor("a", GgmlType::F32, {1}, pattern(4, 0)).error().code, errc::kGgufDuplicateTensor);
  // A producer that writes too little (or too much) is a programming error: serialization aborts.
  EXPECT_DEATH((void)w.to_bytes(), "");
  GgufWriter over;
  ASSERT_TRUE(over.add_tensor_streamed("o", GgmlType::I8, {2},
                                       [](const GgufWriter::ByteSink& out) {
                                         const uint8_t three[3] = {1, 2, 3};
                                         out(three, 3);
                                       })
                  .ok());
  EXPECT_DEATH((void)over.to_bytes(), "");
}

TEST(GgufAccessors, ReportKeyAndTypes) {
  GgufWriter w;
  w.set_string("s", "x");
  w.set_i32("neg", -5);
  w.set_u32("u", 7);
  w.set_u64("big", std::numeric_limits<uint64_t>::max());
  w.set_array("arr", array_of(ValueType::INT32, {}));
  const auto bytes = w.to_bytes();  // must outlive the parsed view
  auto g = GgufFile::parse(bytes);
  ASSERT_TRUE(g.ok());
  const GgufFile& f = **g;
  auto r = f.get_uint("s");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, errc::kGgufTypeMismatch);
  EXPECT_NE(r.error().message.find("'s'"), std::string::npos);
  EXPECT_NE(r.error().message.find("string"), std::string::npos);
  EXPECT_NE(r.error().message.find("unsigned integer"), std::string::npos);
  EXPECT_EQ(f.get_uint("neg").error().code, errc::kGgufTypeMismatch);
  EXPECT_EQ(f.get_int("neg").value(), -5);
  EXPECT_EQ(f.get_int("u").value(), 7);
  EXPECT_EQ(f.get_int("big").error().code, errc::kGgufTypeMismatch);
  EXPECT_EQ(f.get_float("u").error().code, errc::kGgufTypeMismatch);
  EXPECT_EQ(f.get_bool("u").error().code, errc::kGgufTypeMismatch);
  EXPECT_EQ(f.get_string("u").error().code, errc::kGgufTypeMismatch);
  auto m = f.get_string("absent");
  EXPECT_EQ(m.error().code, errc::kGgufMissingKey);
  EXPECT_NE(m.error().message.find("absent"), std::string::npos);
  auto at = f.get_array("arr", ValueType::STRING);
  EXPECT_EQ(at.error().code, errc::kGgufTypeMismatch);
  EXPECT_NE(at.error().message.find("array[int32]"), std::string::npos);
  EXPECT_NE(at.error().message.find("array[string]"), std::string::npos);
  EXPECT_TRUE(f.get_array("arr").ok());
  EXPECT_EQ(f.get_uint_or("absent", 9).value(), 9u);
  EXPECT_EQ(f.get_uint_or("u", 9).value(), 7u);
  EXPECT_EQ(f.get_uint_or("s", 9).error().code, errc::kGgufTypeMismatch);
  EXPECT_EQ(f.get_float_or("absent", 0.5).value(), 0.5);
  EXPECT_TRUE(f.get_bool_or("absent", true).value());
  EXPECT_EQ(f.get_string_or("absent", "d").value(), "d");
  EXPECT_EQ(f.get_string_or("s", "d").value(), "x");
  EXPECT_EQ(f.find("u")->as_int(), 7);
  EXPECT_EQ(f.find("big")->as_int(), std::nullopt);
  EXPECT_EQ(f.find("s")->as_double(), std::nullopt);
}

}  // namespace
}  // namespace car::gguf
