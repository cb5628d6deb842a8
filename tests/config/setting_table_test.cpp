// The settings table as the one source of each setting's facts: every row round-trips through the four
// layers (default < file < environment < flag), its range is enforced at both ends, a change to it lands
// in the right part of the reload plan, describe() shows it, the offline tools' reader applies the same
// rule, and docs/configuration.md's table is the one the rows generate.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "config/settings.h"
#include "core/tensor/kernels.h"
#include "tests/test_support.h"

#ifndef CAR_SOURCE_DIR
#error "CAR_SOURCE_DIR must name the source tree (tests/config/CMakeLists.txt)"
#endif

namespace car::config {
namespace {

const SystemFacts kTableUser{/*euid=*/1000, /*hardware_threads=*/8};

/// Three distinct valid values per setting, each written as its row shows it (so show() must give it
/// back). Integer rows take min+1..min+3 instead.
const std::map<std::string_view, std::vector<std::string>> kSamples = {
    {"CAR_INFERENCE_SOCKET", {"/tmp/file.sock", "/tmp/env.sock", "/tmp/flag.sock"}},
    {"CAR_INFERENCE_MODELS_DIR", {"/m/file", "/m/env", "/m/flag"}},
    {"CAR_INFERENCE_STATE_DIR", {"/s/file", "/s/env", "/s/flag"}},
    {"CAR_INFERENCE_STREAM_EXPERTS", {"on", "off", "on"}},
    {"CAR_INFERENCE_EXPERT_RAM_GB", {"1.5", "0.25", "3"}},
    {"CAR_INFERENCE_ISA", {"scalar", "avx2", "avx512"}},
    {"CAR_INFERENCE_HTTP", {"127.0.0.1:8080", "[::1]:9090", "unix:/run/x/http.sock"}},
    {"CAR_INFERENCE_HTTP_API_KEY_FILE", {"/k/file", "/k/env", "/k/flag"}},
    {"CAR_INFERENCE_LOG_LEVEL", {"debug", "warn", "error"}},
    {"CAR_INFERENCE_SOCKET_GROUP", {"file-group", "1001", "flag_group"}},
    {"CAR_INFERENCE_ALLOW_UIDS", {"1,2", "3", "4,5,6"}},
    {"CAR_INFERENCE_ALLOW_GIDS", {"7", "8,9", "10"}},
    {"CAR_INFERENCE_PIN_MODELS", {"chat", "chat,embed", "qwen3-8b"}},
};

std::vector<std::string> samples(const SettingInfo& row) {
  if (row.max != 0) {
    return {std::to_string(row.min + 1), std::to_string(row.min + 2), std::to_string(row.min + 3)};
  }
  auto it = kSamples.find(row.variable);
  return it == kSamples.end() ? std::vector<std::string>{} : it->second;
}

class SettingTableTest : public ::testing::Test {
 protected:
  Result<Settings> load(std::vector<std::string> flags, EnvMap env) {
    env.emplace("XDG_RUNTIME_DIR", "/run/user/1000");
    std::vector<std::string> args = {"car-inferenced"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return load_settings(static_cast<int>(argv.size()), argv.data(), env, kTableUser);
  }
  std::string write_file(const std::string& text) {
    const auto path = dir_.path() / "car.env";
    std::ofstream(path) << text;
    return path.string();
  }
  car::testing::TempDir dir_;
};

TEST_F(SettingTableTest, EveryRowIsComplete) {
  std::map<std::string_view, int> flags;
  for (const SettingInfo& row : setting_table()) {
    SCOPED_TRACE(std::string(row.variable));
    EXPECT_EQ(row.variable.rfind("CAR_INFERENCE_", 0), 0u);
    EXPECT_EQ(row.flag.rfind("--", 0), 0u);
    EXPECT_EQ(++flags[row.flag], 1) << "flag used twice";
    EXPECT_FALSE(row.meaning.empty());
    ASSERT_NE(row.parse, nullptr);
    ASSERT_NE(row.show, nullptr);
    EXPECT_EQ(samples(row).size(), 3u) << "add samples for this setting to kSamples";
    EXPECT_EQ(find_setting(row.variable), &row);
    if (!row.alias.empty()) {
      EXPECT_EQ(find_setting(row.alias), &row);
    }
    if (row.meaning.find("{range}") != std::string_view::npos) {
      EXPECT_NE(row.max, 0u);
    }
  }
  EXPECT_EQ(find_setting("CAR_INFERENCE_NOPE"), nullptr);
}

TEST_F(SettingTableTest, EveryRowRoundTripsThroughTheLayers) {
  for (const SettingInfo& row : setting_table()) {
    SCOPED_TRACE(std::string(row.variable));
    const auto v = samples(row);
    ASSERT_EQ(v.size(), 3u);
    const std::string var(row.variable);
    const std::string file = write_file(var + "=" + v[0] + "\n");

    auto from_file = load({"--config", file}, {});
    ASSERT_TRUE(from_file.ok()) << from_file.error().message;
    EXPECT_EQ(row.show(*from_file), v[0]) << "file beats default";

    auto from_env = load({"--config", file}, {{var, v[1]}});
    ASSERT_TRUE(from_env.ok()) << from_env.error().message;
    EXPECT_EQ(row.show(*from_env), v[1]) << "environment beats file";

    auto from_flag = load({"--config", file, std::string(row.flag), v[2]}, {{var, v[1]}});
    ASSERT_TRUE(from_flag.ok()) << from_flag.error().message;
    EXPECT_EQ(row.show(*from_flag), v[2]) << "flag beats environment";

    // Only this row moved: every other row still shows its default.
    auto defaults = load({}, {});
    ASSERT_TRUE(defaults.ok());
    for (const SettingInfo& other : setting_table()) {
      if (&other != &row) {
        EXPECT_EQ(other.show(*from_flag), other.show(*defaults)) << other.variable;
      }
    }
    EXPECT_NE(from_flag->describe().find(var + "=" + v[2] + "\n"), std::string::npos)
        << from_flag->describe();

    // An empty value is unset in every layer.
    auto empty = load({"--config", write_file(var + "=\n")}, {{var, ""}});
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(row.show(*empty), row.show(*defaults));
  }
}

TEST_F(SettingTableTest, DefaultsAreTheDefaultSettings) {
  // The documented default of a row without default_doc is what resolution yields with nothing set.
  auto resolved = load({}, {});
  ASSERT_TRUE(resolved.ok());
  const Settings plain;
  for (const SettingInfo& row : setting_table()) {
    if (!row.default_doc.empty()) continue;
    EXPECT_EQ(row.show(*resolved), row.show(plain)) << row.variable;
    EXPECT_EQ(row.default_value(), "`" + row.show(plain) + "`") << row.variable;
  }
  EXPECT_EQ(resolved->cache_mb, defaults::cache_mb);
  EXPECT_EQ(resolved->max_pending_output_mb, defaults::max_pending_output_mb);
}

TEST_F(SettingTableTest, IntegerRangesAreEnforcedAtBothEnds) {
  int integer_rows = 0;
  for (const SettingInfo& row : setting_table()) {
    if (row.max == 0) continue;
    ++integer_rows;
    SCOPED_TRACE(std::string(row.variable));
    const std::string var(row.variable);
    for (std::uint64_t ok : {row.min, row.max}) {
      auto r = load({}, {{var, std::to_string(ok)}});
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(row.show(*r), std::to_string(ok));
    }
    const std::string range =
        "out of range (" + std::to_string(row.min) + " to " + std::to_string(row.max) + ")";
    auto above = load({}, {{var, std::to_string(row.max + 1)}});
    ASSERT_FALSE(above.ok());
    EXPECT_NE(above.error().message.find(range), std::string::npos) << above.error().message;
    if (row.min > 0) {
      auto below = load({}, {{var, std::to_string(row.min - 1)}});
      ASSERT_FALSE(below.ok());
      EXPECT_NE(below.error().message.find(range), std::string::npos) << below.error().message;
    }
    if (row.meaning.find("{range}") != std::string_view::npos) {
      EXPECT_NE(row.description().find(std::to_string(row.min) + "-" + std::to_string(row.max)),
                std::string::npos);
    }
  }
  EXPECT_GE(integer_rows, 9);
}

TEST_F(SettingTableTest, ReloadPlanFollowsEachRow) {
  auto base = load({}, {});
  ASSERT_TRUE(base.ok());
  for (const SettingInfo& row : setting_table()) {
    SCOPED_TRACE(std::string(row.variable));
    auto changed = load({std::string(row.flag), samples(row)[2]}, {});
    ASSERT_TRUE(changed.ok()) << changed.error().message;
    const ReloadPlan p = plan_reload(*base, *changed);
    EXPECT_EQ(p.budget_changed, row.reload == Reload::budget);
    EXPECT_EQ(p.idle_ttl_changed, row.reload == Reload::idle_ttl);
    EXPECT_EQ(p.log_level_changed, row.reload == Reload::log_level);
    EXPECT_EQ(p.connection_limits_changed, row.reload == Reload::connection_limits);
    if (row.live()) {
      EXPECT_TRUE(p.needs_restart.empty());
    } else {
      EXPECT_EQ(p.needs_restart, std::vector<std::string>{std::string(row.variable)});
    }
  }
}

TEST_F(SettingTableTest, OfflineToolsReadTheSameRule) {
  Settings s;
  auto unset = setting_from_environment("CAR_INFERENCE_THREADS", {{"CAR_INFERENCE_THREADS", ""}}, s);
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(*unset);
  // The rules the daemon applies, with the daemon's messages.
  for (const auto& [var, value] :
       std::vector<std::pair<std::string, std::string>>{{"CAR_INFERENCE_THREADS", "0"},
                                                        {"CAR_INFERENCE_THREADS", "1025"},
                                                        {"CAR_INFERENCE_EXPERT_RAM_GB", "0"},
                                                        {"CAR_INFERENCE_STREAM_EXPERTS", "sometimes"},
                                                        {"CAR_INFERENCE_ISA", "mmx"}}) {
    Settings out;
    auto offline = setting_from_environment(var, {{var, value}}, out);
    ASSERT_FALSE(offline.ok()) << var << "=" << value;
    auto daemon = load({}, {{var, value}});
    ASSERT_FALSE(daemon.ok());
    EXPECT_EQ(offline.error().message, daemon.error().message);
    EXPECT_EQ(offline.error().code, "invalid_setting");
  }
  auto threads = setting_from_environment("CAR_INFERENCE_THREADS", {{"CAR_INFERENCE_THREADS", "3"}}, s);
  ASSERT_TRUE(threads.ok());
  EXPECT_TRUE(*threads);
  EXPECT_EQ(s.threads, 3u);
  // The alias, and the canonical name over it.
  auto alias = setting_from_environment("CAR_INFERENCE_EXPERT_RAM_GB", {{"STREAM_EXPERTS_RAM_GB", "2"}}, s);
  ASSERT_TRUE(alias.ok() && *alias);
  EXPECT_EQ(s.expert_ram_gb, std::optional<double>(2.0));
  auto both =
      setting_from_environment("CAR_INFERENCE_EXPERT_RAM_GB",
                               {{"STREAM_EXPERTS_RAM_GB", "2"}, {"CAR_INFERENCE_EXPERT_RAM_GB", "4"}}, s);
  ASSERT_TRUE(both.ok() && *both);
  EXPECT_EQ(s.expert_ram_gb, std::optional<double>(4.0));
  auto bad_alias =
      setting_from_environment("CAR_INFERENCE_EXPERT_RAM_GB", {{"STREAM_EXPERTS_RAM_GB", "x"}}, s);
  ASSERT_FALSE(bad_alias.ok());
  EXPECT_NE(bad_alias.error().message.find("(from environment as STREAM_EXPERTS_RAM_GB)"), std::string::npos)
      << bad_alias.error().message;
  auto unknown = setting_from_environment("CAR_INFERENCE_NOPE", {}, s);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, "unknown_setting");
}

TEST_F(SettingTableTest, IsaNamesAreTheKernelsNames) {
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    tensor::Isa kernel{};
    ASSERT_TRUE(tensor::parse_isa(to_string(isa), &kernel)) << to_string(isa);
    EXPECT_EQ(tensor::isa_name(kernel), to_string(isa));
  }
}

TEST_F(SettingTableTest, PrintSettingsMarkdownIsReportedLikeHelp) {
  auto r = load({"--print-settings-markdown"}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "help");
  EXPECT_EQ(r.error().message, settings_markdown());
}

/// The lines of docs/configuration.md's settings table (from its header row to the first non-table line).
std::string docs_table() {
  std::ifstream in(std::string(CAR_SOURCE_DIR) + "/docs/configuration.md");
  EXPECT_TRUE(in.good()) << "cannot read docs/configuration.md";
  std::string line;
  std::string out;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && line.rfind("| variable | flag |", 0) == 0) inside = true;
    if (!inside) continue;
    if (line.rfind("|", 0) != 0) break;
    out += line + "\n";
  }
  return out;
}

