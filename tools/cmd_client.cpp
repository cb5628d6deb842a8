// `car load|infer|stats|metrics|invalidate|list|health`: the client of car-inferenced (docs/protocol.md).
//
// Each command sends one request over the Unix socket (--socket, else $CAR_INFERENCE_SOCKET, else the
// per-user default, then the system socket: tools/socket_discovery.h) and prints the answer for a person, or
// with --json the daemon's raw reply line. `infer` prints tokens as they stream; `load` shows elapsed time on
// a terminal while a load takes long; `infer --logprobs` adds a table of each token's logprob. Exit codes:
// 0 success, 1 the daemon answered an error (its code and message go to stderr), 2 bad input (an unreadable
// stdin, an infer option out of range - checked before connecting), 3 the daemon could not be reached or
// broke the protocol. A model id typed with its ".gguf" suffix is sent without it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/settings.h"
#include "core/gguf/model_info.h"
#include "daemon/client.h"
#include "daemon/protocol.h"
#include "tools/command_registry.h"
#include "tools/socket_discovery.h"
#include "tools/stdin_text.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_client {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct ClientOptions {
  std::string socket;
  bool json_output = false;
  double timeout_s = 0;  // 0 = wait as long as it takes
};

[[noreturn]] void fail(int code, const std::string& msg) {
  std::fprintf(stderr, "car: %s\n", msg.c_str());
  throw CommandFailed(code);
}

std::vector<std::string> socket_paths(const ClientOptions& o) {
  return socket_candidates(o.socket, config::current_environment(), ::geteuid());
}

/// A model id as typed: "stories.gguf" means the id "stories" (ids name <models dir>/<id>.gguf, so a file
/// name is a natural thing to type); anything else is sent as is and the daemon judges it.
std::string model_id(const std::string& typed) {
  if (typed.size() > 5 && typed.ends_with(".gguf") && typed.find('/') == std::string::npos) {
    return typed.substr(0, typed.size() - 5);
  }
  return typed;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

/// One request/response exchange. `on_event` sees streamed events; `on_wait` is called about every
/// 200 ms while nothing arrives (elapsed seconds).
protocol::Reply exchange(const ClientOptions& o, json request, const std::function<void(const protocol::Reply&)>& on_event,
                         const std::function<void(double)>& on_wait = {}) {
  auto conn = protocol::ClientConnection::connect_first(socket_paths(o));
  if (!conn) fail(kExitUnreachable, conn.error().message);
  request["id"] = 1;
  if (auto sent = conn->send_line(request.dump()); !sent) {
    // Refused (too_many_connections): the daemon wrote why and closed before the request went out.
    if (auto refusal = conn->pending_error(1s)) {
      if (o.json_output) std::printf("%s\n", refusal->raw.dump().c_str());
      fail(kExitDaemonError, refusal->error_code + ": " + refusal->error_message);
    }
    fail(kExitUnreachable, sent.error().message);
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto line = conn->read_line(200ms);
    if (!line) fail(kExitUnreachable, line.error().message);
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!line->has_value()) {
      if (o.timeout_s > 0 && elapsed > o.timeout_s) fail(kExitUnreachable, "no answer within the --timeout");
      if (on_wait) on_wait(elapsed);
      continue;
    }
    auto reply = protocol::parse_reply(**line);
    if (!reply) fail(kExitUnreachable, reply.error().message);
    if (reply->is_event) {
      if (on_event) on_event(*reply);
      continue;
    }
    if (o.json_output) std::printf("%s\n", line->value().c_str());
    if (!reply->ok) fail(kExitDaemonError, reply->error_code + ": " + reply->error_message);
    return std::move(*reply);
  }
}

void add_common(CLI::App* cmd, ClientOptions& o) {
  cmd->add_option(
      "--socket", o.socket,
      "the daemon's socket (default: $CAR_INFERENCE_SOCKET, else $XDG_RUNTIME_DIR/car-inference.sock, then "
      "/run/car-inference/car-inference.sock)");
  cmd->add_flag("--json", o.json_output, "print the daemon's raw JSON reply");
  cmd->add_option("--timeout", o.timeout_s, "give up after this many seconds (default: wait)");
}

