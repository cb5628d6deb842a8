// Conformance against llama.cpp's goldens (../shared/conformance/models/manifest.json; skipped when absent):
// for every file and case,
//   - teacher-forced on prompt_ids + generated_ids in one batch, the log-probability (full-vocabulary
//     log-softmax in double) of each golden top-5 id at each generated position is within the file's
//     tolerance of llama.cpp's;
//   - free-running greedy decoding (prompt batch, then one token at a time) reproduces generated_ids up to
//     the first position whose top1_margin is below twice the tolerance.
// The largest deviation per file is printed (and recorded as a test property) so the report can cite it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/engine/forward.h"
#include "core/experts/resident_source.h"
#include "core/tensor/kernels.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using nlohmann::json;

std::vector<double> log_softmax(const float* logits, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(double(logits[i]) - mx);
  const double lz = mx + std::log(z);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = double(logits[i]) - lz;
  return out;
}

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

struct FileResult {
  double max_dev = 0;
  int greedy_checked = 0;
  int greedy_total = 0;
};

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
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto gen = c.at("generated_ids").get<std::vector<int32_t>>();
    const auto margins = c.at("top1_margin").get<std::vector<double>>();
    const json& tops = c.at("top_logprobs");
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());

    // Teacher-forced, one batch.
    KvCache kv = fp.make_cache(static_cast<int64_t>(all.size()) + 1);
    std::vector<float> logits(all.size() * static_cast<size_t>(V));
    EXPECT_TRUE(fp.eval(all, kv, logits.data(), true).ok());
    for (size_t j = 0; j < gen.size(); ++j) {
      const size_t row = prompt.size() - 1 + j;
      const auto lp = log_softmax(logits.data() + row * static_cast<size_t>(V), V);
      for (const json& t : tops.at(j)) {
        const int32_t id = t.at("id").get<int32_t>();
        const double want = t.at("logprob").get<double>();
        const double got = lp[static_cast<size_t>(id)];
        const double dev = std::fabs(got - want);
        res.max_dev = std::max(res.max_dev, dev);
        EXPECT_LE(dev, tol) << name << " case '" << c.at("prompt").get<std::string>() << "' position " << j
                            << " id " << id << ": " << got << " vs " << want;
      }
    }

    // Free-running greedy.
    size_t limit = gen.size();
    for (size_t j = 0; j < margins.size(); ++j) {
      if (margins[j] < 2 * tol) {
        limit = j;
        break;
      }
    }
    KvCache kv2 = fp.make_cache(static_cast<int64_t>(all.size()) + 1);
    std::vector<float> last(static_cast<size_t>(V));
    EXPECT_TRUE(fp.eval(prompt, kv2, last.data(), false).ok());
    for (size_t j = 0; j < limit; ++j) {
      const int32_t tok = argmax(last.data(), V);
      EXPECT_EQ(tok, gen[j]) << name << " greedy position " << j;
      if (tok != gen[j]) break;
      ++res.greedy_checked;
      EXPECT_TRUE(fp.eval(std::span<const int32_t>(&tok, 1), kv2, last.data(), false).ok());
    }
    res.greedy_total += static_cast<int>(gen.size());
  }
  return res;
}

TEST(Conformance, LlamaCppGoldens) {
  auto dir = testing::conformance_dir();
  if (!dir) GTEST_SKIP() << "conformance fixtures not found";
  std::ifstream in(*dir / "models" / "manifest.json");
  ASSERT_TRUE(in.good());
  const json manifest = json::parse(in);
  // The kernels under test: CAR_INFERENCE_ISA (scalar | avx2 | avx512) when set, else the best this CPU has.
  tensor::Isa isa = tensor::detect_isa();
  if (const char* env = std::getenv("CAR_INFERENCE_ISA"); env != nullptr && *env != '\0') {
    ASSERT_TRUE(tensor::parse_isa(env, &isa)) << "CAR_INFERENCE_ISA=" << env;
  }
  tensor::set_isa(isa);
  std::printf("conformance kernels: %s\n", std::string(tensor::isa_name(tensor::current_isa())).c_str());
  ThreadPool pool(2);
  double worst = 0;
  for (const json& entry : manifest.at("files")) {
    const std::string name = entry.at("file").get<std::string>();
    FileResult r = run_file(*dir / "models", entry, &pool);
    std::printf("conformance %-28s max |dlogprob| %.3g (tolerance %.4g, llama.cpp vs f64 %.4g), greedy %d/%d\n",
                name.c_str(), r.max_dev, entry.at("tolerance").get<double>(),
                entry.at("ref_max_abs_dev").get<double>(), r.greedy_checked, r.greedy_total);
    ::testing::Test::RecordProperty("max_dev_" + name, std::to_string(r.max_dev));
    worst = std::max(worst, r.max_dev);
  }
  std::printf("conformance worst deviation %.3g\n", worst);
}

}  // namespace
}  // namespace car::engine
