// Every architecture and every weight type the engine computes, through the real car-inferenced (issue #27's
// "a file of each architecture and type loads through the daemon"): core/synth writes one small model of
// each supported architecture (model::supported_archs(), in the shape synth::tiny_spec gives it) and one
// llama model in each type that tensor::can_quantize and can_compute (and the _M mixes and MXFP4_MOE) into
// the models directory; each is loaded and generates over the socket, and `list` names its architecture.
// The numbers are the conformance suites' business; this is the serving path: load_failed for any of them
// would fail here.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/model/architecture.h"
#include "core/synth/synth_model.h"
#include "core/tensor/kernels.h"
#include "tests/daemon/daemon_process.h"
#include "tests/daemon/daemon_test_support.h"
#include "tests/test_support.h"

namespace car {
namespace {

using car::testing::call;
using car::testing::kBinary;
using car::testing::TempDir;
using car::testing::wait_until;
using nlohmann::json;
using protocol::ClientConnection;
using namespace std::chrono_literals;

std::vector<std::string> split_archs(std::string_view list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    size_t j = list.find(',', i);
    if (j == std::string_view::npos) j = list.size();
    std::string a(list.substr(i, j - i));
    a.erase(0, a.find_first_not_of(' '));
    a.erase(a.find_last_not_of(' ') + 1);
    if (!a.empty()) out.push_back(a);
    i = j + 1;
  }
  return out;
}

/// Every weight scheme synth writes whose products the engine computes: the computable, quantizable ggml
/// types (by name) and the llama-quantize mixes.
std::vector<std::string> weight_schemes() {
  std::vector<std::string> out = {"q4_k_m", "q5_k_m"};
  for (const auto& traits : kGgmlTypes) {
    const GgmlType t = traits.type;
    if (!tensor::can_quantize(t) || !tensor::can_compute(t)) continue;
    std::string name(traits.name);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.push_back(name);
  }
  return out;
}

class DaemonModelBreadthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kBinary.c_str(), X_OK), 0) << kBinary << " is not built";
    models_ = tmp_ / "models";
    std::filesystem::create_directories(models_);
    socket_ = (tmp_ / "car.sock").string();
  }

  void write(const std::string& id, const synth::SynthSpec& spec) {
    auto ok = synth::write_synth_model(spec, (models_ / (id + ".gguf")).string());
    ASSERT_TRUE(ok.ok()) << id << ": " << ok.error().message;
  }

  TempDir tmp_;
  std::filesystem::path models_;
  std::string socket_;
};

TEST_F(DaemonModelBreadthTest, EveryArchitectureAndWeightTypeLoadsAndGenerates) {
  std::map<std::string, std::string> arch_of;  // model id -> general.architecture
  for (const std::string& arch : split_archs(model::supported_archs())) {
    synth::SynthSpec spec = synth::tiny_spec(arch);
    ASSERT_EQ(spec.arch, arch) << "synth::tiny_spec has no shape for the supported architecture " << arch;
    spec.n_ctx = 256;
    ASSERT_NO_FATAL_FAILURE(write("arch-" + arch, spec));
    arch_of["arch-" + arch] = arch;
  }
  for (const std::string& scheme : weight_schemes()) {
    // 256 wide, so every matrix takes the type itself rather than a fallback for short rows
    synth::SynthSpec spec = synth::tiny_spec("llama");
    spec.n_layer = 1;
    spec.n_embd = 256;
    spec.n_ff = 256;
    spec.n_head = 2;
    spec.n_head_kv = 1;
    spec.n_vocab = 260;
    spec.n_ctx = 256;
    spec.weight_type = scheme;
    ASSERT_NO_FATAL_FAILURE(write("type-" + scheme, spec));
    arch_of["type-" + scheme] = "llama";
  }
  {  // MXFP4_MOE needs expert banks
    synth::SynthSpec spec = synth::tiny_spec("gpt-oss");
    spec.n_embd = 256;
    spec.n_ff = 256;
    spec.n_ff_expert = 256;
    spec.head_dim = 64;
    spec.n_vocab = 260;
    spec.n_ctx = 256;
    spec.weight_type = "mxfp4_moe";
    ASSERT_NO_FATAL_FAILURE(write("type-mxfp4_moe", spec));
    arch_of["type-mxfp4_moe"] = "gpt-oss";
  }
  std::printf("%zu models: %zu architectures and %zu weight schemes\n", arch_of.size(),
              split_archs(model::supported_archs()).size(), weight_schemes().size() + 1);

  testing::DaemonProcess daemon({{"CAR_INFERENCE_SOCKET", socket_},
                                 {"CAR_INFERENCE_MODELS_DIR", models_.string()},
                                 {"CAR_INFERENCE_STATE_DIR", tmp_.path().string()},
                                 {"CAR_INFERENCE_THREADS", "1"},
                                 {"CAR_INFERENCE_PARALLEL", "1"}},
                                (tmp_ / "daemon.log").string());
  ASSERT_TRUE(wait_until([&] { return ClientConnection::connect(socket_).ok(); }, 20s))
      << "car-inferenced did not come up; log:\n"
      << daemon.log();
  auto conn = ClientConnection::connect(socket_);
  ASSERT_TRUE(conn.ok());

  for (const auto& [id, arch] : arch_of) {
    SCOPED_TRACE(id);
    const json load = call(*conn, {{"id", "l"}, {"op", "load"}, {"model", id}});
    ASSERT_EQ(load["ok"], true) << load.dump();
    const json r = call(*conn, {{"id", "i"},
                                {"op", "infer"},
                                {"model", id},
                                {"prompt", "Once upon a time"},
                                {"max_tokens", 3},
                                {"temperature", 0}});
    ASSERT_EQ(r["ok"], true) << r.dump();
    EXPECT_EQ(r["result"]["tokens"].size(), 3u) << r.dump();
    // Unload as we go: the budget then never evicts, and each load is a fresh one.
    const json inv = call(*conn, {{"id", "x"}, {"op", "invalidate"}, {"model", id}});
    ASSERT_EQ(inv["ok"], true) << inv.dump();
  }
  const json list = call(*conn, {{"id", "ls"}, {"op", "list"}});
  ASSERT_EQ(list["ok"], true) << list.dump();
  std::map<std::string, std::string> listed;
  for (const json& m : list["result"]["models"]) {
    if (m["arch"].is_string()) listed[m["model"]] = m["arch"];
  }
  for (const auto& [id, arch] : arch_of) EXPECT_EQ(listed[id], arch) << id << " in " << list.dump();
}

}  // namespace
}  // namespace car