/// Reject an infer request the daemon would refuse as bad_request before connecting, with exit 2 (bad input)
/// and the protocol's own message with the field named as its flag ("--min-p must be in [0, 1]"): the
/// ranges live once, in the infer field table that protocol::parse_infer reads, as the daemon does.
void check_request(const json& req) {
  std::string message;
  if (req.value("op", "") == "infer") {
    if (auto parsed = protocol::parse_infer(req); !parsed) message = parsed.error().message;
  }
  if (auto keep_alive = protocol::keep_alive_field(req); message.empty() && !keep_alive) {
    message = keep_alive.error().message;
  }
  if (message.empty()) return;
  // "field 'repeat_last_n'" -> "--repeat-last-n": every infer field the CLI sends has the flag of that name.
  const std::string::size_type at = message.find("field '");
  if (at != std::string::npos) {
    const std::string::size_type end = message.find('\'', at + 7);
    if (end != std::string::npos) {
      std::string flag = "--" + message.substr(at + 7, end - at - 7);
      std::replace(flag.begin(), flag.end(), '_', '-');
      message.replace(at, end + 1 - at, flag);
    }
  }
  fail(2, message);
}

/// A token's text as a JSON string, so spaces, newlines and U+FFFD halves of a character stay visible.
std::string quoted(const json& text) {
  return json(text.is_string() ? text.get<std::string>() : std::string())
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

/// `car infer --logprobs`: one line per generated token - its text, its logprob and, with --top-logprobs,
/// the most likely tokens at that position (docs/protocol.md, the result's `logprobs` array).
void print_logprobs(const json& entries) {
  std::printf("%-24s %9s  %s\n", "TOKEN", "LOGPROB", "TOP LOGPROBS");
  for (const auto& e : entries) {
    std::string top;
    if (const auto it = e.find("top_logprobs"); it != e.end() && it->is_array()) {
      for (const auto& alt : *it) {
        char lp[32];
        std::snprintf(lp, sizeof(lp), " %.3f", alt.value("logprob", 0.0));
        top += (top.empty() ? "" : ", ") + quoted(alt.value("text", json())) + lp;
      }
    }
    // Padded by characters, not bytes, so a U+FFFD or any non-ASCII token keeps the columns aligned.
    std::string token = quoted(e.value("text", json()));
    const auto chars = std::count_if(token.begin(), token.end(), [](char c) { return (c & 0xC0) != 0x80; });
    if (chars < 24) token.append(static_cast<std::size_t>(24 - chars), ' ');
    std::printf("%s %9.3f  %s\n", token.c_str(), e.value("logprob", 0.0), top.empty() ? "-" : top.c_str());
  }
}

void print_stats(const json& r) {
  const json& c = r["cache"];
  std::printf("cache: %s of %s in %d model(s); hits %llu, misses %llu, loads %llu (%llu failed), evictions %llu\n",
              human_bytes(c.value("total_bytes", 0.0)).c_str(), human_bytes(c.value("budget_bytes", 0.0)).c_str(),
              c.value("entries", 0), c.value("hits", 0ull), c.value("misses", 0ull), c.value("loads", 0ull),
              c.value("load_failures", 0ull), c.value("evictions", 0ull));
  if (!r["models"].empty()) {
    // SIZE is what the model holds, as `car load` reports it (the cache's charge).
    // IDLE TTL: how long it may stay unused (its request's keep_alive, else the daemon's idle TTL).
    std::printf("  %-32s %10s  %-6s %8s %9s %8s %6s %8s  %s\n", "MODEL", "SIZE", "STATE", "IDLE", "IDLE TTL",
                "AGE", "HITS", "CONTEXT", "EXPERTS");
  }
  for (const auto& m : r["models"]) {
    const std::string idle = std::to_string(static_cast<long long>(m.value("idle_s", 0.0))) + " s";
    const std::string age = std::to_string(static_cast<long long>(m.value("age_s", 0.0))) + " s";
    std::string ttl = m.value("pinned", false) ? "pinned" : "off";
    if (const auto it = m.find("idle_ttl_s"); it != m.end() && it->is_number()) {
      ttl = std::to_string(static_cast<long long>(it->get<double>())) + " s";
    }
    std::printf("  %-32s %10s  %-6s %8s %9s %8s %6llu %8lld  %s\n", m.value("model", "").c_str(),
                human_bytes(m.value("size_bytes", 0.0)).c_str(), m.value("in_use", false) ? "in use" : "idle",
                idle.c_str(), ttl.c_str(), age.c_str(), m.value("hits", 0ull), m.value("context_length", 0ll),
                m.value("streaming", false) ? "streamed" : "-");
  }
  const json& q = r["requests"];
  std::printf("requests: %llu total, %llu in flight, %llu refused busy; uptime %.0f s; engine %s\n",
              q.value("total", 0ull), q.value("in_flight", 0ull), q.value("busy_rejections", 0ull),
              r.value("uptime_s", 0.0), r.value("engine", "?").c_str());
}

void setup_client_commands(CLI::App& root) {
  // Options live as long as the app (static storage: one command runs per process).
  static ClientOptions common;

  {
    static std::string model;
    static std::optional<int64_t> keep_alive;
    auto* cmd = root.add_subcommand("load", "Ask the daemon to load MODEL into its cache");
    cmd->add_option("model", model, "model id (<models dir>/<id>.gguf)")->required();
    cmd->add_option("--keep-alive", keep_alive,
                    "seconds the model stays loaded after this request, 0 = unload after it (default: the "
                    "daemon's)");
    add_common(cmd, common);
    cmd->callback([] {
      const bool tty = ::isatty(STDERR_FILENO) != 0 && !common.json_output;
      bool shown = false;
      model = model_id(model);
      json req = {{"op", "load"}, {"model", model}};
      if (keep_alive) req["keep_alive"] = *keep_alive;
      check_request(req);
      auto reply = exchange(common, req, nullptr, [&](double elapsed) {
        if (tty && elapsed >= 1.0) {
          std::fprintf(stderr, "\rloading %s... %.1f s", model.c_str(), elapsed);
          std::fflush(stderr);
          shown = true;
        }
      });
      if (shown) std::fprintf(stderr, "\r\033[K");
      if (common.json_output) return;
      const json& r = reply.result;
      // How long it stays: pinned, for its keep-alive / the idle TTL after its last use, or not at all.
      std::string stays;
      if (!r.value("retained", true)) {
        stays = "; not kept loaded";
      } else if (r.value("pinned", false)) {
        stays = "; pinned";
      } else if (const auto it = r.find("keep_alive_s"); it != r.end() && it->is_number()) {
        stays = "; unloaded after " + std::to_string(static_cast<long long>(it->get<double>())) + " s unused";
      }
      std::printf("%s: %s (%s, %.0f ms%s%s)\n", model.c_str(),
                  r.value("cached", false) ? "already loaded" : "loaded", human_bytes(r.value("size_bytes", 0.0)).c_str(),
                  r.value("load_ms", 0.0), r.value("streaming", false) ? ", experts streamed from disk" : "",
                  stays.c_str());
    });
  }

  {
    static std::string model, prompt;
    static int max_tokens = 128;
    static std::optional<double> temperature, top_p, min_p, repeat_penalty;
    static std::optional<int> top_k, repeat_last_n, top_logprobs, num_ctx;
    static std::optional<uint64_t> seed;
    static std::optional<int64_t> keep_alive, deadline_ms;
    static std::vector<std::string> stop;
    static bool no_stream = false, ignore_eos = false, logprobs = false;
    auto* cmd = root.add_subcommand("infer", "Generate from MODEL through the daemon, printing tokens as they come");
    cmd->add_option("model", model, "model id")->required();
    cmd->add_option("prompt", prompt, "the prompt ('-' reads standard input)")->required();
    cmd->add_option("--max-tokens,-n", max_tokens, "tokens to generate at most")->capture_default_str();
    // The sampler's settings: sent only when given, so an absent one keeps the daemon's default
    // (docs/protocol.md lists them); their ranges are checked by the protocol's own parser before sending.
    cmd->add_option("--temperature", temperature, "sampling temperature, 0 = greedy (default: the daemon's)");
    cmd->add_option("--top-k", top_k, "top-k, 0 = off (default: the daemon's)");
    cmd->add_option("--top-p", top_p, "top-p, 1 = off (default: the daemon's)");
    cmd->add_option("--min-p", min_p, "min-p, 0 = off (default: the daemon's)");
    cmd->add_option("--repeat-penalty", repeat_penalty, "repetition penalty, 1 = off (default: the daemon's)");
    cmd->add_option("--repeat-last-n", repeat_last_n,
                    "how many of the last tokens the penalty looks at (default: the daemon's)");
    cmd->add_option("--seed", seed, "sampling seed (default: a fresh one, reported with --json)");
    cmd->add_option("--stop", stop, "stop string (repeatable)");
    cmd->add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-sequence tokens");
    cmd->add_flag("--logprobs", logprobs, "print each generated token's log-probability after the text");
    cmd->add_option("--top-logprobs", top_logprobs,
                    "also the N most likely tokens at each position, at most " +
                        std::to_string(limits::kMaxTopLogprobs) + " (implies --logprobs; default: 0)");
    cmd->add_option("--num-ctx", num_ctx,
                    "this request's context window in tokens, 0 = the context the model is loaded with "
                    "(default: the daemon's)");
    cmd->add_option("--keep-alive", keep_alive,
                    "seconds the model stays loaded after this request, 0 = unload after it (default: the "
                    "daemon's)");
    cmd->add_option("--deadline-ms", deadline_ms,
                    "end the request this many milliseconds after the daemon receives it (finish reason "
                    "\"deadline\", or deadline_exceeded when it had not started; default: none)");
    cmd->add_flag("--no-stream", no_stream, "print the text only when generation ends");
    add_common(cmd, common);
    cmd->callback([] {
      if (prompt == "-") {
        auto in = read_stdin_text();
        if (!in) fail(2, in.error().message);
        prompt = std::move(*in);
      }
      json req = {{"op", "infer"}, {"model", model_id(model)}, {"prompt", prompt}, {"max_tokens", max_tokens}};
      if (temperature) req["temperature"] = *temperature;
      if (top_k) req["top_k"] = *top_k;
      if (top_p) req["top_p"] = *top_p;
      if (min_p) req["min_p"] = *min_p;
      if (repeat_penalty) req["repeat_penalty"] = *repeat_penalty;
      if (repeat_last_n) req["repeat_last_n"] = *repeat_last_n;
      if (seed) req["seed"] = *seed;
      if (!stop.empty()) req["stop"] = stop;
      if (ignore_eos) req["ignore_eos"] = true;
      if (logprobs) req["logprobs"] = true;
      if (top_logprobs) req["top_logprobs"] = *top_logprobs;
      if (num_ctx) req["num_ctx"] = *num_ctx;
      if (keep_alive) req["keep_alive"] = *keep_alive;
      if (deadline_ms) req["deadline_ms"] = *deadline_ms;
      const bool stream = !no_stream && !common.json_output;
      req["stream"] = stream;
      check_request(req);
      auto reply = exchange(common, req, [&](const protocol::Reply& ev) {
        if (ev.event != "token") return;
        std::string text = ev.raw.value("text", "");
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      });
      if (common.json_output) return;
      const json& r = reply.result;
      if (!stream) std::fputs(r.value("text", "").c_str(), stdout);
      std::fputc('\n', stdout);
      // The streamed events carried the same entries; the result's array has them all in one place.
      if (const auto it = r.find("logprobs"); it != r.end() && it->is_array()) print_logprobs(*it);
      std::fflush(stdout);  // the text before the summary on stderr
      const json& t = r["timings"];
      std::fprintf(stderr, "[%zu token(s), finish: %s; load %.0f ms, queue %.0f ms, prompt %.0f ms, decode %.0f ms]\n",
                   r["tokens"].size(), r.value("finish_reason", "?").c_str(), t.value("load_ms", 0.0),
                   t.value("queue_ms", 0.0), t.value("prompt_ms", 0.0), t.value("decode_ms", 0.0));
    });
  }

  {
    auto* cmd = root.add_subcommand("stats", "The daemon's cache, models and request counters");
    add_common(cmd, common);
    cmd->callback([] {
      auto reply = exchange(common, {{"op", "stats"}}, nullptr);
      if (!common.json_output) print_stats(reply.result);
    });
  }

  {
    auto* cmd = root.add_subcommand("metrics",
                                    "The daemon's metrics in the Prometheus text format (docs/metrics.md)");
    add_common(cmd, common);
    cmd->callback([] {
      auto reply = exchange(common, {{"op", "metrics"}}, nullptr);
      if (!common.json_output) std::fputs(reply.result.value("text", "").c_str(), stdout);
    });
  }

  {
    static std::string model;
    auto* cmd = root.add_subcommand("invalidate", "Drop MODEL from the daemon's cache");
    cmd->add_option("model", model, "model id")->required();
    add_common(cmd, common);
    cmd->callback([] {
      model = model_id(model);
      auto reply = exchange(common, {{"op", "invalidate"}, {"model", model}}, nullptr);
      if (!common.json_output) {
        std::printf("%s: %s\n", model.c_str(), reply.result.value("evicted", false) ? "evicted" : "was not loaded");
      }
    });
  }

  {
    auto* cmd = root.add_subcommand("list", "The models in the daemon's models directory");
    add_common(cmd, common);
    cmd->callback([] {
      auto reply = exchange(common, {{"op", "list"}}, nullptr);
      if (common.json_output) return;
      const json& r = reply.result;
      std::printf("models in %s:\n", r.value("models_dir", "?").c_str());
      if (r["models"].empty()) {
        std::printf("  (none)\n");
        return;
      }
      auto text = [](const json& m, const char* key) {
        auto it = m.find(key);
        return it == m.end() || !it->is_string() ? std::string("-") : it->get<std::string>();
      };
      std::printf("  %-32s %-10s %8s %-10s %10s  %-6s  %s\n", "MODEL", "ARCH", "PARAMS", "QUANT", "SIZE",
                  "LOADED", "IDLE EVICTION");
      for (const auto& m : r["models"]) {
        const json& params = m.contains("params") ? m["params"] : json();
        const std::string p = params.is_number_unsigned() ? gguf::format_count(params.get<uint64_t>()) : "-";
        std::string eviction = "-";
        if (const auto it = m.find("idle_eviction_s"); it != m.end() && it->is_number()) {
          eviction = "in " + std::to_string(static_cast<long long>(it->get<double>())) + " s";
        } else if (m.value("pinned", false)) {
          eviction = "pinned";  // never idle-evicted (CAR_INFERENCE_PIN_MODELS)
        } else if (m.value("loaded", false)) {
          eviction = "no";  // in use, or idle eviction off
        }
        std::printf("  %-32s %-10s %8s %-10s %10s  %-6s  %s\n", m.value("model", "").c_str(),
                    text(m, "arch").c_str(), p.c_str(), text(m, "quant").c_str(),
                    human_bytes(m.value("size_bytes", 0.0)).c_str(), m.value("loaded", false) ? "yes" : "no",
                    eviction.c_str());
      }
    });
  }

  {
    auto* cmd = root.add_subcommand("health", "Is the daemon up?");
    add_common(cmd, common);
    cmd->callback([] {
      auto reply = exchange(common, {{"op", "health"}}, nullptr);
      if (common.json_output) return;
      const json& r = reply.result;
      std::printf("%s (engine: %s, up %.0f s, %d model(s) loaded, %d request(s) in flight)\n",
                  r.value("status", "?").c_str(), r.value("engine", "?").c_str(), r.value("uptime_s", 0.0),
                  r.value("models_loaded", 0), r.value("in_flight", 0));
    });
  }
}

CAR_REGISTER_COMMANDS(setup_client_commands);

}  // namespace
}  // namespace car::tools::cmd_client
