// Helpers shared by the offline commands that run the engine in-process (`car run`, `car bench`): the
// environment settings they honour (CONTRACT.md: flag > environment > default), read through the daemon's
// settings rows (config/settings.h) so each variable has one rule; the ISA override the kernels expect the
// tool to apply (core reads no environment); and the process's memory figures.
//
// Header-only so that adding it needs no build-file change; every function is small. Not thread-safe in
// the sense that set_isa() must run before any engine work starts - call these at command start-up.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "config/settings.h"
#include "core/engine/engine.h"
#include "core/engine/expert_stats_json.h"
#include "core/tensor/kernels.h"
#include "core/util/result.h"

namespace car::tools {

/// Parse a whole string as a non-negative integer; nullopt on anything else.
inline std::optional<long long> parse_count(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::stoll(s);
}

/// `variable` from the process environment, validated by its row of the daemon's settings table
/// (config/settings.h), so `car run`, `car bench` and car-inferenced accept the same values with the same
/// messages. false when unset or empty.
inline Result<bool> setting_from_env(std::string_view variable, config::Settings& out) {
  return config::setting_from_environment(variable, config::current_environment(), out);
}

/// For a tool flag that sets the same thing as `variable` (attach with ->transform, so the value is
/// rewritten): the value must pass the variable's settings row, so `--threads 0` fails as
/// CAR_INFERENCE_THREADS=0 does (an unset flag keeps the tool's default). The message is the row's reason
/// ("out of range (1 to 1024)"); an accepted value is passed on as the row writes it (`OFF` -> `off`).
inline CLI::Validator setting_rule(std::string_view variable) {
  const config::SettingInfo* row = config::find_setting(variable);
  CAR_CHECK(row != nullptr);
  return CLI::Validator(
      [row](std::string& value) {
        config::Settings scratch;
        std::string why = row->parse(*row, value, scratch);
        if (why.empty()) value = row->show(scratch);  // the row's spelling: `ON` -> `on`
        return why;
      },
      "", std::string(row->variable));
}

/// Apply CAR_INFERENCE_ISA (auto | scalar | avx2 | avx512) when set. The kernels cap it at what the CPU
/// supports.
inline Result<void> apply_isa_from_env() {
  config::Settings s;
  auto set = setting_from_env("CAR_INFERENCE_ISA", s);
  if (!set) return set.error();
  if (!*set || s.isa == config::Isa::automatic) return {};
  tensor::Isa isa{};
  const bool known = tensor::parse_isa(config::to_string(s.isa), &isa);
  CAR_CHECK(known);  // the settings accept exactly the kernels' names (tests/config)
  tensor::set_isa(isa);
  return {};
}

/// Fill LoadOptions from the environment where the command line left a field unset (flag_* = was the flag
/// given?): CAR_INFERENCE_THREADS, CAR_INFERENCE_STREAM_EXPERTS, CAR_INFERENCE_EXPERT_RAM_GB (alias
/// STREAM_EXPERTS_RAM_GB), CAR_INFERENCE_STATE_DIR (where the expert usage sidecar lives; unset: none). Each
/// is validated by its settings row, as the daemon does; a malformed value is an error naming the variable.
inline Result<void> load_options_from_env(engine::LoadOptions& options, bool flag_threads, bool flag_stream,
                                          bool flag_ram, bool flag_state_dir = true) {
  config::Settings s;
  auto read = [&s](std::string_view variable, bool flag_given) -> Result<bool> {
    if (flag_given) return false;
    return setting_from_env(variable, s);
  };
  auto state_dir = read("CAR_INFERENCE_STATE_DIR", flag_state_dir);
  if (!state_dir) return state_dir.error();
  if (*state_dir) options.state_dir = s.state_dir.string();
  auto threads = read("CAR_INFERENCE_THREADS", flag_threads);
  if (!threads) return threads.error();
  if (*threads) options.threads = static_cast<int>(s.threads);
  auto stream = read("CAR_INFERENCE_STREAM_EXPERTS", flag_stream);
  if (!stream) return stream.error();
  if (*stream) options.stream_experts = s.stream_experts;
  auto ram = read("CAR_INFERENCE_EXPERT_RAM_GB", flag_ram);
  if (!ram) return ram.error();
  if (*ram) options.expert_ram_gb = s.expert_ram_gb.value_or(0.0);
  return {};
}

/// The flags `car run` and `car bench` share for loading a model in-process, and the environment settings
/// they override (flag > environment > default, each checked by its settings row).
struct EngineFlags {
  int threads = 0;  // 0 = all cores (unset)
  std::string stream_experts = "auto";
  double expert_ram_gb = 0;  // 0 = from the memory limits (unset)
  std::string state_dir;
  bool no_prefetch = false;
  CLI::Option* threads_opt = nullptr;
  CLI::Option* stream_opt = nullptr;
  CLI::Option* ram_opt = nullptr;
  CLI::Option* state_dir_opt = nullptr;

