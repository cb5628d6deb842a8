// Settings: defaults, precedence (default < file < environment < flag), every validation error, the
// socket default, reload, and the CLI11 binding.
#include "config/settings.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace car::config {
namespace {

const SystemFacts kUser{/*euid=*/1000, /*hardware_threads=*/8};
const SystemFacts kRoot{/*euid=*/0, /*hardware_threads=*/4};

/// Call load_settings with these flags (argv[0] added) and environment.
Result<Settings> load(std::initializer_list<std::string> flags, EnvMap env = {}, SystemFacts facts = kUser) {
  if (env.find("XDG_RUNTIME_DIR") == env.end()) env["XDG_RUNTIME_DIR"] = "/run/user/1000";
  std::vector<std::string> args = {"car-inferenced"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return load_settings(static_cast<int>(argv.size()), argv.data(), env, facts);
}

Settings load_ok(std::initializer_list<std::string> flags, EnvMap env = {}, SystemFacts facts = kUser) {
  auto r = load(flags, std::move(env), facts);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : Settings{};
}

std::string load_error(std::initializer_list<std::string> flags, EnvMap env = {}) {
  auto r = load(flags, std::move(env));
  EXPECT_FALSE(r.ok());
  return r.ok() ? std::string("<no error>") : r.error().code + ": " + r.error().message;
}

std::string env_error(const std::string& var, const std::string& value) {
  return load_error({}, {{var, value}});
}

class SettingsFileTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text, const std::string& name = "car.env") {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  car::testing::TempDir dir_;
};

// --- Defaults ---------------------------------------------------------------------------------------

TEST(SettingsDefaultsTest, CacheBudgetDefaultsFromTheMachinesMemory) {
  constexpr std::uint64_t kGiB = 1024ULL * 1024 * 1024;
  // 64 GiB: a tenth (6.4 GiB) is the reserve.
  SystemFacts big = kUser;
  big.mem_total_bytes = 64 * kGiB;
  Settings s = load_ok({}, {}, big);
  EXPECT_EQ(s.cache_mb, 65536u - 6553u);
  EXPECT_NE(s.cache_mb_origin.find("MemTotal 64.0 GiB"), std::string::npos) << s.cache_mb_origin;
  // 8 GiB: the 2 GiB floor of the reserve applies.
  SystemFacts small = kUser;
  small.mem_total_bytes = 8 * kGiB;
  EXPECT_EQ(load_ok({}, {}, small).cache_mb, 8192u - 2048u);
  // 2 GiB: never less than a quarter of the memory.
  small.mem_total_bytes = 2 * kGiB;
  EXPECT_EQ(load_ok({}, {}, small).cache_mb, 512u);
  // A setting wins, and says so; unknown memory keeps the fixed default.
  Settings set = load_ok({"--cache-mb", "100"}, {}, big);
  EXPECT_EQ(set.cache_mb, 100u);
  EXPECT_EQ(set.cache_mb_origin, "set");
  EXPECT_EQ(default_cache_mb(0), defaults::cache_mb);
  // The running machine's figure is read from /proc/meminfo.
  EXPECT_GT(SystemFacts::current().mem_total_bytes, 0u);
}

TEST(SettingsDefaultsTest, MatchTheContract) {
  Settings s = load_ok({});
  EXPECT_EQ(s.cache_mb, 24576u);
  EXPECT_EQ(s.cache_budget_bytes(), 24576ULL * 1024 * 1024);
  EXPECT_EQ(s.idle_secs, 300u);
  EXPECT_EQ(s.idle_ttl(), std::optional<std::chrono::seconds>(300));
  EXPECT_EQ(s.socket_path, "/run/user/1000/car-inference.sock");
  EXPECT_EQ(s.models_dir, "/var/lib/car-inference/models");
  EXPECT_EQ(s.state_dir, "/var/lib/car-inference");
  EXPECT_EQ(s.threads, 8u) << "hardware threads";
  EXPECT_EQ(s.stream_experts, StreamExperts::automatic);
  EXPECT_FALSE(s.expert_ram_gb.has_value());
  EXPECT_EQ(s.log_level, LogLevel::info);
  EXPECT_EQ(s.socket_group, "");
  EXPECT_TRUE(s.allow_uids.empty());
  EXPECT_TRUE(s.allow_gids.empty());
  EXPECT_EQ(s.workers, 2u);
  EXPECT_EQ(s.queue_depth, 64u);
  EXPECT_EQ(s.shutdown_grace_secs, 10u);
  EXPECT_EQ(s.max_connections, 256u);
  EXPECT_EQ(s.max_connections_per_uid, 64u);
  EXPECT_EQ(s.line_timeout_secs, 30u);
  EXPECT_EQ(s.max_pending_output_mb, 1u);
  EXPECT_EQ(s.isa, Isa::automatic);
  EXPECT_FALSE(s.config_file.has_value());
  EXPECT_TRUE(s.warnings.empty());
}

TEST(SettingsDefaultsTest, ZeroMeansDisabled) {
  Settings s = load_ok({"--cache-mb", "0", "--idle-secs", "0"});
  EXPECT_EQ(s.cache_budget_bytes(), 0u);
  EXPECT_FALSE(s.idle_ttl().has_value());
}

TEST(SettingsDefaultsTest, SocketPathDefault) {
  EXPECT_EQ(load_ok({}, {{"RUNTIME_DIRECTORY", "/run/car-inference"}}).socket_path,
            "/run/car-inference/car-inference.sock");
  EXPECT_EQ(load_ok({}, {{"RUNTIME_DIRECTORY", "/run/a:/run/b"}}).socket_path, "/run/a/car-inference.sock")
      << "systemd joins several RuntimeDirectory= entries with ':'";
  EXPECT_EQ(load_ok({}, {}, kRoot).socket_path, "/run/car-inference/car-inference.sock");
  EXPECT_EQ(load_ok({}, {{"RUNTIME_DIRECTORY", "/run/x"}}, kRoot).socket_path, "/run/x/car-inference.sock");
  EXPECT_EQ(load_ok({}, {{"XDG_RUNTIME_DIR", "/run/user/42"}}).socket_path,
            "/run/user/42/car-inference.sock");
  // Non-root with neither variable: no default.
  std::vector<const char*> argv = {"car-inferenced"};
  auto r = load_settings(1, argv.data(), EnvMap{}, kUser);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "invalid_setting");
  EXPECT_NE(r.error().message.find("CAR_INFERENCE_SOCKET"), std::string::npos) << r.error().message;
  EXPECT_TRUE(load_settings(1, argv.data(), EnvMap{{"CAR_INFERENCE_SOCKET", "/tmp/s.sock"}}, kUser).ok());
  EXPECT_FALSE(default_socket_path(EnvMap{}, 1000).has_value());
}

