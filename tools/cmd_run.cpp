// `car run FILE.gguf PROMPT`: load a model in-process (no daemon) and generate from it. PROMPT may also be
// given as --prompt TEXT (scripts use it); "-" reads standard input, as in `car infer` and `car tokenize`.
// `--chat MESSAGE` instead renders one user message with the model's chat template (or --chat-template).
//
// Human mode streams the generated text to stdout as tokens arrive and prints the timings to stderr;
// `--json` prints the one object CONTRACT.md describes (prompt_tokens, tokens, text, finish_reason,
// timings, top_logprobs, experts). A streamed model's expert usage sidecar (in --state-dir or
// CAR_INFERENCE_STATE_DIR) is saved before the command exits. Exit status: 0 on success, 1 when loading or
// generation fails, 2 on bad input this file checks (ids, settings from the environment); flags CLI11 rejects
// exit with its own codes.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/util/error_codes.h"
#include "core/util/limits.h"
#include "tools/chat_prompt.h"
#include "tools/command_registry.h"
#include "tools/model_path.h"
#include "tools/offline_env.h"
#include "tools/stdin_text.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_run {
namespace {

struct RunFlags {
  std::string path;
  std::string models_dir;  // --models-dir: where a model id is looked up
  std::string prompt;
  std::string prompt_flag;  // --prompt, the older spelling of the positional PROMPT
  std::string prompt_ids;
  int max_tokens = 128;
  engine::SamplingParams sampling;
  std::optional<uint64_t> seed;  // absent: a fresh random seed, printed so the run can be repeated
  std::vector<std::string> stop;
  int top_logprobs = 0;
  EngineFlags engine;  // --threads, --stream-experts, --expert-ram-gb, --state-dir, --no-prefetch
  int context = 0;
  bool no_bos = false;
  bool parse_special = false;
  bool json = false;
  bool no_stream = false;
  std::string chat;           // --chat: one user message through the model's chat template
  std::string chat_template;  // --chat-template: a Jinja file instead of the model's template
};

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "car run: %s\n", message.c_str());
  throw CommandFailed(code);
}

/// "1,2,3" -> ids; spaces around entries allowed. nullopt (with a message) on anything malformed.
std::optional<std::vector<int32_t>> parse_ids(const std::string& text, std::string* error) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    item = first == std::string::npos ? std::string() : item.substr(first, last - first + 1);
    const auto v = parse_count(item);
    if (!v || *v > INT32_MAX) {
      *error =
          "--prompt-ids: '" + item + "' is not a token id (expected comma-separated non-negative integers)";
      return std::nullopt;
    }
    ids.push_back(static_cast<int32_t>(*v));
    pos = comma + 1;
  }
  return ids;
}

double per_second(size_t n, double ms) {
  return ms > 0 ? static_cast<double>(n) * 1000.0 / ms : 0.0;
}

void run(const RunFlags& f) {
  auto load_or = f.engine.load_options(f.context);
  if (!load_or) fail(2, load_or.error().message);
  engine::LoadOptions load = std::move(*load_or);

  if (!f.prompt.empty() && !f.prompt_flag.empty())
    fail(2, "give the prompt once: PROMPT or --prompt, not both");
  std::string prompt = f.prompt.empty() ? f.prompt_flag : f.prompt;
  if (!prompt.empty() && !f.prompt_ids.empty()) fail(2, "give PROMPT or --prompt-ids, not both");
  if (prompt == "-") {
    auto in = read_stdin_text();  // before the model file is opened (descriptor 0 may be closed)
    if (!in) fail(2, in.error().message);
    prompt = std::move(*in);
    if (prompt.empty()) fail(2, "standard input is empty: nothing to generate from");
  }
  engine::GenerateRequest req;
  req.prompt = prompt;
  req.add_bos = !f.no_bos;
  req.parse_special = f.parse_special;
  if (!f.chat.empty()) {
    // The conversation rendered with the model's template, special-token text parsed, and no BOS added
    // when the template already wrote one.
    if (!prompt.empty() || !f.prompt_ids.empty()) fail(2, "--chat excludes PROMPT, --prompt and --prompt-ids");
    std::optional<std::string> tpl;
    if (!f.chat_template.empty()) {
      std::ifstream in(f.chat_template, std::ios::binary);
      std::ostringstream ss;
      if (in) ss << in.rdbuf();
      if (!in || in.bad()) fail(2, "--chat-template: cannot read " + f.chat_template);
      tpl = std::move(ss).str();
    }
    const nlohmann::ordered_json messages =
        nlohmann::ordered_json::array({{{"role", "user"}, {"content", f.chat}}});
    auto p = render_model_chat(f.path, messages, tpl, true);
    if (!p) {
      const bool input = p.error().code == errc::kRaiseException || p.error().code == errc::kNoChatTemplate;
      fail(input ? 2 : 1, p.error().code + ": " + p.error().message);
    }
    req.prompt = p->text;
    req.parse_special = true;
    req.add_bos = !f.no_bos && !p->starts_with_bos;
  } else if (!f.prompt_ids.empty()) {
    std::string error;
    auto ids = parse_ids(f.prompt_ids, &error);
    if (!ids) fail(2, error);
    req.prompt_ids = std::move(*ids);
  } else if (prompt.empty()) {
    fail(2, "give a PROMPT (or --prompt TEXT, --prompt-ids 1,2,3 or --chat MESSAGE)");
  }
  req.max_tokens = f.max_tokens;
  req.sampling = f.sampling;
  req.sampling.seed = f.seed ? *f.seed : std::random_device{}() & ((uint64_t{1} << 53) - 1);
  req.stop = f.stop;
  req.top_logprobs = f.top_logprobs;

  const auto t0 = std::chrono::steady_clock::now();
  auto model = engine::load_model(f.path, load);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!model) fail(1, model.error().code + ": " + model.error().message);  // the message names the file

  const bool stream = !f.json && !f.no_stream;
  std::function<void(const engine::TokenEvent&)> on_token;
  if (stream) {
    on_token = [](const engine::TokenEvent& ev) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    };
  }
  if (!f.json && !engine::model_stream_reason(**model).empty()) {
    std::fprintf(stderr, "[experts %s: %s]\n",
                 engine::model_streams_experts(**model) ? "streamed" : "resident",
                 engine::model_stream_reason(**model).c_str());
  }
  auto result = engine::generate(**model, req, on_token, nullptr);
  save_expert_usage(**model, "car run");
  if (!result) fail(1, result.error().code + ": " + result.error().message);
  const auto& g = *result;

  const double prompt_tps = per_second(g.prompt_tokens.size(), g.prompt_ms);
  const double decode_tps = per_second(g.tokens.size(), g.decode_ms);
  if (f.json) {
    nlohmann::json out;
    out["prompt_tokens"] = g.prompt_tokens;
    out["tokens"] = g.tokens;
    out["text"] = g.text;
    out["finish_reason"] = g.finish_reason;
    out["seed"] = req.sampling.seed;
    out["timings"] = {{"load_ms", load_ms},
                      {"prompt_ms", g.prompt_ms},
                      {"decode_ms", g.decode_ms},
                      {"prompt_tokens_per_s", prompt_tps},
                      {"decode_tokens_per_s", decode_tps}};
    if (f.top_logprobs > 0) {
      nlohmann::json positions = nlohmann::json::array();
      for (const auto& pos : g.top_logprobs) {
        nlohmann::json entries = nlohmann::json::array();
        for (const auto& e : pos) entries.push_back({{"token", e.token}, {"logprob", e.logprob}});
        positions.push_back(std::move(entries));
      }
      out["top_logprobs"] = std::move(positions);
    }
    out["experts"] = experts_json(**model);
    // Invalid UTF-8 (a model may emit any bytes) becomes U+FFFD instead of an exception.
    const std::string text = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", text.c_str());
    return;
  }
  if (!stream) std::fwrite(g.text.data(), 1, g.text.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr,
               "[load %.1f ms | prompt %zu tokens, %.1f ms, %.1f tok/s | generated %zu tokens, %.1f ms, "
               "%.1f tok/s | finish: %s | seed %llu]\n",
               load_ms, g.prompt_tokens.size(), g.prompt_ms, prompt_tps, g.tokens.size(), g.decode_ms,
               decode_tps, g.finish_reason.c_str(), static_cast<unsigned long long>(req.sampling.seed));
}

