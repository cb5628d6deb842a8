// libFuzzer target: GgufFile::parse on arbitrary bytes must return a value or an Error, never crash, leak,
// hang or hit UB. For every accepted file it also checks two properties:
//   - every accessor and tensor view works on it (views stay inside the input);
//   - writing what was read with GgufWriter and reading it back gives a file that re-serializes to the same
//     bytes (a reader/writer round trip; compared as bytes so NaN floats do not break it).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"

namespace {

using car::gguf::GgufFile;
using car::gguf::GgufWriter;

std::vector<uint8_t> rewrite(const GgufFile& f) {
  GgufWriter w;
  for (const auto& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const auto& t : f.tensors()) {
    std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
    auto data = f.tensor_data(t);
    auto r = w.add_tensor(t.name, t.type, std::move(shape), std::vector<uint8_t>(data.begin(), data.end()));
    if (!r.ok()) std::abort();  // the reader accepted a tensor the writer rejects
  }
  return w.to_bytes();
}

void touch(const GgufFile& f, std::span<const uint8_t> input) {
  volatile uint64_t sink = 0;
  for (const auto& kv : f.metadata()) {
    if (f.find(kv.key) != &kv.value) std::abort();
    sink = sink + f.get_uint(kv.key).ok() + f.get_int(kv.key).ok() + f.get_float(kv.key).ok() +
           f.get_bool(kv.key).ok() + f.get_string(kv.key).ok() + f.get_array(kv.key).ok();
    if (auto d = kv.value.as_double()) sink = sink + (*d > 0);
  }
  for (const auto& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) std::abort();
    auto d = f.tensor_data(t);
    if (d.size() != t.n_bytes) std::abort();
    if (d.size() > 0 && (d.data() < input.data() || d.data() + d.size() > input.data() + input.size())) std::abort();
    if (!d.empty()) sink = sink + d[0] + d[d.size() - 1];
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> input(data, size);
  auto parsed = GgufFile::parse(input);
  if (!parsed.ok()) {
    if (parsed.error().code.empty() || parsed.error().message.empty()) std::abort();
    return 0;
  }
  touch(**parsed, input);
  const auto once = rewrite(**parsed);
  auto again = GgufFile::parse(once);
  if (!again.ok()) std::abort();  // the writer produced a file the reader rejects
  if (rewrite(**again) != once) std::abort();
  return 0;
}