// --- Precedence -------------------------------------------------------------------------------------

TEST_F(SettingsFileTest, FileThenEnvironmentThenFlag) {
  const std::string file = write("CAR_INFERENCE_MODEL_CACHE_MB=100\nCAR_INFERENCE_MODELS_DIR=/file/models\n");
  const EnvMap env = {{"CAR_INFERENCE_MODEL_CACHE_MB", "200"}};
  EXPECT_EQ(load_ok({"--config", file, "--cache-mb", "300"}, env).cache_mb, 300u);
  EXPECT_EQ(load_ok({"--config", file}, env).cache_mb, 200u);
  Settings s = load_ok({"--config", file});
  EXPECT_EQ(s.cache_mb, 100u);
  EXPECT_EQ(s.models_dir, "/file/models");
  EXPECT_EQ(s.config_file, std::optional<std::filesystem::path>(file));
  EXPECT_EQ(s.file_values.at("CAR_INFERENCE_MODEL_CACHE_MB"), "100");
  EXPECT_EQ(load_ok({}).cache_mb, 24576u);
}

TEST_F(SettingsFileTest, EveryFlagOverridesItsVariable) {
  const EnvMap env = {{"CAR_INFERENCE_MODEL_CACHE_MB", "1"},
                      {"CAR_INFERENCE_MODEL_IDLE_SECS", "1"},
                      {"CAR_INFERENCE_SOCKET", "/env.sock"},
                      {"CAR_INFERENCE_MODELS_DIR", "/env/m"},
                      {"CAR_INFERENCE_STATE_DIR", "/env/s"},
                      {"CAR_INFERENCE_THREADS", "1"},
                      {"CAR_INFERENCE_STREAM_EXPERTS", "on"},
                      {"CAR_INFERENCE_EXPERT_RAM_GB", "1"},
                      {"CAR_INFERENCE_LOG_LEVEL", "error"},
                      {"CAR_INFERENCE_SOCKET_GROUP", "envgroup"},
                      {"CAR_INFERENCE_ALLOW_UIDS", "1"},
                      {"CAR_INFERENCE_ALLOW_GIDS", "1"},
                      {"CAR_INFERENCE_WORKERS", "1"},
                      {"CAR_INFERENCE_QUEUE_DEPTH", "1"},
                      {"CAR_INFERENCE_SHUTDOWN_GRACE_SECS", "1"},
                      {"CAR_INFERENCE_MAX_CONNECTIONS", "1"},
                      {"CAR_INFERENCE_MAX_CONNECTIONS_PER_UID", "1"},
                      {"CAR_INFERENCE_LINE_TIMEOUT_SECS", "1"},
                      {"CAR_INFERENCE_MAX_PENDING_OUTPUT_MB", "1"},
                      {"CAR_INFERENCE_MAX_KEEP_ALIVE_SECS", "1"},
                      {"CAR_INFERENCE_PIN_MODELS", "envmodel"}};
  Settings e = load_ok({}, env);
  EXPECT_EQ(e.cache_mb, 1u);
  EXPECT_EQ(e.stream_experts, StreamExperts::on);
  EXPECT_EQ(e.log_level, LogLevel::error);
  EXPECT_EQ(e.socket_group, "envgroup");
  Settings s = load_ok({"--cache-mb",
                        "2",
                        "--idle-secs",
                        "2",
                        "--socket",
                        "/flag.sock",
                        "--models-dir",
                        "/f/m",
                        "--state-dir",
                        "/f/s",
                        "--threads",
                        "2",
                        "--stream-experts",
                        "off",
                        "--expert-ram-gb",
                        "2.5",
                        "--log-level",
                        "debug",
                        "--socket-group",
                        "flaggroup",
                        "--allow-uids",
                        "5,3",
                        "--allow-gids",
                        "7",
                        "--workers",
                        "3",
                        "--queue-depth",
                        "9",
                        "--shutdown-grace-secs",
                        "4",
                        "--max-connections",
                        "100",
                        "--max-connections-per-uid",
                        "10",
                        "--line-timeout-secs",
                        "0",
                        "--max-pending-output-mb",
                        "8",
                        "--max-keep-alive-secs",
                        "600",
                        "--pin-models",
                        " chat , embed,chat"},
                       env);
  EXPECT_EQ(s.cache_mb, 2u);
  EXPECT_EQ(s.idle_secs, 2u);
  EXPECT_EQ(s.socket_path, "/flag.sock");
  EXPECT_EQ(s.models_dir, "/f/m");
  EXPECT_EQ(s.state_dir, "/f/s");
  EXPECT_EQ(s.threads, 2u);
  EXPECT_EQ(s.stream_experts, StreamExperts::off);
  EXPECT_EQ(s.expert_ram_gb, std::optional<double>(2.5));
  EXPECT_EQ(s.log_level, LogLevel::debug);
  EXPECT_EQ(s.socket_group, "flaggroup");
  EXPECT_EQ(s.allow_uids, (std::vector<uid_t>{3, 5}));
  EXPECT_EQ(s.allow_gids, (std::vector<gid_t>{7}));
  EXPECT_EQ(s.workers, 3u);
  EXPECT_EQ(s.queue_depth, 9u);
  EXPECT_EQ(s.shutdown_grace_secs, 4u);
  EXPECT_EQ(s.max_connections, 100u);
  EXPECT_EQ(s.max_connections_per_uid, 10u);
  EXPECT_EQ(s.line_timeout_secs, 0u);
  EXPECT_EQ(s.max_pending_output_mb, 8u);
  EXPECT_EQ(s.max_keep_alive_secs, 600u);
  EXPECT_EQ(s.pinned_models, (std::vector<std::string>{"chat", "embed"})) << "trimmed, duplicates dropped";
  EXPECT_EQ(e.max_connections, 1u);
  EXPECT_EQ(e.max_connections_per_uid, 1u);
  EXPECT_EQ(e.line_timeout_secs, 1u);
  EXPECT_EQ(e.max_keep_alive_secs, 1u);
  EXPECT_EQ(e.pinned_models, (std::vector<std::string>{"envmodel"}));
  Settings d = load_ok({});
  EXPECT_EQ(d.max_keep_alive_secs, 3600u);
  EXPECT_TRUE(d.pinned_models.empty());
}

