// render_model_chat: the model's template and special-token texts around render_chat.
#include "core/chat/model_chat.h"

#include "core/util/error_codes.h"

namespace car::chat {

std::optional<std::string> model_chat_template(const gguf::GgufFile& file) {
  const gguf::Value* v = file.find("tokenizer.chat_template");
  if (v == nullptr) return std::nullopt;
  const auto* s = v->get_if<std::string>();
  if (s == nullptr) return std::nullopt;
  return *s;
}

Result<ModelChatPrompt> render_model_chat(const gguf::GgufFile& file, const tokenizer::Tokenizer& tok,
                                          const nlohmann::ordered_json& messages,
                                          const std::optional<std::string>& template_override,
                                          bool add_generation_prompt, const RenderOptions& render) {
  ModelChatPrompt p;
  std::string tpl;
  if (template_override) {
    tpl = *template_override;
    p.template_source = "request";
  } else if (auto own = model_chat_template(file)) {
    tpl = std::move(*own);
    p.template_source = "model";
  } else {
    return make_error(errc::kNoChatTemplate, std::string(kNoChatTemplateMessage));
  }
  ChatOptions co;
  co.add_generation_prompt = add_generation_prompt;
  co.render = render;
  if (tok.bos() >= 0) co.bos_token = tok.token_to_piece(tok.bos(), true);
  if (tok.eos() >= 0) co.eos_token = tok.token_to_piece(tok.eos(), true);
  auto text = render_chat(tpl, messages, co);
  if (!text) return text.error();
  p.starts_with_bos = !co.bos_token.empty() && text->rfind(co.bos_token, 0) == 0;
  p.text = std::move(*text);
  return p;
}

}  // namespace car::chat
