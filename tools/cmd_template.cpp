// `car template render TEMPLATE.jinja --context CONTEXT.json`: renders any Jinja template with a JSON
// context (its top-level keys are the variables) and writes exactly the rendered text to standard output,
// nothing added; on failure the template's error goes to standard error and the exit status is 1.
// `car template FILE.gguf [--messages JSON] [--no-generation-prompt]`: what a conversation renders to with
// the model's own tokenizer.chat_template, bos_token / eos_token taken from its vocabulary (for checking a
// model's prompt format). `--js-compat` renders as @huggingface/jinja does where it differs from Python
// Jinja2 (docs/chat.md).
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string_view>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/chat/chat.h"
#include "core/chat/jinja.h"
#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/error_codes.h"
#include "tools/command_registry.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_template {
namespace {

struct TemplateOptions {
  std::string file;
  std::string template_file;
  std::string context_file;
  std::string messages;
  bool no_generation_prompt = false;
  bool js_compat = false;
};

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "car template: %s\n", msg.c_str());
  throw CommandFailed(1);
}

std::string read_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(std::string("cannot read ") + what + " " + path + ": not a file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  if (in) ss << in.rdbuf();
  if (!in || in.bad()) fail(std::string("cannot read ") + what + " " + path);
  return std::move(ss).str();
}

void write_all(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0) {
    fail("cannot write standard output");
  }
}

void report(const Error& e) {
  if (e.code == errc::kRaiseException) fail("the template raised: " + e.message);
  fail(e.message);
}

/// strftime_now()'s clock: SOURCE_DATE_EPOCH when set (the reproducible-builds convention: seconds since
/// the epoch, rendered in UTC), so that a rendering can be reproduced byte for byte; else the system's.
std::optional<std::tm> fixed_clock() {
  const char* epoch = std::getenv("SOURCE_DATE_EPOCH");
  if (epoch == nullptr || *epoch == '\0') return std::nullopt;
  const std::string_view text(epoch);
  int64_t seconds = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec != std::errc() || end != text.data() + text.size() || seconds < 0) {
    fail("SOURCE_DATE_EPOCH must be a whole number of seconds since 1970-01-01 UTC, got '" + std::string(text) +
         "'");
  }
  const auto t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) fail("SOURCE_DATE_EPOCH is out of range: " + std::string(text));
  return tm;
}

void run_render(const TemplateOptions& o) {
  const std::string source = read_file(o.template_file, "template");
  nlohmann::ordered_json ctx;
  try {
    ctx = nlohmann::ordered_json::parse(read_file(o.context_file, "context"));
  } catch (const nlohmann::json::exception& e) {
    fail(o.context_file + ": not JSON: " + e.what());
  }
  if (!ctx.is_object())
    fail(o.context_file + ": the context must be a JSON object (its keys are the variables)");
  chat::RenderOptions ro;
  ro.js_strip_quirk = o.js_compat;
  ro.now = fixed_clock();
  if (chat::json_depth(ctx) > chat::kMaxJsonDepth) {
    fail(o.context_file + ": the context nests deeper than " + std::to_string(chat::kMaxJsonDepth) +
         " levels");
  }
  auto out = chat::render_template(source, chat::Value::from_json(ctx), ro);
  if (!out) report(out.error());
  write_all(*out);
}

void run_gguf(const TemplateOptions& o) {
  if (o.file.empty()) fail("give a GGUF file, or `render TEMPLATE --context JSON` (see --help)");
  nlohmann::ordered_json messages;
  const std::string text =
      o.messages.empty()
          ? R"([{"role":"user","content":"Hello!"},{"role":"assistant","content":"Hi, how can I help?"},)"
            R"({"role":"user","content":"What is 2+2?"}])"
          : o.messages;
  try {
    messages = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("--messages is not JSON: ") + e.what());
  }
  auto file = gguf::GgufFile::open(o.file);
  if (!file) fail(o.file + ": " + file.error().message);
  if (!(*file)->has("tokenizer.chat_template")) fail(o.file + ": the model has no tokenizer.chat_template");
  auto tpl = (*file)->get_string("tokenizer.chat_template");
  if (!tpl) fail(o.file + ": " + tpl.error().message);
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok) fail(o.file + ": " + tok.error().message);
  chat::ChatOptions co;
  co.add_generation_prompt = !o.no_generation_prompt;
  co.render.js_strip_quirk = o.js_compat;
  co.render.now = fixed_clock();
  if ((*tok)->bos() >= 0) co.bos_token = (*tok)->token_to_piece((*tok)->bos(), true);
  if ((*tok)->eos() >= 0) co.eos_token = (*tok)->token_to_piece((*tok)->eos(), true);
  auto out = chat::render_chat(*tpl, messages, co);
  if (!out) report(out.error());
  write_all(*out);
}

void setup(CLI::App& root) {
  auto o = std::make_shared<TemplateOptions>();
  auto* cmd = root.add_subcommand(
      "template", "Render a model's chat template, or any Jinja template with a JSON context");
  cmd->add_option("file", o->file, "GGUF model whose tokenizer.chat_template to render");
  cmd->add_option("--messages", o->messages,
                  "The conversation: a JSON array of {\"role\", \"content\", ...} (default: a short sample)");
  cmd->add_flag("--no-generation-prompt", o->no_generation_prompt, "Render with add_generation_prompt false");
  cmd->add_flag("--js-compat", o->js_compat,
                "Render as @huggingface/jinja where it differs from Python Jinja2");
  auto* render = cmd->add_subcommand(
      "render", "Render TEMPLATE with the variables of a JSON object; prints exactly the output");
  render->add_option("template", o->template_file, "Jinja template file")->required();
  render->add_option("--context", o->context_file, "JSON file: an object whose keys are the variables")
      ->required();
  render->add_flag("--js-compat", o->js_compat,
                   "Render as @huggingface/jinja where it differs from Python Jinja2");
  render->callback([o] { run_render(*o); });
  cmd->callback([o, render] {
    if (render->parsed()) return;
    run_gguf(*o);
  });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup);

}  // namespace car::tools::cmd_template