TEST_F(SettingsFileTest, ConfigFileFromEnvironmentAndFlagBeatsIt) {
  const std::string a = write("CAR_INFERENCE_WORKERS=5\n", "a.env");
  const std::string b = write("CAR_INFERENCE_WORKERS=6\n", "b.env");
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_CONFIG", a}}).workers, 5u);
  EXPECT_EQ(load_ok({"--config", b}, {{"CAR_INFERENCE_CONFIG", a}}).workers, 6u);
}

TEST(SettingsPrecedenceTest, ExpertRamAlias) {
  EXPECT_EQ(load_ok({}, {{"STREAM_EXPERTS_RAM_GB", "3"}}).expert_ram_gb, std::optional<double>(3));
  EXPECT_EQ(load_ok({}, {{"STREAM_EXPERTS_RAM_GB", "3"}, {"CAR_INFERENCE_EXPERT_RAM_GB", "4"}}).expert_ram_gb,
            std::optional<double>(4))
      << "the canonical name wins within a layer";
  EXPECT_EQ(load_ok({"--expert-ram-gb", "5"}, {{"STREAM_EXPERTS_RAM_GB", "3"}}).expert_ram_gb,
            std::optional<double>(5));
  EXPECT_EQ(env_error("STREAM_EXPERTS_RAM_GB", "big"),
            "invalid_setting: CAR_INFERENCE_EXPERT_RAM_GB=big: not a positive number of GB (10^9 bytes) "
            "(from environment as STREAM_EXPERTS_RAM_GB)");
}