void setup_run(CLI::App& root) {
  auto flags = std::make_shared<RunFlags>();
  auto* cmd = root.add_subcommand("run", "Load a GGUF model in-process and generate (no daemon)");
  cmd->add_option("file", flags->path, "GGUF model file, or a model id in the models directory")->required();
  cmd->add_option("--models-dir", flags->models_dir,
                  "Where model ids are looked up (default: CAR_INFERENCE_MODELS_DIR, else a running daemon's, else "
                  "the daemon's default)");
  cmd->add_option("prompt", flags->prompt,
                  "Prompt text, tokenized with the model's tokenizer ('-' reads standard input)");
  cmd->add_option("--prompt", flags->prompt_flag, "The same as PROMPT (kept for scripts)");
  cmd->add_option("--prompt-ids", flags->prompt_ids, "Prompt as comma-separated token ids (used as-is)");
  cmd->add_option("--chat", flags->chat,
                  "A user message, rendered with the model's chat template (docs/chat.md) as the prompt");
  cmd->add_option("--chat-template", flags->chat_template,
                  "With --chat: a Jinja file instead of the model's template");
  cmd->add_option("--max-tokens,-n", flags->max_tokens, "Tokens to generate")
      ->check(CLI::Range(0, limits::kMaxGenerateTokens));
  cmd->add_option("--temperature", flags->sampling.temperature, "Temperature; 0 = greedy")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", flags->sampling.top_k, "Keep the k most likely ids; 0 = off")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--top-p", flags->sampling.top_p, "Nucleus threshold; 1 = off")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", flags->sampling.min_p, "Drop ids below min-p x the best's probability; 0 = off")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", flags->sampling.repeat_penalty, "Repetition penalty; 1 = off")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--repeat-last-n", flags->sampling.repeat_last_n,
                  "How many recent ids the penalty looks at; -1 = all, 0 = off")
      ->check(CLI::Range(-1, 1 << 30));
  cmd->add_option("--seed", flags->seed,
                  "Sampling seed (default: a fresh random one, printed with the result)");
  cmd->add_option("--stop", flags->stop, "Stop string (repeatable; not included in the output)");
  cmd->add_option("--top-logprobs", flags->top_logprobs, "Report the K most likely ids per position")
      ->check(CLI::Range(0, 1000));
  flags->engine.add_to(cmd);
  cmd->add_option("--ctx", flags->context, "KV cache size in tokens; 0 = min(model's, 4096)")
      ->check(CLI::Range(0, limits::kMaxContextTokens));
  cmd->add_flag("--no-bos", flags->no_bos, "Do not add BOS to a text prompt");
  cmd->add_flag("--parse-special", flags->parse_special,
                "Let special-token text in the prompt become special tokens");
  cmd->add_flag("--json", flags->json, "Print one JSON object (CONTRACT.md) instead of streaming text");
  cmd->add_flag("--no-stream", flags->no_stream, "Print the text once generation ends");
  cmd->callback([flags] {
    flags->path = resolve_model_path(flags->path, flags->models_dir, "car run");
    run(*flags);
  });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup_run);

}  // namespace car::tools::cmd_run
