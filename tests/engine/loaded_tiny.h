// Test helper: a tiny model (tiny_model.h) written to a test's directory and loaded, with its resident
// expert source when it is a MoE; the set-up forward_test and decode_test share.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/experts/resident_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::testing {

struct LoadedTiny {
  std::shared_ptr<const model::Model> model;  // null when the file did not load (the failure is reported)
  std::unique_ptr<experts::ResidentExpertSource> experts;
  TinyWeights weights;  // what reference_forward() needs
};

/// Writes `spec` as dir/file_name and loads it.
inline LoadedTiny load_tiny_model(const TempDir& dir, const TinySpec& spec, const std::string& file_name) {
  const std::string path = (dir / file_name).string();
  LoadedTiny l;
  l.weights = write_tiny_model(path, spec);
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().message);
  if (!f.ok()) return l;
  auto m = model::Model::load(*f);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  if (!m.ok()) return l;
  l.model = *m;
  if (l.model->hparams().is_moe()) {
    l.experts = std::make_unique<experts::ResidentExpertSource>(l.model->expert_banks());
  }
  return l;
}

}  // namespace car::testing
