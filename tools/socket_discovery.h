// Where `car`'s client commands look for car-inferenced (docs/operations.md, "Which socket `car` uses").
//
// --socket, else $CAR_INFERENCE_SOCKET: that path only. Otherwise the per-user default
// (config::default_socket_path: $XDG_RUNTIME_DIR/car-inference.sock for a non-root user) and then the
// system daemon's socket ($CAR_INFERENCE_SYSTEM_SOCKET, default /run/car-inference/car-inference.sock), so
// a member of the car-inference group reaches the system daemon with a plain `car health` when they run no
// daemon of their own. The client tries them in order and names every path it tried when none answers.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "config/settings.h"
#include "core/util/limits.h"

namespace car::tools {

inline constexpr const char* kSystemSocketPath = limits::kSystemSocketPath;

/// The socket paths to try, in order (never empty, no duplicates). `flag` is --socket ("" = not given).
inline std::vector<std::string> socket_candidates(const std::string& flag, const config::EnvMap& env,
                                                  uid_t euid) {
  if (!flag.empty()) return {flag};
  if (auto it = env.find("CAR_INFERENCE_SOCKET"); it != env.end() && !it->second.empty()) return {it->second};
  std::string system = kSystemSocketPath;
  if (auto it = env.find("CAR_INFERENCE_SYSTEM_SOCKET"); it != env.end() && !it->second.empty())
    system = it->second;
  std::vector<std::string> paths;
  // root's own default is the system socket itself (then the override applies to it too).
  if (auto own = config::default_socket_path(env, euid); own && own->string() != kSystemSocketPath) {
    paths.push_back(own->string());
  }
  if (paths.empty() || paths.front() != system) paths.push_back(system);
  return paths;
}

}  // namespace car::tools