TEST_F(SettingTableTest, DocsTableIsTheGeneratedOne) {
  const std::string generated = settings_markdown();
  EXPECT_EQ(docs_table(), generated)
      << "docs/configuration.md's settings table differs from the rows: replace it with the output of "
         "`car-inferenced --print-settings-markdown`";
  // Every row is in it (so the comparison above cannot pass on an empty table).
  for (const SettingInfo& row : setting_table()) {
    EXPECT_NE(generated.find("| `" + std::string(row.variable) + "`"), std::string::npos) << row.variable;
    EXPECT_NE(generated.find(row.description()), std::string::npos) << row.variable;
  }
}

}  // namespace
TEST_F(SettingTableTest, EnvExampleIsTheGeneratedOne) {
  auto r = load({"--print-env-example"}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "help");
  const std::string generated = settings_env_example();
  EXPECT_EQ(r.error().message, generated);
  const auto read =
      testing::read_fixture(std::filesystem::path(CAR_SOURCE_DIR) / "systemd" / "car-inference.env.example");
  ASSERT_TRUE(read.has_value()) << "cannot read systemd/car-inference.env.example";
  const std::string& committed = *read;
  EXPECT_EQ(committed, generated) << "systemd/car-inference.env.example differs from the rows: replace it with "
                                     "the output of `car-inferenced --print-env-example`";
  // Every row has its commented line, and the file is one the daemon reads: uncommenting every line that
  // carries a value gives a valid config (the defaults).
  std::string uncommented;
  for (const SettingInfo& row : setting_table()) {
    const std::string key = "\n#" + std::string(row.variable) + "=";
    const std::size_t at = generated.find(key);
    ASSERT_NE(at, std::string::npos) << row.variable;
    const std::size_t end = generated.find('\n', at + 1);
    const std::string value = generated.substr(at + key.size(), end - at - key.size());
    if (!value.empty()) uncommented += std::string(row.variable) + "=" + value + "\n";
  }
  const std::string path = (dir_.path() / "defaults.env").string();
  std::ofstream(path) << uncommented;
  auto loaded = load({"--config", path}, {});
  ASSERT_TRUE(loaded.ok()) << loaded.error().message << "\n" << uncommented;
}

}  // namespace car::config