TEST_F(SettingsFileTest, AliasInEnvironmentBeatsCanonicalInFile) {
  const std::string file = write("CAR_INFERENCE_EXPERT_RAM_GB=1\n");
  EXPECT_EQ(load_ok({"--config", file}, {{"STREAM_EXPERTS_RAM_GB", "2"}}).expert_ram_gb,
            std::optional<double>(2));
}

TEST_F(SettingsFileTest, EmptyValueCountsAsUnset) {
  const std::string file = write("CAR_INFERENCE_MODEL_CACHE_MB=100\n");
  EXPECT_EQ(load_ok({"--config", file}, {{"CAR_INFERENCE_MODEL_CACHE_MB", ""}}).cache_mb, 100u);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_LOG_LEVEL", ""}}).log_level, LogLevel::info);
  const std::string blanked =
      write("CAR_INFERENCE_MODEL_CACHE_MB=100\nCAR_INFERENCE_MODEL_CACHE_MB=\n", "b.env");
  EXPECT_EQ(load_ok({"--config", blanked}).cache_mb, 24576u) << "a later empty line unsets the earlier one";
}

TEST_F(SettingsFileTest, LaterLinesWinAndForeignKeysAreIgnored) {
  const std::string file = write(
      "# car-inference settings\n"
      "CAR_INFERENCE_QUEUE_DEPTH=5\n"
      "RUST_LOG=debug\n"
      "PATH=/usr/bin\n"
      "CAR_INFERENCE_QUEUE_DEPTH=\"7\"\n"
      "CAR_INFERENCE_MODELS_DIR='/srv/my models'\n");
  Settings s = load_ok({"--config", file});
  EXPECT_EQ(s.queue_depth, 7u);
  EXPECT_EQ(s.models_dir, "/srv/my models");
  EXPECT_TRUE(s.warnings.empty());
}

// --- Config file errors -----------------------------------------------------------------------------

TEST_F(SettingsFileTest, UnknownCarSettingInFileIsAnError) {
  const std::string file = write("CAR_INFERENCE_MODEL_CACHE_MB=1\nCAR_INFERENCE_CACHE_MB=2\n");
  EXPECT_EQ(load_error({"--config", file}),
            "unknown_setting: " + file +
                ":2: unknown setting CAR_INFERENCE_CACHE_MB (did you mean CAR_INFERENCE_MODEL_CACHE_MB?)");
}

TEST_F(SettingsFileTest, BadValueInFileNamesFileAndLine) {
  const std::string file = write("\n# budget\nCAR_INFERENCE_MODEL_CACHE_MB=lots\n");
  EXPECT_EQ(
      load_error({"--config", file}),
      "invalid_setting: CAR_INFERENCE_MODEL_CACHE_MB=lots: not a non-negative integer (from " + file + ":3)");
}

TEST_F(SettingsFileTest, MissingAndMalformedFiles) {
  const std::string missing = (dir_ / "nope.env").string();
  EXPECT_EQ(load_error({"--config", missing}),
            "config_file: cannot read config file " + missing + ": No such file or directory");
  const std::string bad = write("K='unterminated\n");
  EXPECT_EQ(load_error({"--config", bad}), "config_file: " + bad + ":1: unterminated ' quote");
  EXPECT_EQ(load_error({"--config", ""}), "config_file: --config: empty file name");
  const std::string big = write(std::string(1024 * 1024 + 1, '#'), "big.env");
  EXPECT_EQ(load_error({"--config", big}), "config_file: config file " + big + " is larger than 1 MiB");
}

