// The fixture of the Model::load suites that run on files `car gguf synth` writes (qwen2, gemma3, gpt-oss,
// ...): write a spec into the test's temporary directory, optionally rewritten with a tensor or key dropped
// and the metadata edited (load_test_support.h), load it, and read a tensor's stored values back.
// A separate header from load_test_support.h because it needs car_synth.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/synth/synth_model.h"
#include "tests/model/load_test_support.h"
#include "tests/test_support.h"

namespace car::testing {

class SynthLoadTest : public ::testing::Test {
 protected:
  /// Write `spec` with synth; when `drop_tensor`, `drop_key` or `edit` is given, a rewritten copy without
  /// that tensor / key and with `edit` applied. Returns the path.
  std::string write(const synth::SynthSpec& spec, const std::string& drop_tensor = {},
                    const std::string& drop_key = {}, const std::function<void(gguf::GgufWriter&)>& edit = {}) {
    const std::string p = (dir_ / ("m" + std::to_string(n_++) + ".gguf")).string();
    auto ok = synth::write_synth_model(spec, p);
    EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
    if (drop_tensor.empty() && drop_key.empty() && !edit) return p;
    return rewrite_gguf(p, drop_tensor, drop_key, edit);
  }
  /// `write` with the float key `key` set to `value`.
  std::string write_with_f32(const synth::SynthSpec& spec, const std::string& key, float value) {
    return write(spec, {}, {}, [&](gguf::GgufWriter& w) { w.set_f32(key, value); });
  }
  Result<std::shared_ptr<const model::Model>> load(const std::string& path) { return load_model_file(path); }

  TempDir dir_;
  int n_ = 0;
};

/// The values of the F32 tensor `name` in the file at `path`.
inline std::vector<float> tensor_values(const std::string& path, const std::string& name) {
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return {};
  const gguf::TensorInfo* t = (*f)->find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->type, GgmlType::F32);
  auto bytes = (*f)->tensor_data(*t);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace car::testing
