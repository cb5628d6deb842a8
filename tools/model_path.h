// MODEL on the offline commands' command lines (`car show`, `car run`, `car bench`): a path when it names
// an existing file, else a model id looked up as <models dir>/<id>.gguf, as the daemon would (a trailing
// ".gguf" on an id is accepted). The models directory: --models-dir, else CAR_INFERENCE_MODELS_DIR, else
// the one a running daemon reports (`list` over the socket `car` would use, 1 s at most), else the
// daemon's default. An unknown id is a usage error (exit 2) naming the path it looked for.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "daemon/client.h"
#include "tools/command_registry.h"
#include "tools/offline_env.h"
#include "tools/socket_discovery.h"
#include "tools/terminal_text.h"

namespace car::tools {

/// The models directory a running daemon serves, if one answers `list` on the default sockets soon.
inline std::optional<std::string> daemon_models_dir() {
  auto conn = protocol::ClientConnection::connect_first(
      socket_candidates("", config::current_environment(), ::geteuid()));
  if (!conn) return std::nullopt;
  if (!conn->send_line(R"({"id":"models-dir","op":"list"})")) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = conn->read_line(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    if (!line || !*line) return std::nullopt;
    auto reply = nlohmann::json::parse(**line, nullptr, false);
    if (reply.is_discarded() || reply.value("id", "") != "models-dir") continue;
    const auto& result = reply["result"];
    if (!result.is_object() || !result.contains("models_dir") || !result["models_dir"].is_string()) {
      return std::nullopt;
    }
    return result["models_dir"].get<std::string>();
  }
  return std::nullopt;
}

/// `model` as a file path (see the header). `command` names the command in messages ("car run").
inline std::string resolve_model_path(const std::string& model, const std::string& models_dir_flag,
                                      const char* command) {
  auto fail = [command](const std::string& message) {
    std::fprintf(stderr, "%s: %s\n", command, message.c_str());
    throw CommandFailed(2);
  };
  std::error_code ec;
  if (std::filesystem::is_regular_file(model, ec)) return model;
  std::string id = model;
  if (id.size() > 5 && id.ends_with(".gguf")) id.resize(id.size() - 5);
  if (id.empty() || id.find('/') != std::string::npos || id.front() == '.') {
    fail("no such file: " + terminal_text(model, true));
  }
  std::string dir = models_dir_flag;
  std::string origin = "--models-dir";
  if (dir.empty()) {
    config::Settings settings;
    auto set = setting_from_env("CAR_INFERENCE_MODELS_DIR", settings);
    if (!set) fail(set.error().message);
    if (*set) {
      dir = settings.models_dir.string();
      origin = "CAR_INFERENCE_MODELS_DIR";
    } else if (auto served = daemon_models_dir()) {
      dir = *served;
      origin = "the running daemon's models directory";
    } else {
      dir = settings.models_dir.string();  // the daemon's default
      origin = "the default models directory";
    }
  }
  const std::filesystem::path path = std::filesystem::path(dir) / (id + ".gguf");
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail("no model " + terminal_text(id, true) + ": neither a file nor " + terminal_text(path.string(), true) +
         " (" + origin + "; set --models-dir or CAR_INFERENCE_MODELS_DIR)");
  }
  return path.string();
}

}  // namespace car::tools
