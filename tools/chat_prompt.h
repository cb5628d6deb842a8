// The prompt of a conversation rendered with a GGUF model's chat template, for the offline commands
// (`car run --chat`): opens the file and its tokenizer, then core/chat's render_model_chat, which the
// daemon calls on the model it has loaded.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/chat/model_chat.h"
#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/error_codes.h"
#include "core/util/result.h"

namespace car::tools {

/// Errors: the GGUF/tokenizer errors (the message names the file) and render_model_chat's.
inline Result<chat::ModelChatPrompt> render_model_chat(const std::string& path,
                                                       const nlohmann::ordered_json& messages,
                                                       const std::optional<std::string>& template_override,
                                                       bool add_generation_prompt) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return file.error();
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok) return tok.error();
  auto p = chat::render_model_chat(**file, **tok, messages, template_override, add_generation_prompt);
  if (!p && p.error().code == errc::kNoChatTemplate) {
    return make_error(errc::kNoChatTemplate,
                      path + ": " + std::string(chat::kNoChatTemplateMessage) + ": give one with --chat-template FILE");
  }
  return p;
}

}  // namespace car::tools
