// The streamed source on a real GGUF: a synthetic MoE model written by core/synth and loaded by
// Model::load gives banks whose streamed experts are the resident slices' bytes, in every weight type the
// loader's offsets must get right (F32 rows, Q8_0 / Q4_K blocks), O_DIRECT and buffered.
#include <gtest/gtest.h>

#include "core/experts/resident_source.h"
#include "core/experts/streamed_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "core/synth/synth_model.h"
#include "tests/experts/bank_file.h"
#include "tests/test_support.h"

namespace car::experts {
namespace {

TEST(ModelBanks, StreamedExpertsAreTheResidentSlicesOfASyntheticMoeModel) {
  testing::TempDir dir;
  for (const char* type : {"f32", "q8_0", "q4_k_m"}) {
    for (bool direct : {true, false}) {
      SCOPED_TRACE(std::string(type) + (direct ? " O_DIRECT" : " buffered"));
      synth::SynthSpec spec = synth::tiny_spec("qwen3moe");
      spec.n_layer = 3;
      spec.n_embd = 256;  // K-quants need rows of 256
      spec.n_ff_expert = 256;
      spec.n_expert = 6;
      spec.weight_type = type;
      const std::string path = (dir / (std::string(type) + ".gguf")).string();
      auto w = synth::write_synth_model(spec, path);
      ASSERT_TRUE(w.ok()) << w.error().message;
      auto file = gguf::GgufFile::open(path);
      ASSERT_TRUE(file.ok()) << file.error().message;
      auto model = model::Model::load(*file);
      ASSERT_TRUE(model.ok()) << model.error().message;
      const auto& banks = (*model)->expert_banks();
      StreamOptions o;
      o.ram_gb = 1e-9;  // cap 1: every acquire of a new expert is a read
      o.direct_io = direct;
      o.io_threads = 2;
      auto src = StreamedExpertSource::open(path, banks, o);
      ASSERT_TRUE(src.ok()) << src.error().message;
      ResidentExpertSource resident(banks);
      int compared = 0;
      for (int l = 0; l < (*src)->n_layers(); ++l) {
        for (int e = 0; e < (*src)->n_expert(l); ++e) {
          auto got = (*src)->acquire(l, e);
          ASSERT_TRUE(got.ok()) << got.error().message;
          auto want = resident.acquire(l, e);
          ASSERT_TRUE(want.ok());
          const ExpertWeights& g = got->weights();
          const ExpertWeights& r = want->weights();
          EXPECT_TRUE(testing::same_matrix(g.gate, r.gate) && testing::same_matrix(g.up, r.up) &&
                      testing::same_matrix(g.down, r.down))
              << "layer " << l << " expert " << e;
          // The bytes the bench and the stream reads charge an expert are its three slices' bytes.
          const auto bytes = [](const tensor::MatrixView& v) {
            return static_cast<uint64_t>(v.rows) * v.row_bytes;
          };
          EXPECT_EQ(banks[static_cast<size_t>(l)].expert_bytes(),
                    bytes(r.gate) + bytes(r.up) + bytes(r.down));
          ++compared;
        }
      }
      EXPECT_EQ(compared, 3 * 6);
      EXPECT_EQ((*src)->stats().misses, 18u);
    }
  }
}

}  // namespace
}  // namespace car::experts
