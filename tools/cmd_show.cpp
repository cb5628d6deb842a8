// `car show MODEL|FILE [--json] [--models-dir DIR] [--ctx N]`: what a model is, read from its GGUF header
// (no daemon needed, no tensor data read): architecture, parameter count, quantization by name, context
// length, vocabulary, experts, whether it carries a chat template, file size, and the memory a load needs
// (the estimate the daemon's cache budget uses).
//
// MODEL is a path when it names an existing file, else a model id looked up as <models dir>/<id>.gguf
// (--models-dir, else CAR_INFERENCE_MODELS_DIR, else a running daemon's, else the daemon's default; see
// tools/model_path.h); a trailing ".gguf" on an id is accepted. Exit status: 0, 1 when the file cannot be read as a model, 2 on bad input (no such model).
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/engine/engine.h"
#include "core/util/limits.h"
#include "core/gguf/model_info.h"
#include "tools/command_registry.h"
#include "tools/model_path.h"
#include "tools/offline_env.h"
#include "tools/terminal_text.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_show {
namespace {

struct ShowFlags {
  std::string model;
  std::string models_dir;
  int context = 0;
  bool json = false;
};

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "car show: %s\n", message.c_str());
  throw CommandFailed(code);
}

/// MODEL as a file path (tools/model_path.h).
std::string resolve(const ShowFlags& f) { return resolve_model_path(f.model, f.models_dir, "car show"); }

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void show(const ShowFlags& f) {
  const std::string path = resolve(f);
  auto opened = gguf::GgufFile::open(path);
  if (!opened) fail(1, terminal_text(opened.error().message, false) + " [" + opened.error().code + "]");
  const gguf::ModelInfo info = gguf::describe_model(**opened);

  engine::LoadOptions load;
  load.context_length = f.context;
  load.stream_experts = StreamExperts::off;  // the resident figure: what the whole model needs
  const auto memory = engine::estimate_memory(path, load);

  if (f.json) {
    nlohmann::ordered_json out;
    out["file"] = path;
    out["architecture"] = info.architecture;
    out["name"] = info.name;
    out["parameters"] = info.parameters;
    out["quantization"] = info.quantization;
    out["file_type"] =
        info.file_type ? nlohmann::ordered_json(*info.file_type) : nlohmann::ordered_json(nullptr);
    const auto opt = [](const std::optional<uint64_t>& v) {
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
    };
    out["context_length"] = opt(info.context_length);
    out["embedding_length"] = opt(info.embedding_length);
    out["block_count"] = opt(info.block_count);
    out["vocab_size"] = opt(info.vocab_size);
    out["tokenizer"] = info.tokenizer_model;
    out["expert_count"] = opt(info.expert_count);
    out["expert_used_count"] = opt(info.expert_used_count);
    out["chat_template"] = info.has_chat_template;
    out["file_bytes"] = info.file_bytes;
    nlohmann::ordered_json types = nlohmann::ordered_json::object();
    for (const auto& [name, bytes] : info.bytes_by_type) types[name] = bytes;
    out["bytes_by_type"] = types;
    if (memory) {
      out["memory"] = {{"total_bytes", memory->total()},
                       {"weights", memory->weights},
                       {"kv_cache", memory->kv_cache},
                       {"scratch", memory->scratch},
                       {"logits", memory->logits}};
    } else {
      out["memory"] = {{"error", memory.error().code + ": " + memory.error().message}};
    }
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return;
  }

  const auto row = [](const char* label, const std::string& value) {
    std::printf("  %-15s %s\n", label, value.c_str());
  };
  std::printf("%s\n", terminal_text(path, false).c_str());
  row("architecture", info.architecture.empty() ? "(none)" : terminal_text(info.architecture, false));
  if (!info.name.empty()) row("name", terminal_text(info.name, false, 200));
  row("parameters", gguf::format_count(info.parameters));
  std::string quant = info.quantization;
  if (info.file_type) quant += "  (general.file_type " + std::to_string(*info.file_type) + ")";
  row("quantization", quant);
  if (info.context_length) row("context length", std::to_string(*info.context_length) + " tokens (trained)");
  if (info.embedding_length || info.block_count) {
    row("shape",
        (info.embedding_length ? "embedding " + std::to_string(*info.embedding_length) : std::string()) +
            (info.block_count ? ", " + std::to_string(*info.block_count) + " layers" : std::string()));
  }
  if (info.vocab_size) {
    row("vocabulary",
        std::to_string(*info.vocab_size) + " tokens" +
            (info.tokenizer_model.empty() ? "" : " (" + terminal_text(info.tokenizer_model, false) + ")"));
  }
  if (info.expert_count && *info.expert_count > 0) {
    row("experts", std::to_string(*info.expert_count) + ", " +
                       (info.expert_used_count ? std::to_string(*info.expert_used_count) : "?") +
                       " used per token");
  } else {
    row("experts", "none (dense)");
  }
  row("chat template", info.has_chat_template ? "yes" : "no");
  row("file size", mib(info.file_bytes));
  if (memory) {
    row("memory to load", mib(memory->total()) + " (weights " + mib(memory->weights) + ", KV cache " +
                              mib(memory->kv_cache) + ", scratch " + mib(memory->scratch + memory->logits) +
                              ")");
  } else {
    row("memory to load", "unknown: " + terminal_text(memory.error().message, false));
  }
  std::string types;
  for (const auto& [name, bytes] : info.bytes_by_type) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.1f%%", types.empty() ? "" : ", ", name.c_str(),
                  info.tensor_bytes
                      ? 100.0 * static_cast<double>(bytes) / static_cast<double>(info.tensor_bytes)
                      : 0.0);
    types += buf;
  }
  row("tensor types", types);
}

void setup_show(CLI::App& root) {
  auto flags = std::make_shared<ShowFlags>();
  auto* cmd =
      root.add_subcommand("show", "Describe a model: architecture, size, quantization, memory it needs");
  cmd->add_option("model", flags->model, "A GGUF file, or a model id in the models directory")->required();
  cmd->add_option("--models-dir", flags->models_dir,
                  "Where model ids are looked up (default: CAR_INFERENCE_MODELS_DIR, else a running daemon's, else the daemon's default)");
  cmd->add_option("--ctx", flags->context, "Context the memory figure assumes; 0 = min(model's, 4096)")
      ->check(CLI::Range(0, limits::kMaxContextTokens));
  cmd->add_flag("--json", flags->json, "Print one JSON object");
  cmd->callback([flags] { show(*flags); });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup_show);

}  // namespace car::tools::cmd_show
