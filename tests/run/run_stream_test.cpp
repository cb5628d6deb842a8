// `car run --stream-experts on` on a synthetic MoE about ten times larger than its forced expert budget: the
// child's peak RSS (wait4's ru_maxrss, the kernel's high-water mark of the process) stays within
// dense weights + budget + a stated margin, while the same run with the experts resident goes past that
// bound (so the bound means something); `--json` reports the `experts` object; the usage sidecar is written
// to --state-dir at exit; and streamed and resident runs generate the same tokens.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace {

using car::testing::kSanitized;

const std::string kCar = std::string(CAR_BINARY_DIR) + "/tools/car";

struct Child {
  int status = -1;
  uint64_t max_rss = 0;  // bytes
  std::string out;
};

/// Run car with `args`, stdout captured to a file, stderr discarded; the exit status and peak RSS.
Child run_car(const std::vector<std::string>& args, const std::filesystem::path& out_path) {
  Child c;
  pid_t pid = ::fork();
  if (pid == 0) {
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null = ::open("/dev/null", O_WRONLY);
    if (out < 0 || null < 0) ::_exit(126);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(kCar.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(kCar.c_str(), argv.data());
    ::_exit(127);
  }
  int st = 0;
  rusage ru{};
  if (pid < 0 || ::wait4(pid, &st, 0, &ru) != pid) return c;
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  c.max_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  c.out = ss.str();
  return c;
}

TEST(RunStream, PeakRssStaysWithinDensePlusBudgetPlusMargin) {
  car::testing::TempDir dir;
  const std::string model = (dir / "big-moe.gguf").string();
  // 4 layers x 32 experts x 0.84 MB (q8_0, 256 x 1024 gate/up/down) = 108 MB of experts; dense ~3.6 MB.
  Child synth =
      run_car({"gguf",      "synth", "--arch",         "llama", "--layers", "4",   "--embd",      "256",
               "--heads",   "4",     "--kv-heads",     "2",     "--ff",     "512", "--ff-expert", "1024",
               "--experts", "32",    "--experts-used", "2",     "--vocab",  "300", "--ctx",       "256",
               "--type",    "q8_0",  "--seed",         "5",     "-o",       model},
              dir / "synth.out");
  ASSERT_EQ(synth.status, 0) << synth.out;
  Child inspect = run_car({"gguf", "inspect", model, "--json"}, dir / "inspect.json");
  ASSERT_EQ(inspect.status, 0);
  const auto info = nlohmann::json::parse(inspect.out);
  uint64_t expert_bytes = 0;
  uint64_t tensor_bytes = 0;
  for (const auto& t : info.at("tensors")) {
    tensor_bytes += t.at("bytes").get<uint64_t>();
    if (t.at("name").get<std::string>().find("_exps.") != std::string::npos)
      expert_bytes += t.at("bytes").get<uint64_t>();
  }
  const uint64_t dense = tensor_bytes - expert_bytes;
  const uint64_t budget = 10'000'000;  // --expert-ram-gb 0.01
  ASSERT_GT(expert_bytes, 10 * budget) << "the experts must dwarf the budget";

  const std::vector<std::string> common = {
      "run",           model,
      "--prompt",      "The quick brown fox jumps over the lazy dog, then every expert runs",
      "--max-tokens",  "16",
      "--temperature", "0",
      "--threads",     "2",
      "--json",        "--expert-ram-gb",
      "0.01"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::string state = (dir / "state").string();
  Child streamed = run_car(with({"--stream-experts", "on", "--state-dir", state}), dir / "streamed.json");
  ASSERT_EQ(streamed.status, 0) << streamed.out;
  Child resident = run_car(with({"--stream-experts", "off"}), dir / "resident.json");
  ASSERT_EQ(resident.status, 0) << resident.out;

  const auto s = nlohmann::json::parse(streamed.out);
  const auto r = nlohmann::json::parse(resident.out);
  EXPECT_EQ(s.at("tokens"), r.at("tokens")) << "streaming must not change the output";
  const auto& e = s.at("experts");
  EXPECT_EQ(e.at("mode"), "streamed");
  EXPECT_EQ(e.at("budget_bytes").get<uint64_t>(), budget);
  EXPECT_LE(e.at("cache_bytes").get<uint64_t>(), budget);
  EXPECT_GE(e.at("cap").get<int>(), 1);
  EXPECT_GT(e.at("misses").get<uint64_t>(), 0u);
  EXPECT_GT(e.at("bytes_read").get<uint64_t>(), 0u);
  for (const char* k : {"hit_rate", "read_p50_us", "read_p99_us", "prefetch_recall", "hits", "pinned",
                        "cached", "banks", "resident_bytes", "prefetch_issued", "prefetch_used",
                        "prefetch_precision", "prefetch_scored"}) {
    EXPECT_TRUE(e.at(k).is_number()) << k;
  }
  EXPECT_GE(e.at("prefetch_layers_on").get<int>(), 0);
  EXPECT_LE(e.at("prefetch_layers_on").get<int>(), e.at("banks").get<int>());
  EXPECT_EQ(r.at("experts").at("mode"), "resident");

  // The usage sidecar was saved at exit.
  bool sidecar = false;
  for (const auto& f : std::filesystem::recursive_directory_iterator(state)) {
    if (f.path().extension() == ".usage" && std::filesystem::file_size(f.path()) > 0) sidecar = true;
  }
  EXPECT_TRUE(sidecar) << "no usage sidecar under " << state;

  if (kSanitized) GTEST_SKIP() << "RSS is not meaningful under a sanitizer";
  // Margin: the process itself (binary, libraries, heap, thread stacks touched, KV cache and scratch of this
  // small model) - about 10 MB here; 32 MiB leaves room for allocator and library differences.
  const uint64_t margin = 32ull << 20;
  const uint64_t bound = dense + budget + margin;
  EXPECT_LT(streamed.max_rss, bound) << "streamed peak RSS " << streamed.max_rss << " > dense " << dense
                                     << " + budget " << budget << " + margin " << margin;
  EXPECT_GT(resident.max_rss, bound) << "the resident run should touch every expert (" << expert_bytes
                                     << " bytes): the bound would not catch a regression";
}

}  // namespace