TEST_F(SettingsFileTest, ConfigVariableInsideFileIsIgnoredWithWarning) {
  const std::string file = write("CAR_INFERENCE_CONFIG=/elsewhere\n");
  Settings s = load_ok({"--config", file});
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("has no effect"), std::string::npos);
}

TEST(SettingsPrecedenceTest, UnknownCarVariableInEnvironmentIsAWarning) {
  Settings s = load_ok({}, {{"CAR_INFERENCE_MODEL_CACHE", "5"}, {"HOME", "/root"}});
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "unknown variable CAR_INFERENCE_MODEL_CACHE in the environment (ignored; did you mean "
            "CAR_INFERENCE_MODEL_CACHE_MB?)");
}

// --- Validation: one case per rule ------------------------------------------------------------------

TEST(SettingsValidationTest, EveryBadValueNamesTheVariableAndTheValue) {
  struct Case {
    std::string var, value, why;
  };
  const std::vector<Case> cases = {
      {"CAR_INFERENCE_MODEL_CACHE_MB", "lots", "not a non-negative integer"},
      {"CAR_INFERENCE_MODEL_CACHE_MB", "-1", "not a non-negative integer"},
      {"CAR_INFERENCE_MODEL_CACHE_MB", "+5", "not a non-negative integer"},
      {"CAR_INFERENCE_MODEL_CACHE_MB", " 5", "not a non-negative integer"},
      {"CAR_INFERENCE_MODEL_CACHE_MB", "1.5", "not a non-negative integer"},
      {"CAR_INFERENCE_MODEL_CACHE_MB", "99999999999999999999", "out of range (0 to 17592186044415)"},
      {"CAR_INFERENCE_MODEL_CACHE_MB", "17592186044416", "out of range (0 to 17592186044415)"},
      {"CAR_INFERENCE_MODEL_IDLE_SECS", "5m", "not a non-negative integer"},
      {"CAR_INFERENCE_MODEL_IDLE_SECS", "315360001", "out of range (0 to 315360000)"},
      {"CAR_INFERENCE_SOCKET", std::string(108, 'x'), "longer than 107 bytes (the Unix socket path limit)"},
      {"CAR_INFERENCE_SOCKET", "/run/dir/", "names a directory, not a socket file"},
      {"CAR_INFERENCE_THREADS", "0", "out of range (1 to 1024)"},
      {"CAR_INFERENCE_THREADS", "many", "not a positive integer"},
      {"CAR_INFERENCE_THREADS", "1025", "out of range (1 to 1024)"},
      {"CAR_INFERENCE_STREAM_EXPERTS", "maybe", "not one of on, off, auto"},
      {"CAR_INFERENCE_STREAM_EXPERTS", "1", "not one of on, off, auto"},
      {"CAR_INFERENCE_EXPERT_RAM_GB", "0", "not a positive number of GB (10^9 bytes)"},
      {"CAR_INFERENCE_EXPERT_RAM_GB", "-2", "not a positive number of GB (10^9 bytes)"},
      {"CAR_INFERENCE_EXPERT_RAM_GB", "nan", "not a positive number of GB (10^9 bytes)"},
      {"CAR_INFERENCE_EXPERT_RAM_GB", "inf", "not a positive number of GB (10^9 bytes)"},
      {"CAR_INFERENCE_EXPERT_RAM_GB", "4GB", "not a positive number of GB (10^9 bytes)"},
      {"CAR_INFERENCE_EXPERT_RAM_GB", "1e300", "out of range (at most 1048576 GB)"},
      {"CAR_INFERENCE_ISA", "mmx", "not one of auto, scalar, avx2, avx512"},
      {"CAR_INFERENCE_LOG_LEVEL", "verbose", "not one of trace, debug, info, warn, error"},
      {"CAR_INFERENCE_SOCKET_GROUP", "bad group!", "not a group name or numeric gid"},
      {"CAR_INFERENCE_SOCKET_GROUP", "4294967295", "not a group name or numeric gid"},
      {"CAR_INFERENCE_ALLOW_UIDS", "1,,2", "empty item in the comma-separated list"},
      {"CAR_INFERENCE_ALLOW_UIDS", "1,", "empty item in the comma-separated list"},
      {"CAR_INFERENCE_ALLOW_UIDS", "1,root", "'root' is not a numeric uid"},
      {"CAR_INFERENCE_ALLOW_UIDS", "-1", "'-1' is not a numeric uid"},
      {"CAR_INFERENCE_ALLOW_UIDS", "4294967295", "'4294967295' is not a numeric uid"},
      {"CAR_INFERENCE_ALLOW_GIDS", "x", "'x' is not a numeric gid"},
      {"CAR_INFERENCE_WORKERS", "0", "out of range (1 to 256)"},
      {"CAR_INFERENCE_WORKERS", "257", "out of range (1 to 256)"},
      {"CAR_INFERENCE_QUEUE_DEPTH", "0", "out of range (1 to 1000000)"},
      {"CAR_INFERENCE_QUEUE_DEPTH", "deep", "not a positive integer"},
      {"CAR_INFERENCE_SHUTDOWN_GRACE_SECS", "86401", "out of range (0 to 86400)"},
      {"CAR_INFERENCE_SHUTDOWN_GRACE_SECS", "soon", "not a non-negative integer"},
      {"CAR_INFERENCE_MAX_CONNECTIONS", "0", "out of range (1 to 1000000)"},
      {"CAR_INFERENCE_MAX_CONNECTIONS", "lots", "not a positive integer"},
      {"CAR_INFERENCE_MAX_CONNECTIONS_PER_UID", "0", "out of range (1 to 1000000)"},
      {"CAR_INFERENCE_MAX_CONNECTIONS_PER_UID", "1000001", "out of range (1 to 1000000)"},
      {"CAR_INFERENCE_LINE_TIMEOUT_SECS", "30s", "not a non-negative integer"},
      {"CAR_INFERENCE_LINE_TIMEOUT_SECS", "86401", "out of range (0 to 86400)"},
      {"CAR_INFERENCE_MAX_PENDING_OUTPUT_MB", "0", "out of range (1 to 4096)"},
      {"CAR_INFERENCE_MAX_PENDING_OUTPUT_MB", "4097", "out of range (1 to 4096)"},
      {"CAR_INFERENCE_MAX_KEEP_ALIVE_SECS", "1h", "not a non-negative integer"},
      {"CAR_INFERENCE_MAX_KEEP_ALIVE_SECS", "315360001", "out of range (0 to 315360000)"},
      {"CAR_INFERENCE_PIN_MODELS", "a,,b", "empty item in the comma-separated list"},
      {"CAR_INFERENCE_PIN_MODELS", "models/a", "'models/a' is a path, not a model id"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(env_error(c.var, c.value),
              "invalid_setting: " + c.var + "=" + c.value + ": " + c.why + " (from environment)");
  }
}

TEST(SettingsValidationTest, ContractExampleMessage) {
  EXPECT_EQ(
      env_error("CAR_INFERENCE_MODEL_CACHE_MB", "lots"),
      "invalid_setting: CAR_INFERENCE_MODEL_CACHE_MB=lots: not a non-negative integer (from environment)");
}

TEST(SettingsValidationTest, FlagErrorsNameTheVariableAndTheFlag) {
  EXPECT_EQ(
      load_error({"--idle-secs", "soon"}),
      "invalid_setting: CAR_INFERENCE_MODEL_IDLE_SECS=soon: not a non-negative integer (from --idle-secs)");
  EXPECT_EQ(load_error({"--nope"}).rfind("bad_flag: ", 0), 0u);
  EXPECT_EQ(load_error({"--cache-mb"}).rfind("bad_flag: ", 0), 0u) << "a flag without its value";
}

TEST(SettingsValidationTest, AcceptedSpellings) {
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_LOG_LEVEL", "DEBUG"}}).log_level, LogLevel::debug);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_LOG_LEVEL", "trace"}}).log_level, LogLevel::trace);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_LOG_LEVEL", "warn"}}).log_level, LogLevel::warn);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_STREAM_EXPERTS", "Auto"}}).stream_experts, StreamExperts::automatic);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_EXPERT_RAM_GB", ".5"}}).expert_ram_gb, std::optional<double>(0.5));
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_ISA", "Scalar"}}).isa, Isa::scalar);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_ISA", "avx512"}}).isa, Isa::avx512);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_ALLOW_UIDS", " 10 , 2,10 "}}).allow_uids,
            (std::vector<uid_t>{2, 10}));
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_SOCKET_GROUP", "car-users"}}).socket_group, "car-users");
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_SOCKET_GROUP", "1001"}}).socket_group, "1001");
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_MODEL_CACHE_MB", "17592186044415"}}).cache_mb, 17592186044415ULL);
  EXPECT_EQ(load_ok({}, {{"CAR_INFERENCE_SOCKET", "relative.sock"}}).socket_path, "relative.sock");
}

