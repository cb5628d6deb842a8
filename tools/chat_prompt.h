// The prompt text of a one-message (or any) conversation rendered with a GGUF model's chat template, for
// the offline commands (`car run --chat`). The daemon will call core/chat's render_chat the same way.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/chat/chat.h"
#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/result.h"

namespace car::tools {

struct ChatPrompt {
  std::string text;
  bool starts_with_bos = false;  ///< the template wrote the BOS text itself: do not add another BOS
};

/// Renders `messages` with `template_override` (when set) or the file's tokenizer.chat_template, with
/// bos_token / eos_token from its vocabulary. Errors: "no_chat_template", the GGUF/tokenizer errors, and
/// render_chat's.
inline Result<ChatPrompt> render_model_chat(const std::string& path, const nlohmann::ordered_json& messages,
                                            const std::optional<std::string>& template_override,
                                            bool add_generation_prompt) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return file.error();
  std::string tpl;
  if (template_override) {
    tpl = *template_override;
  } else {
    if (!(*file)->has("tokenizer.chat_template")) {
      return make_error("no_chat_template",
                        path + ": the model has no tokenizer.chat_template (give a template)");
    }
    auto t = (*file)->get_string("tokenizer.chat_template");
    if (!t) return t.error();
    tpl = *t;
  }
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok) return tok.error();
  chat::ChatOptions co;
  co.add_generation_prompt = add_generation_prompt;
  if ((*tok)->bos() >= 0) co.bos_token = (*tok)->token_to_piece((*tok)->bos(), true);
  if ((*tok)->eos() >= 0) co.eos_token = (*tok)->token_to_piece((*tok)->eos(), true);
  auto text = chat::render_chat(tpl, messages, co);
  if (!text) return text.error();
  ChatPrompt p;
  p.starts_with_bos = !co.bos_token.empty() && text->rfind(co.bos_token, 0) == 0;
  p.text = std::move(*text);
  return p;
}

}  // namespace car::tools