  /// Add --threads, --stream-experts, --expert-ram-gb, --state-dir and --no-prefetch to `cmd`. The
  /// object must outlive the command's parse (the commands keep it in a shared_ptr'd flags struct).
  void add_to(CLI::App* cmd) {
    threads_opt = cmd->add_option("--threads,-t", threads,
                                  "Compute threads (1-1024, as CAR_INFERENCE_THREADS); unset: all cores")
                      ->transform(setting_rule("CAR_INFERENCE_THREADS"));
    stream_opt = cmd->add_option("--stream-experts", stream_experts, "Stream MoE experts from disk")
                     ->transform(setting_rule("CAR_INFERENCE_STREAM_EXPERTS"));
    ram_opt = cmd->add_option("--expert-ram-gb", expert_ram_gb,
                              "Expert cache budget when streaming, GB (unset: from the memory limits)")
                  ->transform(setting_rule("CAR_INFERENCE_EXPERT_RAM_GB"));
    state_dir_opt =
        cmd->add_option("--state-dir", state_dir, "Where the expert usage sidecar lives (streamed MoE models)");
    cmd->add_flag("--no-prefetch", no_prefetch, "Do not prefetch the next MoE layer's experts when streaming");
  }

  /// The load options these flags and the environment give (CAR_INFERENCE_ISA applied too), with the
  /// context size `context_length`. Errors name the flag's or variable's rule.
  Result<engine::LoadOptions> load_options(int context_length) const {
    if (auto r = apply_isa_from_env(); !r) return r.error();
    engine::LoadOptions load;
    load.threads = threads;
    // The flag's text is the settings row's spelling by now (setting_rule): one parse at the edge.
    load.stream_experts = parse_stream_experts(stream_experts).value_or(StreamExperts::automatic);
    load.expert_ram_gb = expert_ram_gb;
    load.state_dir = state_dir;
    load.prefetch = !no_prefetch;
    load.context_length = context_length;
    if (auto r = load_options_from_env(load, threads_opt->count() > 0, stream_opt->count() > 0,
                                       ram_opt->count() > 0, state_dir_opt->count() > 0);
        !r) {
      return r.error();
    }
    return load;
  }
};

/// The `--json` `experts` object: the expert source's counters and why it streams, or null (dense model).
inline nlohmann::json experts_json(const engine::LoadedModel& model) {
  auto s = engine::model_expert_stats(model);
  if (!s) return nullptr;
  nlohmann::json j = engine::expert_stats_json(*s);
  j["reason"] = engine::model_stream_reason(model);
  return j;
}

/// Save the expert usage sidecar (streamed models with a state dir); a failure is a warning on stderr.
inline void save_expert_usage(engine::LoadedModel& model, const char* command) {
  if (auto r = engine::model_save_state(model); !r) {
    std::fprintf(stderr, "%s: warning: saving expert usage: %s\n", command, r.error().message.c_str());
  }
  for (const auto& w : engine::model_take_warnings(model))
    std::fprintf(stderr, "%s: warning: %s\n", command, w.c_str());
}

/// A "VmRSS"-style field of /proc/self/status in bytes; 0 when unavailable.
inline uint64_t proc_status_bytes(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 && line[field.size()] == ':') {
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10) * 1024;  // reported in kB
    }
  }
  return 0;
}

}  // namespace car::tools
