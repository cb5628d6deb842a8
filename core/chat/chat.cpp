#include "core/chat/chat.h"

#include <stdexcept>

#include "core/util/error_codes.h"

namespace car::chat {

Result<void> validate_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return make_error(errc::kBadMessages, "messages must be a JSON array");
  if (messages.empty()) return make_error(errc::kBadMessages, "messages is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object())
      return make_error(errc::kBadMessages, "messages[" + std::to_string(i) + "] is not an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return make_error(errc::kBadMessages, "messages[" + std::to_string(i) + "] has no string \"role\"");
    }
  }
  // The conversion into template values recurses (Value::from_json): refuse what it would refuse, here,
  // with a clear error. The array itself is one level.
  if (json_depth(messages) > kMaxJsonDepth) {
    return make_error(errc::kBadMessages,
                      "messages nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  return {};
}

Value chat_context(const nlohmann::ordered_json& messages, const ChatOptions& options) {
  auto d = std::make_shared<Dict>();
  d->set("messages", Value::from_json(messages));
  d->set("add_generation_prompt", Value::boolean(options.add_generation_prompt));
  d->set("tools", Value::from_json(options.tools));
  d->set("documents", Value::none());
  if (!options.bos_token.empty()) d->set("bos_token", Value::string(options.bos_token));
  if (!options.eos_token.empty()) d->set("eos_token", Value::string(options.eos_token));
  if (options.extra.is_object()) {
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools") continue;
      d->set(it.key(), Value::from_json(it.value()));
    }
  }
  return Value::dict(std::move(d));
}

Result<std::string> render_chat(std::string_view template_text, const nlohmann::ordered_json& messages,
                                const ChatOptions& options) {
  if (auto v = validate_messages(messages); !v.ok()) return v.error();
  Value context;
  try {
    context = chat_context(messages, options);
  } catch (const std::invalid_argument& e) {  // tools or extra nest too deep (messages were checked)
    return make_error(errc::kBadMessages, std::string("tools or extra variables: ") + e.what());
  }
  return render_template(template_text, context, options.render);
}

const std::vector<std::string>& end_of_turn_markers() {
  static const std::vector<std::string> markers = {"<|eot_id|>",      "<|eom_id|>", "<|im_end|>",
                                                   "<end_of_turn>",   "<|end|>",    "<|endoftext|>",
                                                   "<|end_of_text|>", "</s>",       "<｜end▁of▁sentence｜>",
                                                   "<|return|>",      "<|call|>"};
  return markers;
}

}  // namespace car::chat
