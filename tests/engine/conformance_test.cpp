// Conformance against llama.cpp's goldens (../shared/conformance/models/manifest.json; skipped only when no
// conformance folder is configured, failed when one is but the manifest or a model is missing):
// for every file and case,
//   - teacher-forced on prompt_ids + generated_ids in one batch, the log-probability (full-vocabulary
//     log-softmax in double) of each golden top-5 id at each generated position is within the file's
//     tolerance of llama.cpp's;
//   - free-running greedy decoding (prompt batch, then one token at a time) reproduces generated_ids up to
//     the first position whose top1_margin is below twice the tolerance.
// The largest deviation per file is printed (and recorded as a test property) so the report can cite it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/engine/forward.h"
#include "core/experts/resident_source.h"
#include "tests/engine/golden_case.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using nlohmann::json;

using FileResult = golden::GoldenDeviation;

FileResult run_file(const std::filesystem::path& dir, const json& entry, ThreadPool* pool) {
  FileResult res;
  const std::string name = entry.at("file").get<std::string>();
  const double tol = entry.at("tolerance").get<double>();
  auto f = gguf::GgufFile::open((dir / name).string());
  EXPECT_TRUE(f.ok()) << name << ": " << (f.ok() ? "" : f.error().message);
  if (!f.ok()) return res;
  auto m = model::Model::load(*f);
  EXPECT_TRUE(m.ok()) << name << ": " << (m.ok() ? "" : m.error().message);
  if (!m.ok()) return res;
  std::shared_ptr<const model::Model> model = *m;
  std::unique_ptr<experts::ResidentExpertSource> src;
  if (model->hparams().is_moe()) src = std::make_unique<experts::ResidentExpertSource>(model->expert_banks());
  ForwardPass fp(model, src.get(), pool, 64);
  const int64_t V = model->hparams().n_vocab;
  EXPECT_EQ(V, entry.at("n_vocab").get<int64_t>()) << name;

  for (const json& c : entry.at("cases")) {
    golden::check_golden_case(fp, V, c, tol, tol, name + " case '" + c.at("prompt").get<std::string>() + "'", res);
  }
  return res;
}

TEST(Conformance, LlamaCppGoldens) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto text = testing::read_fixture(dir / "models" / "manifest.json");
  ASSERT_TRUE(text) << "conformance fixture missing or unreadable: " << dir / "models" / "manifest.json";
  const json manifest = json::parse(*text);
  ASSERT_FALSE(manifest.at("files").empty());
  ASSERT_NO_FATAL_FAILURE(golden::select_isa_under_test("conformance"));
  ThreadPool pool(2);
  golden::DeviationLog log("conformance");
  for (const json& entry : manifest.at("files")) {
    const std::string name = entry.at("file").get<std::string>();
    FileResult r = run_file(dir / "models", entry, &pool);
    std::printf("conformance %-28s max |dlogprob| %.3g (tolerance %.4g, llama.cpp vs f64 %.4g), greedy %d/%d\n",
                name.c_str(), r.max_dev, entry.at("tolerance").get<double>(),
                entry.at("ref_max_abs_dev").get<double>(), r.greedy_checked, r.greedy_total);
    log.add(name, r.max_dev);
  }
}

}  // namespace
}  // namespace car::engine
