// Chat rendering: a conversation (messages as JSON) through a model's chat template, with the context
// transformers' apply_chat_template builds. This is the API the daemon and the CLI call.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/chat/jinja.h"
#include "core/util/result.h"

namespace car::chat {

struct ChatOptions {
  bool add_generation_prompt = true;
  std::string bos_token;  ///< empty: left out of the context (as transformers leaves out an unset token)
  std::string eos_token;
  nlohmann::ordered_json tools;  ///< null: `tools` is defined but none
  /// More top-level variables (e.g. {"enable_thinking": false}); they may not override messages/tools.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  RenderOptions render;
};

/// Checks `messages` is a non-empty array of objects, each with a string "role" (other fields are passed
/// through untouched: content, tool_calls, tool_call_id, name, ...), nesting at most kMaxJsonDepth levels
/// (the array counts one). Error code "bad_messages".
Result<void> validate_messages(const nlohmann::ordered_json& messages);

/// The context transformers builds: messages, add_generation_prompt, tools, documents (null), then
/// bos_token / eos_token when set, then `extra`. Throws std::invalid_argument where one nests deeper than
/// kMaxJsonDepth (validate_messages checks `messages`).
Value chat_context(const nlohmann::ordered_json& messages, const ChatOptions& options);

/// Validates `messages`, parses `template_text` and renders it. Errors: "bad_messages", "template_syntax",
/// "template_error", "raise_exception" (the template rejected the conversation; message = its text),
/// "cancelled" (options.render.cancelled was set).
Result<std::string> render_chat(std::string_view template_text, const nlohmann::ordered_json& messages,
                                const ChatOptions& options);

/// Token texts that end an assistant turn in common chat formats (<|eot_id|>, <|im_end|>, <end_of_turn>,
/// ...): a caller looks them up in its vocabulary and stops generation on the ones present, besides EOS.
const std::vector<std::string>& end_of_turn_markers();

}  // namespace car::chat
