// What the Model::load tests share: rewriting a GGUF file with a tensor or key dropped and the metadata
// edited (to make each load_failed case from a good file), loading a file, and checking a load error.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/model.h"

namespace car::testing {

/// Copy the GGUF file at `path` to `path`.edited.gguf without tensor `drop_tensor` and key `drop_key` (empty:
/// none), then apply `edit` to the writer; returns the new path.
inline std::string rewrite_gguf(const std::string& path, const std::string& drop_tensor = {},
                                const std::string& drop_key = {},
                                const std::function<void(gguf::GgufWriter&)>& edit = {}) {
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return path;
  gguf::GgufWriter w;
  for (const auto& kv : (*f)->metadata()) {
    if (kv.key != drop_key) w.set(kv.key, kv.value);
  }
  for (const auto& t : (*f)->tensors()) {
    if (t.name == drop_tensor) continue;
    auto bytes = (*f)->tensor_data(t);
    std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
    EXPECT_TRUE(w.add_tensor(t.name, t.type, shape, std::vector<uint8_t>(bytes.begin(), bytes.end())).ok());
  }
  if (edit) edit(w);
  const std::string out = path + ".edited.gguf";
  EXPECT_TRUE(w.write(out).ok()) << out;
  return out;
}

/// Model::load of the file at `path`.
inline Result<std::shared_ptr<const model::Model>> load_model_file(const std::string& path) {
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return f.error();
  return model::Model::load(*f);
}

/// `r` failed with load_failed and a message naming `needle`.
inline void expect_load_error(const Result<std::shared_ptr<const model::Model>>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << "expected an error naming " << needle;
  EXPECT_EQ(r.error().code, "load_failed");
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
}

}  // namespace car::testing
