// A conversation rendered for one GGUF model: its own chat template (tokenizer.chat_template) or a
// template given instead, with bos_token / eos_token taken from the model's vocabulary. What `car run
// --chat` and the daemon's `infer` with `messages` both call, so the two give the same prompt.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/chat/chat.h"
#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/result.h"

namespace car::chat {

/// The message of a no_chat_template error, without how to give one (each front says its own way after ": ").
inline constexpr std::string_view kNoChatTemplateMessage = "the model has no chat template (tokenizer.chat_template)";

struct ModelChatPrompt {
  std::string text;              ///< the rendered prompt; tokenize it with special-token text parsed
  bool starts_with_bos = false;  ///< the template wrote the BOS text itself: do not add another BOS
  std::string template_source;   ///< "model" (tokenizer.chat_template) or "request" (the override)
};

/// The model's chat template text, or nullopt when the file carries none.
std::optional<std::string> model_chat_template(const gguf::GgufFile& file);

/// Render `messages` with `template_override` when set, else the file's template. Errors:
/// "no_chat_template" (the file has none and none was given), and render_chat's ("bad_messages",
/// "template_syntax", "template_error", "raise_exception", "cancelled" once `render.cancelled` is set).
/// `render` carries the limits (the daemon's own deadline) and the cancel flag.
Result<ModelChatPrompt> render_model_chat(const gguf::GgufFile& file, const tokenizer::Tokenizer& tok,
                                          const nlohmann::ordered_json& messages,
                                          const std::optional<std::string>& template_override,
                                          bool add_generation_prompt, const RenderOptions& render = {});

}  // namespace car::chat