// --- Help, live settings, reload --------------------------------------------------------------------

TEST(SettingsHelpTest, HelpListsEveryFlagAndVariable) {
  auto r = load({"--help"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "help");
  const std::string& help = r.error().message;
  EXPECT_NE(help.find("Usage: car-inferenced"), std::string::npos);
  EXPECT_NE(help.find("--config FILE"), std::string::npos);
  for (const SettingInfo& s : setting_table()) {
    EXPECT_NE(help.find(std::string(s.variable)), std::string::npos) << s.variable;
    EXPECT_NE(help.find(std::string(s.flag)), std::string::npos) << s.flag;
  }
  EXPECT_NE(help.find("STREAM_EXPERTS_RAM_GB"), std::string::npos);
  EXPECT_EQ(settings_help("x"), settings_help("x"));
  EXPECT_EQ(load({"-h"}).error().code, "help");
}

TEST(SettingsReloadTest, LiveSettingsAreBudgetTtlLogLevelAndConnectionLimits) {
  auto live = live_reloadable_settings();
  EXPECT_EQ(live,
            (std::vector<std::string_view>{
                "CAR_INFERENCE_MODEL_CACHE_MB", "CAR_INFERENCE_MODEL_IDLE_SECS",
                "CAR_INFERENCE_MAX_KEEP_ALIVE_SECS", "CAR_INFERENCE_PIN_MODELS", "CAR_INFERENCE_LOG_LEVEL",
                "CAR_INFERENCE_MAX_CONNECTIONS", "CAR_INFERENCE_MAX_CONNECTIONS_PER_UID",
                "CAR_INFERENCE_LINE_TIMEOUT_SECS", "CAR_INFERENCE_MAX_PENDING_OUTPUT_MB"}));
}

TEST(SettingsReloadTest, PlanReloadSeparatesLiveFromRestartOnly) {
  Settings a = load_ok({});
  Settings b = a;
  EXPECT_FALSE(plan_reload(a, b).any_live_change());
  EXPECT_TRUE(plan_reload(a, b).needs_restart.empty());
  b.cache_mb = 1;
  b.log_level = LogLevel::debug;
  b.models_dir = "/elsewhere";
  b.workers = 9;
  ReloadPlan p = plan_reload(a, b);
  EXPECT_TRUE(p.budget_changed);
  EXPECT_FALSE(p.idle_ttl_changed);
  EXPECT_TRUE(p.log_level_changed);
  EXPECT_EQ(p.needs_restart, (std::vector<std::string>{"CAR_INFERENCE_MODELS_DIR", "CAR_INFERENCE_WORKERS"}));
  EXPECT_FALSE(p.connection_limits_changed);
  for (auto change : {+[](Settings& s) { s.max_keep_alive_secs = 5; },
                      +[](Settings& s) { s.pinned_models = {"m"}; }}) {
    Settings c = a;
    change(c);
    EXPECT_TRUE(plan_reload(a, c).idle_ttl_changed);
    EXPECT_TRUE(plan_reload(a, c).needs_restart.empty());
  }
  for (auto change :
       {+[](Settings& s) { s.max_connections = 1; }, +[](Settings& s) { s.max_connections_per_uid = 1; },
        +[](Settings& s) { s.line_timeout_secs = 1; }, +[](Settings& s) { s.max_pending_output_mb = 2; }}) {
    Settings c = a;
    change(c);
    ReloadPlan q = plan_reload(a, c);
    EXPECT_TRUE(q.connection_limits_changed);
    EXPECT_TRUE(q.any_live_change());
    EXPECT_TRUE(q.needs_restart.empty());
  }
  // Against the running values (issue #23): a setting edited and then put back to the value the daemon runs
  // with is no longer reported; one still different from it is, whatever the previous reload read.
  Settings edited = a;
  edited.workers = 9;
  Settings back = edited;
  back.workers = a.workers;
  EXPECT_TRUE(plan_reload(edited, back, &a).needs_restart.empty());
  EXPECT_EQ(plan_reload(edited, edited, &a).needs_restart, (std::vector<std::string>{"CAR_INFERENCE_WORKERS"}));
  EXPECT_EQ(plan_reload(a, edited, &a).needs_restart, (std::vector<std::string>{"CAR_INFERENCE_WORKERS"}));
}

TEST_F(SettingsFileTest, ReloadPicksUpEditedLiveSettingsOverStaleEnvironment) {
  // Under systemd the same file is both EnvironmentFile= (so the environment holds its values from start-up)
  // and --config. After an edit + SIGHUP, edited live settings take the file's new value.
  const std::string file = write("CAR_INFERENCE_MODEL_CACHE_MB=100\nCAR_INFERENCE_MODELS_DIR=/m1\n");
  const EnvMap env = {{"CAR_INFERENCE_MODEL_CACHE_MB", "100"},
                      {"CAR_INFERENCE_MODELS_DIR", "/m1"},
                      {"CAR_INFERENCE_LOG_LEVEL", "warn"},
                      {"XDG_RUNTIME_DIR", "/run/user/1000"}};
  std::vector<const char*> argv = {"car-inferenced", "--config", file.c_str()};
  auto first = load_settings(3, argv.data(), env, kUser);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->cache_mb, 100u);
  EXPECT_EQ(first->log_level, LogLevel::warn);

  write("CAR_INFERENCE_MODEL_CACHE_MB=200\nCAR_INFERENCE_MODELS_DIR=/m2\nCAR_INFERENCE_MODEL_IDLE_SECS=60\n");
  auto next = reload_settings(first.value(), 3, argv.data(), env, kUser);
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(next->cache_mb, 200u) << "edited live setting beats the stale environment";
  EXPECT_EQ(next->idle_secs, 60u) << "a live setting newly added to the file";
  EXPECT_EQ(next->models_dir, "/m1") << "not live: the environment still wins until restart";
  EXPECT_EQ(next->log_level, LogLevel::warn) << "unchanged in the file: the environment still wins";
  ReloadPlan p = plan_reload(first.value(), next.value());
  EXPECT_TRUE(p.budget_changed);
  EXPECT_TRUE(p.idle_ttl_changed);
  EXPECT_FALSE(p.log_level_changed);

  // A second SIGHUP with the file unchanged keeps the edited value (the baseline is the start-up file).
  auto again = reload_settings(next.value(), 3, argv.data(), env, kUser);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->cache_mb, 200u);
  EXPECT_EQ(again->file_values, first->file_values);
  EXPECT_FALSE(plan_reload(next.value(), again.value()).any_live_change());

  // A flag still beats everything on reload.
  std::vector<const char*> argv_flag = {"car-inferenced", "--config", file.c_str(), "--cache-mb", "5"};
  auto flagged = reload_settings(first.value(), 5, argv_flag.data(), env, kUser);
  ASSERT_TRUE(flagged.ok());
  EXPECT_EQ(flagged->cache_mb, 5u);

  // A bad edit is reported and the caller keeps the old settings.
  write("CAR_INFERENCE_MODEL_CACHE_MB=lots\n");
  auto bad = reload_settings(first.value(), 3, argv.data(), env, kUser);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("CAR_INFERENCE_MODEL_CACHE_MB=lots"), std::string::npos);
}

