// Helpers shared by the offline commands that run the engine in-process (`car run`, `car bench`): the
// environment settings they honour (CONTRACT.md: flag > environment > default), the ISA override the
// kernels expect the tool to apply (core reads no environment), and the process's memory figures.
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

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "core/engine/expert_stats_json.h"
#include "core/tensor/kernels.h"
#include "core/util/result.h"

namespace car::tools {

/// The variable's value, or nullopt when it is unset or empty.
inline std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// Parse a whole string as a non-negative integer; nullopt on anything else.
inline std::optional<long long> parse_count(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::stoll(s);
}

/// Parse a whole string as a non-negative finite number; nullopt on anything else.
inline std::optional<double> parse_amount(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !(v >= 0) || v > 1e12) return std::nullopt;
  return v;
}

/// Apply CAR_INFERENCE_ISA (scalar | avx2 | avx512) when set. The kernels clamp to what the CPU supports.
inline Result<void> apply_isa_from_env() {
  const auto v = env_value("CAR_INFERENCE_ISA");
  if (!v) return {};
  tensor::Isa isa{};
  if (!tensor::parse_isa(*v, &isa)) {
    return make_error("bad_setting", "CAR_INFERENCE_ISA=" + *v + ": expected scalar, avx2 or avx512");
  }
  tensor::set_isa(isa);
  return {};
}

/// Fill LoadOptions from the environment where the command line left a field unset (flag_* = was the flag
/// given?): CAR_INFERENCE_THREADS, CAR_INFERENCE_STREAM_EXPERTS, CAR_INFERENCE_EXPERT_RAM_GB (alias
/// STREAM_EXPERTS_RAM_GB), CAR_INFERENCE_STATE_DIR (where the expert usage sidecar lives; unset: none). A
/// malformed value is an error naming the variable.
inline Result<void> load_options_from_env(engine::LoadOptions& options, bool flag_threads, bool flag_stream,
                                          bool flag_ram, bool flag_state_dir = true) {
  if (!flag_state_dir) {
    if (const auto v = env_value("CAR_INFERENCE_STATE_DIR")) options.state_dir = *v;
  }
  if (!flag_threads) {
    if (const auto v = env_value("CAR_INFERENCE_THREADS")) {
      const auto n = parse_count(*v);
      if (!n || *n > 4096) {
        return make_error("bad_setting", "CAR_INFERENCE_THREADS=" + *v + ": expected a thread count (0 = all cores)");
      }
      options.threads = static_cast<int>(*n);
    }
  }
  if (!flag_stream) {
    if (const auto v = env_value("CAR_INFERENCE_STREAM_EXPERTS")) {
      if (*v != "on" && *v != "off" && *v != "auto") {
        return make_error("bad_setting", "CAR_INFERENCE_STREAM_EXPERTS=" + *v + ": expected on, off or auto");
      }
      options.stream_experts = *v;
    }
  }
  if (!flag_ram) {
    const char* name = "CAR_INFERENCE_EXPERT_RAM_GB";
    auto v = env_value(name);
    if (!v) {
      name = "STREAM_EXPERTS_RAM_GB";
      v = env_value(name);
    }
    if (v) {
      const auto gb = parse_amount(*v);
      if (!gb) return make_error("bad_setting", std::string(name) + "=" + *v + ": expected a size in GB");
      options.expert_ram_gb = *gb;
    }
  }
  return {};
}

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
