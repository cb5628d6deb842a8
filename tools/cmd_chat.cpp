// `car chat MODEL [--system TEXT] [--chat-template FILE] [-n N] [--temperature T] [--seed S]`: an interactive
// conversation with a model through the daemon. Each line typed is a user turn; the whole conversation so
// far goes out as `messages` in one streamed `infer` (the daemon renders it with the model's chat template,
// or the one given), and the answer, printed as it streams, joins the history.
//
// Lines starting with '/' are commands: /reset forgets the conversation (the system message stays), /exit
// (or end of input) leaves. Ctrl-C while an answer streams cancels that answer (a `cancel` on the same
// connection; the turn is dropped from the history) and returns to the prompt; Ctrl-C at the prompt only
// says how to leave. Exit codes as for the other client commands: 0, 1 the daemon refused (for example no
// chat template), 3 unreachable.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/settings.h"
#include "core/chat/model_chat.h"
#include "core/util/error_codes.h"
#include "core/util/limits.h"
#include "daemon/client.h"
#include "daemon/protocol.h"
#include "tools/command_registry.h"
#include "tools/socket_discovery.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_chat {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) { g_interrupted.store(true); }

struct ChatFlags {
  std::string model;
  std::string socket;
  std::string system;
  std::string chat_template_file;
  int max_tokens = 512;
  std::optional<double> temperature;
  std::optional<uint64_t> seed;
};

[[noreturn]] void fail(int code, const std::string& msg) {
  std::fprintf(stderr, "car chat: %s\n", msg.c_str());
  throw CommandFailed(code);
}

/// One line from standard input without its newline; nullopt at end of input. A Ctrl-C while waiting
/// returns an empty line with g_interrupted set (read(2) fails with EINTR: the handler is installed
/// without SA_RESTART).
std::optional<std::string> read_line() {
  std::string line;
  for (;;) {
    char c;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 1) {
      if (c == '\n') return line;
      line.push_back(c);
    } else if (n == 0) {
      if (line.empty()) return std::nullopt;
      return line;
    } else if (errno == EINTR) {
      if (g_interrupted.load()) return std::string();
    } else {
      fail(2, std::string("cannot read standard input: ") + std::strerror(errno));
    }
  }
}

/// Outcome of one turn: the answer text, or nullopt when it was cancelled or refused.
std::optional<std::string> ask(protocol::ClientConnection& conn, const ChatFlags& f, const json& messages,
                               const std::optional<std::string>& tpl, int id) {
  json req = {{"id", id}, {"op", "infer"}, {"model", f.model}, {"messages", messages},
              {"max_tokens", f.max_tokens}, {"stream", true}};
  if (f.temperature) req["temperature"] = *f.temperature;
  if (f.seed) req["seed"] = *f.seed;
  if (tpl) req["chat_template"] = *tpl;
  g_interrupted.store(false);
  if (auto sent = conn.send_line(req.dump()); !sent) {
    // Refused (too_many_connections): the daemon wrote why and closed before the request went out.
    if (auto refusal = conn.pending_error(1s)) {
      fail(kExitDaemonError, refusal->error_code + ": " + refusal->error_message);
    }
    fail(kExitUnreachable, sent.error().message);
  }
  bool cancel_sent = false;
  bool wrote_text = false;  // the answer's line is open on stdout
  for (;;) {
    if (g_interrupted.load() && !cancel_sent) {
      json cancel = {{"id", id + 1}, {"op", "cancel"}, {"target", id}};
      if (auto sent = conn.send_line(cancel.dump()); !sent) fail(kExitUnreachable, sent.error().message);
      cancel_sent = true;
    }
    auto line = conn.read_line(100ms);
    if (!line) {
      if (g_interrupted.load()) continue;  // a read interrupted by Ctrl-C: send the cancel, read on
      fail(kExitUnreachable, line.error().message);
    }
    if (!line->has_value()) continue;
    auto reply = protocol::parse_reply(**line);
    if (!reply) fail(kExitUnreachable, reply.error().message);
    if (reply->is_event) {
      const std::string text = reply->raw.value("text", "");
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      wrote_text = wrote_text || !text.empty();
      continue;
    }
    if (reply->id != id) continue;  // the cancel's own reply
    if (wrote_text || reply->ok) {  // end the answer's line; a refusal before any text prints no empty line
      std::printf("\n");
      std::fflush(stdout);
    }
    if (!reply->ok) {
      if (reply->error_code == errc::kCancelled) {
        std::fprintf(stderr, "[cancelled]\n");
        return std::nullopt;
      }
      std::string message = reply->error_message;
      // The daemon says how a socket request gives a template; here it is the flag.
      if (reply->error_code == errc::kBadRequest && message.starts_with(chat::kNoChatTemplateMessage)) {
        message = std::string(chat::kNoChatTemplateMessage) + ": give one with --chat-template FILE";
      }
      std::fprintf(stderr, "car chat: %s: %s\n", reply->error_code.c_str(), message.c_str());
      if (reply->error_code == errc::kBadRequest || reply->error_code == errc::kNotFound ||
          reply->error_code == errc::kForbidden || reply->error_code == errc::kLoadFailed) {
        throw CommandFailed(kExitDaemonError);  // nothing later in this conversation can succeed
      }
      return std::nullopt;
    }
    if (reply->result.value("finish_reason", "") == "cancelled") {
      std::fprintf(stderr, "[cancelled]\n");
      return std::nullopt;
    }
    return reply->result.value("text", "");
  }
}

