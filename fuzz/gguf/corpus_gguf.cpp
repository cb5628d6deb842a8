// corpus_gguf OUT_DIR [CONFORMANCE_DIR]: writes the seed corpus for fuzz_gguf.
//
// Seeds: small files from GgufWriter covering every value type, nested arrays, alignments and tensor
// types; for every .gguf under CONFORMANCE_DIR/{models,tokenizer}, a shrunk copy that keeps the real
// metadata keys and value types (long arrays cut to a few items) and every tensor's name, type and rank
// (each dim cut to one block), plus the file's first 4 KiB as-is. Seeds stay small so the fuzzer's -max_len
// can be tight. (Shrunk synthetic models of each architecture are checked in under fuzz/gguf/seeds/: the
// synthesizer needs car_tensor, which clang-14 does not compile.)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"

namespace fs = std::filesystem;
using namespace car;
using namespace car::gguf;

namespace {

int g_written = 0;

void save(const fs::path& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const fs::path p = dir / (name + ".gguf");
  FILE* f = std::fopen(p.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::fprintf(stderr, "corpus_gguf: cannot write %s\n", p.c_str());
    std::exit(1);
  }
  std::fclose(f);
  ++g_written;
}

Value cap_arrays(const Value& v, size_t max_items) {
  const auto* a = v.get_if<ArrayValue>();
  if (a == nullptr) return v;
  ArrayValue out;
  out.elem_type = a->elem_type;
  for (size_t i = 0; i < a->items.size() && i < max_items; ++i) out.items.push_back(cap_arrays(a->items[i], max_items));
  return Value{std::move(out)};
}

std::vector<uint8_t> shrink(const GgufFile& f) {
  GgufWriter w;
  for (const auto& kv : f.metadata()) w.set(kv.key, cap_arrays(kv.value, 8));
  for (const auto& t : f.tensors()) {
    const auto& traits = ggml_traits(t.type);
    std::vector<uint64_t> shape(t.n_dims, 1);
    shape[0] = traits.block_size;
    std::vector<uint8_t> data(traits.bytes_per_block, 0x3c);
    if (!w.add_tensor(t.name, t.type, shape, data).ok()) std::exit(1);
  }
  return w.to_bytes();
}

ArrayValue array_of(ValueType t, std::vector<Value> items) {
  ArrayValue a;
  a.elem_type = t;
  a.items = std::move(items);
  return a;
}

void synthetic_seeds(const fs::path& out) {
  {
    GgufWriter w;
    save(out, "empty", w.to_bytes());
  }
  {
    GgufWriter w;
    w.set("u8", Value{uint8_t{1}});
    w.set("i8", Value{int8_t{-1}});
    w.set("u16", Value{uint16_t{2}});
    w.set("i16", Value{int16_t{-2}});
    w.set_u32("u32", 3);
    w.set_i32("i32", -3);
    w.set_f32("f32", 0.5f);
    w.set_bool("bool", true);
    w.set_string("str", "hello");
    w.set_u64("u64", 4);
    w.set("i64", Value{int64_t{-4}});
    w.set("f64", Value{0.25});
    w.set_array("arr", array_of(ValueType::STRING, {Value{std::string("a")}, Value{std::string("bc")}}));
    ArrayValue inner = array_of(ValueType::INT32, {Value{int32_t{1}}, Value{int32_t{2}}});
    w.set_array("nested", array_of(ValueType::ARRAY, {Value{inner}, Value{inner}}));
    save(out, "all_value_types", w.to_bytes());
  }
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::I32, GgmlType::IQ4_XS, GgmlType::MXFP4};
  for (uint32_t align : {1u, 32u, 64u}) {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("general.alignment", align);
    int i = 0;
    for (GgmlType t : types) {
      const auto& tr = ggml_traits(t);
      std::vector<uint64_t> shape{tr.block_size, static_cast<uint64_t>(1 + i % 3)};
      if (i % 4 == 3) shape.push_back(2);
      const uint64_t bytes = *ggml_row_bytes(t, shape[0]) * shape[1] * (shape.size() > 2 ? shape[2] : 1);
      if (!w.add_tensor("t" + std::to_string(i), t, shape, std::vector<uint8_t>(bytes, static_cast<uint8_t>(i)))
               .ok()) {
        std::exit(1);
      }
      ++i;
    }
    save(out, "tensors_align" + std::to_string(align), w.to_bytes());
  }
}

void conformance_seeds(const fs::path& out, const fs::path& conf) {
  for (const char* sub : {"models", "tokenizer"}) {
    std::error_code ec;
    if (!fs::is_directory(conf / sub, ec)) continue;
    for (const auto& e : fs::directory_iterator(conf / sub)) {
      if (e.path().extension() != ".gguf") continue;
      const std::string stem = std::string(sub) + "_" + e.path().stem().string();
      auto f = GgufFile::open(e.path().string());
      if (!f.ok()) {
        std::fprintf(stderr, "corpus_gguf: skipping %s: %s\n", e.path().c_str(), f.error().message.c_str());
        continue;
      }
      save(out, stem + "_shrunk", shrink(**f));
      auto head = (*f)->bytes().first(std::min<size_t>((*f)->bytes().size(), 4096));
      save(out, stem + "_head", std::vector<uint8_t>(head.begin(), head.end()));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: corpus_gguf OUT_DIR [CONFORMANCE_DIR]\n");
    return 2;
  }
  const fs::path out = argv[1];
  fs::create_directories(out);
  synthetic_seeds(out);
  if (argc >= 3) conformance_seeds(out, argv[2]);
  std::printf("corpus_gguf: %d seeds in %s\n", g_written, out.c_str());
  return 0;
}