// --- Misc -------------------------------------------------------------------------------------------

TEST(SettingsMiscTest, DescribeShowsEveryVariable) {
  const std::string d = load_ok({"--allow-uids", "1,2"}).describe();
  for (const SettingInfo& s : setting_table())
    EXPECT_NE(d.find(std::string(s.variable) + "="), std::string::npos);
  EXPECT_NE(d.find("CAR_INFERENCE_ALLOW_UIDS=1,2\n"), std::string::npos);
  EXPECT_NE(d.find("CAR_INFERENCE_STREAM_EXPERTS=auto\n"), std::string::npos);
}

TEST(SettingsMiscTest, BindToAnotherAppForTheClient) {
  CLI::App app("car");
  SettingsFlags flags;
  bind_settings_flags(app, flags);
  std::vector<const char*> argv = {"car", "--socket", "/tmp/x.sock"};
  ASSERT_NO_THROW(app.parse(3, argv.data()));
  auto s = resolve_settings(flags, EnvMap{}, kUser);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->socket_path, "/tmp/x.sock");
}

TEST(SettingsMiscTest, CurrentEnvironmentReadsTheProcess) {
  ::setenv("CAR_SETTINGS_TEST_VAR", "a=b", 1);
  EnvMap env = current_environment();
  EXPECT_EQ(env.at("CAR_SETTINGS_TEST_VAR"), "a=b");
  ::unsetenv("CAR_SETTINGS_TEST_VAR");
}

}  // namespace
}  // namespace car::config