void chat(const ChatFlags& f) {
  std::optional<std::string> tpl;
  if (!f.chat_template_file.empty()) {
    std::ifstream in(f.chat_template_file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) fail(2, "--chat-template: cannot read " + f.chat_template_file);
    tpl = text.str();
  }
  auto conn = protocol::ClientConnection::connect_first(
      socket_candidates(f.socket, config::current_environment(), ::geteuid()));
  if (!conn) fail(kExitUnreachable, conn.error().message);

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking read returns EINTR
  ::sigaction(SIGINT, &sa, nullptr);

  const bool tty = ::isatty(STDIN_FILENO) != 0;
  json history = json::array();
  if (!f.system.empty()) history.push_back({{"role", "system"}, {"content", f.system}});
  const size_t base = history.size();
  if (tty) std::fprintf(stderr, "chatting with %s: /reset forgets, /exit or Ctrl-D leaves, Ctrl-C stops an answer\n",
                        f.model.c_str());
  int id = 1;
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    g_interrupted.store(false);
    auto line = read_line();
    if (!line) break;
    if (g_interrupted.load()) {
      std::fprintf(stderr, "\n(/exit or Ctrl-D leaves)\n");
      continue;
    }
    if (*line == "/exit" || *line == "/quit") break;
    if (*line == "/reset") {
      history.erase(history.begin() + static_cast<std::ptrdiff_t>(base), history.end());
      std::fprintf(stderr, "[conversation reset]\n");
      continue;
    }
    if (!line->empty() && line->front() == '/') {
      std::fprintf(stderr, "unknown command %s: /reset, /exit\n", line->c_str());
      continue;
    }
    if (line->find_first_not_of(" \t\r") == std::string::npos) continue;
    history.push_back({{"role", "user"}, {"content", *line}});
    auto answer = ask(*conn, f, history, tpl, id);
    id += 2;
    if (answer) {
      history.push_back({{"role", "assistant"}, {"content", *answer}});
    } else {
      history.erase(history.end() - 1);  // the turn that got no answer
    }
  }
}

void setup_chat(CLI::App& root) {
  auto flags = std::make_shared<ChatFlags>();
  auto* cmd = root.add_subcommand("chat", "Chat with MODEL through the daemon (its chat template, history kept)");
  cmd->add_option("model", flags->model, "model id")->required();
  cmd->add_option("--system", flags->system, "A system message that opens the conversation");
  cmd->add_option("--chat-template", flags->chat_template_file, "A Jinja file used instead of the model's template");
  cmd->add_option("--max-tokens,-n", flags->max_tokens, "Tokens per answer at most")->check(CLI::Range(1, limits::kMaxGenerateTokens));
  cmd->add_option("--temperature", flags->temperature, "Sampling temperature (0 = greedy)");
  cmd->add_option("--seed", flags->seed, "Sampling seed");
  cmd->add_option("--socket", flags->socket, "The daemon's socket (default: as for the other client commands)");
  cmd->callback([flags] { chat(*flags); });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup_chat);

}  // namespace car::tools::cmd_chat
