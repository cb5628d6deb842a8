#include "daemon/http/openai.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/chat/model_chat.h"
#include "core/util/limits.h"
#include "core/util/suggest.h"
#include "daemon/protocol.h"

namespace car::daemon::http::openai {

using nlohmann::json;
using protocol::InferField;

namespace {

/// The most alternatives the legacy completions API's integer `logprobs` may ask for (OpenAI's bound).
constexpr int kMaxCompletionLogprobs = 5;

ApiError bad(std::string message, std::string param = {}, std::string code = {}) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError unsupported(const std::string& param, const std::string& why) {
  return bad("'" + param + "' " + why + " is not supported by car-inferenced", param,
             "unsupported_parameter");
}

bool present(const json& body, const char* name) {
  auto it = body.find(name);
  return it != body.end() && !it->is_null();
}

/// A number field that must equal `neutral` when given (a penalty car does not apply).
std::optional<ApiError> require_neutral_number(const json& body, const char* name, double neutral) {
  if (!present(body, name)) return std::nullopt;
  const json& v = body.at(name);
  if (!v.is_number()) return bad(std::string("'") + name + "' must be a number", name, "invalid_type");
  if (v.get<double>() != neutral) return unsupported(name, "other than " + protocol::dump(json(neutral)));
  return std::nullopt;
}

/// Chat message content: a string, null, or an array of text parts (joined). Anything else is a 400.
std::optional<ApiError> message_content(const json& content, std::size_t i, json& out) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  if (content.is_null() || content.is_string()) {
    out = content;
    return std::nullopt;
  }
  if (!content.is_array()) return bad("'" + param + "' must be a string or an array of parts", param);
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part.at("text").is_string()) {
      return bad("'" + param + "': only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                 param, "unsupported_content");
    }
    text += part.at("text").get<std::string>();
  }
  out = std::move(text);
  return std::nullopt;
}

/// A serialized body written in the order a document would dump its keys (nlohmann::json sorts them), so
/// the bytes are a document's without building one: literal text and serialized values (compact, invalid
/// UTF-8 replaced).
class Writer {
 public:
  Writer() = default;
  Writer(const Writer&) = delete;  // serializer_ writes into out_
  Writer& operator=(const Writer&) = delete;
  Writer& raw(std::string_view text) {
    out_.append(text);
    return *this;
  }
  Writer& value(const json& v) {
    serializer_.dump(v, /*pretty_print=*/false, /*ensure_ascii=*/false, 0);
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;  // before serializer_, which appends to it
  nlohmann::detail::serializer<json> serializer_{nlohmann::detail::output_adapter<char, std::string>(out_),
                                                 ' ', json::error_handler_t::replace};
};

/// The UTF-8 bytes of `s` as a JSON array of integers (OpenAI's `bytes`).
void bytes_of(Writer& w, const std::string& s) {
  w.raw("[");
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i > 0) w.raw(",");
    w.value(static_cast<int>(static_cast<unsigned char>(s[i])));
  }
  w.raw("]");
}

/// `{"bytes":[...],"logprob":...,"token":...` - a chat logprob entry's members, without the closing brace.
void chat_members(Writer& w, const protocol::TokenLogprob& lp) {
  w.raw(R"({"bytes":)");
  bytes_of(w, lp.text);
  w.raw(R"(,"logprob":)").value(lp.logprob).raw(R"(,"token":)").value(lp.text);
}

/// One token's chat entry: `{"bytes", "logprob", "token", "top_logprobs": [...]}`, `top` alternatives kept.
void chat_entry(Writer& w, const protocol::TokenLogprobs& lp, int top) {
  chat_members(w, lp);
  w.raw(R"(,"top_logprobs":[)");
  const std::size_t n = std::min(lp.top_logprobs.size(), static_cast<std::size_t>(std::max(top, 0)));
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) w.raw(",");
    chat_members(w, lp.top_logprobs[i]);
    w.raw("}");
  }
  w.raw("]}");
}

/// One token's alternatives in the completions shape, `{"text": logprob, ...}` (a text twice: the later).
json completion_top(const protocol::TokenLogprobs& lp, int top) {
  json tops = json::object();
  const std::size_t n = std::min(lp.top_logprobs.size(), static_cast<std::size_t>(std::max(top, 0)));
  for (std::size_t i = 0; i < n; ++i) tops[lp.top_logprobs[i].text] = lp.top_logprobs[i].logprob;
  return tops;
}

/// The `logprobs` object of a choice for `tokens`: chat's `{"content": [...], "refusal": null}` or the
/// completions API's four arrays with one element per token, `top` alternatives kept.
void logprobs_object(Writer& w, Endpoint endpoint, std::span<const protocol::TokenLogprobs> tokens, int top) {
  auto each = [&](auto&& write_one) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) w.raw(",");
      write_one(tokens[i]);
    }
  };
  if (endpoint == Endpoint::kChat) {
    w.raw(R"({"content":[)");
    each([&](const protocol::TokenLogprobs& lp) { chat_entry(w, lp, top); });
    w.raw(R"(],"refusal":null})");
    return;
  }
  int64_t offset = 0;
  w.raw(R"({"text_offset":[)");
  each([&](const protocol::TokenLogprobs& lp) {
    w.value(offset);
    offset += static_cast<int64_t>(lp.text.size());
  });
  w.raw(R"(],"token_logprobs":[)");
  each([&](const protocol::TokenLogprobs& lp) { w.value(lp.logprob); });
  w.raw(R"(],"tokens":[)");
  each([&](const protocol::TokenLogprobs& lp) { w.value(lp.text); });
  w.raw(R"(],"top_logprobs":[)");
  each([&](const protocol::TokenLogprobs& lp) { w.value(completion_top(lp, top)); });
  w.raw("]}");
}

/// The members after `choices`:
/// `],"created":...,"id":...,"model":...,"object":...,"system_fingerprint":null`.
void envelope_tail(Writer& w, Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                   bool chunk) {
  const char* object =
      endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  w.raw(R"(],"created":)").value(created).raw(R"(,"id":)").value(id).raw(R"(,"model":)").value(req.model);
  w.raw(R"(,"object":)").value(object).raw(R"(,"system_fingerprint":null)");
}

/// A chunk's end: `"usage": null` on every chunk but the usage chunk when the request asked for usage.
std::string end_chunk(Writer& w, const Mapped& req) {
  if (req.include_usage) w.raw(R"(,"usage":null)");
  return w.raw("}").take();
}

}  // namespace

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::optional<ApiError> map_request(Endpoint endpoint, std::string_view text, Mapped& out) {
  out = Mapped{};
  // As on the socket (protocol.h): copying and converting a document recurse over it.
  if (protocol::nests_deeper_than(text, protocol::kMaxRequestDepth)) {
    return bad("the request body nests deeper than " + std::to_string(protocol::kMaxRequestDepth) +
               " levels of arrays and objects");
  }
  json body = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad("the request body is not valid JSON");
  if (!body.is_object()) return bad("the request body must be a JSON object");

  if (!present(body, "model")) return bad("'model' is required", "model");
  if (!body.at("model").is_string()) return bad("'model' must be a string", "model", "invalid_type");
  out.model = body.at("model").get<std::string>();

  // Result-changing parameters car cannot honour: refuse rather than answer something else.
  if (present(body, "n")) {
    const json& n = body.at("n");
    if (!n.is_number_integer() || n.get<int64_t>() != 1) return unsupported("n", "other than 1");
  }
  if (auto e = require_neutral_number(body, "frequency_penalty", 0.0)) return e;
  if (auto e = require_neutral_number(body, "presence_penalty", 0.0)) return e;
  if (present(body, "logit_bias") && !(body.at("logit_bias").is_object() && body.at("logit_bias").empty())) {
    return unsupported("logit_bias", "with entries");
  }
  if (present(body, "tools") && !(body.at("tools").is_array() && body.at("tools").empty())) {
    return unsupported("tools", "(tool calling)");
  }
  if (present(body, "functions")) return unsupported("functions", "(function calling)");
  if (present(body, "tool_choice") && body.at("tool_choice") != "none" && body.at("tool_choice") != "auto") {
    return unsupported("tool_choice", "other than \"none\" or \"auto\"");
  }
  if (present(body, "response_format")) {
    const json& rf = body.at("response_format");
    if (!rf.is_object() || rf.value("type", json()) != "text") {
      return unsupported("response_format", "other than {\"type\": \"text\"}");
    }
  }

  // One rule on both fronts: a parameter car does not know is an error naming it (with the nearest known
  // one), as an unknown field is on the socket - except those OpenAI documents that cannot change the
  // result, which are accepted and ignored (docs/http.md).
  {
    static const std::vector<std::string_view> kCommon = {
        "model", "stream", "stream_options", "n", "frequency_penalty", "presence_penalty", "logit_bias",
        "tools", "functions", "tool_choice", "response_format", "max_tokens", "logprobs",
        // accepted and ignored: they do not change the result
        "user", "metadata", "store", "service_tier", "parallel_tool_calls"};
    static const std::vector<std::string_view> kChatOnly = {"messages", "max_completion_tokens", "top_logprobs"};
    static const std::vector<std::string_view> kCompletionOnly = {"prompt", "echo", "best_of", "suffix"};
    std::vector<std::string_view> known = kCommon;
    const auto& own = endpoint == Endpoint::kChat ? kChatOnly : kCompletionOnly;
    known.insert(known.end(), own.begin(), own.end());
    for (std::size_t i = 0; i < protocol::kInferFieldCount; ++i) {
      if (protocol::kInferFields[i].openai == protocol::OpenAi::kSame) known.push_back(protocol::kInferFields[i].name);
    }
    for (const auto& [key, value] : body.items()) {
      (void)value;
      if (std::find(known.begin(), known.end(), std::string_view(key)) != known.end()) continue;
      const std::string best = closest_name(key, known);
      const std::string shown = protocol::dump(json(key));
      return bad("unknown parameter " + shown + (best.empty() ? "" : " (did you mean '" + best + "'?)"), key,
                 "unknown_parameter");
    }
  }
  // OpenAI documents temperature from 0 to 2 (car's own field goes to 100).
  if (auto it = body.find("temperature"); it != body.end() && it->is_number() && it->get<double>() > 2.0) {
    return bad("'temperature' must be from 0 to 2", "temperature", "invalid_value");
  }

  protocol::InferBuilder& car = out.infer;
  // The parameters OpenAI spells as car does go through car's own rows, checked as a socket request's.
  for (std::size_t i = 0; i < protocol::kInferFieldCount; ++i) {
    if (protocol::kInferFields[i].openai != protocol::OpenAi::kSame) continue;
    if (auto it = body.find(protocol::kInferFields[i].name); it != body.end()) {
      car.set(static_cast<InferField>(i), *it);
    }
  }

  if (present(body, "stream")) {
    if (!body.at("stream").is_boolean()) return bad("'stream' must be a boolean", "stream", "invalid_type");
    out.stream = body.at("stream").get<bool>();
  }
  if (present(body, "stream_options")) {
    const json& so = body.at("stream_options");
    if (!so.is_object()) return bad("'stream_options' must be an object", "stream_options", "invalid_type");
    if (!out.stream) return bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (auto it = so.find("include_usage"); it != so.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage");
      }
      out.include_usage = it->get<bool>();
    }
  }

  if (endpoint == Endpoint::kChat) {
    if (!present(body, "messages")) return bad("'messages' is required", "messages");
    const json& messages = body.at("messages");
    if (!messages.is_array() || messages.empty()) {
      return bad("'messages' must be a non-empty array", "messages", "invalid_type");
    }
    json mapped = json::array();
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const json& m = messages[i];
      const std::string param = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return bad("'" + param + "' must be an object", param, "invalid_type");
      if (!m.contains("role") || !m.at("role").is_string()) {
        return bad("'" + param + ".role' must be a string", param + ".role", "invalid_type");
      }
      if (present(m, "tool_calls")) return unsupported(param + ".tool_calls", "(tool calling)");
      json content = nullptr;
      if (m.contains("content")) {
        if (auto e = message_content(m.at("content"), i, content)) return e;
      }
      // "developer" is OpenAI's newer name for the system role; chat templates know "system".
      std::string role = m.at("role").get<std::string>();
      if (role == "developer") role = "system";
      mapped.push_back({{"role", role}, {"content", content}});
    }
    car.set(InferField::kMessages, std::move(mapped));
    const char* max_name = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (present(body, max_name)) car.set(InferField::kMaxTokens, body.at(max_name));
    if (present(body, "logprobs")) {
      if (!body.at("logprobs").is_boolean())
        return bad("'logprobs' must be a boolean", "logprobs", "invalid_type");
      out.logprobs = body.at("logprobs").get<bool>();
    }
    if (present(body, "top_logprobs")) {
      const json& t = body.at("top_logprobs");
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > limits::kMaxTopLogprobs) {
        return bad("'top_logprobs' must be an integer from 0 to " + std::to_string(limits::kMaxTopLogprobs),
                   "top_logprobs", "invalid_value");
      }
      if (!out.logprobs) return bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
      out.top_logprobs = static_cast<int>(t.get<int64_t>());
    }
  } else {
    if (!present(body, "prompt")) return bad("'prompt' is required", "prompt");
    const json& prompt = body.at("prompt");
    if (prompt.is_string()) {
      car.set(InferField::kPrompt, prompt);
    } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
      car.set(InferField::kPrompt, prompt[0]);
    } else if (prompt.is_array() && prompt.size() > 1 && prompt[0].is_string()) {
      return unsupported("prompt", "as an array of several prompts (batches)");
    } else {
      return bad("'prompt' must be a string (token arrays are not supported)", "prompt", "invalid_type");
    }
    // OpenAI's default for completions is 16 tokens.
    car.set(InferField::kMaxTokens, present(body, "max_tokens") ? body.at("max_tokens") : json(16));
    if (present(body, "echo")) {
      if (!body.at("echo").is_boolean()) return bad("'echo' must be a boolean", "echo", "invalid_type");
      if (body.at("echo").get<bool>()) return unsupported("echo", "true");
    }
    if (present(body, "suffix")) return unsupported("suffix", "(insertion)");
    if (present(body, "best_of")) {
      const json& b = body.at("best_of");
      if (!b.is_number_integer() || b.get<int64_t>() != 1) return unsupported("best_of", "other than 1");
    }
    if (present(body, "logprobs")) {
      const json& l = body.at("logprobs");
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > kMaxCompletionLogprobs) {
        return bad("'logprobs' must be an integer from 0 to " + std::to_string(kMaxCompletionLogprobs),
                   "logprobs", "invalid_value");
      }
      out.logprobs = true;
      out.top_logprobs = static_cast<int>(l.get<int64_t>());
    }
  }
  if (out.logprobs) {
    car.set(InferField::kLogprobs, true);
    if (out.top_logprobs > 0) car.set(InferField::kTopLogprobs, out.top_logprobs);
  }
  // A value a row refused (a negative top_k, top_p above 1 ...): the error names its parameter.
  if (const auto& refused = car.refused()) {
    return bad(refused->message, std::string(protocol::info(car.refused_field()).name), "invalid_value");
  }
  return std::nullopt;
}

ApiError from_car_error(std::string_view code, std::string_view message) {
  ApiError e;
  e.message = std::string(message);
  e.code = std::string(code);
  if (code == protocol::code::kBadRequest || code == protocol::code::kContextOverflow) {
    e.status = 400;
    if (code == protocol::code::kContextOverflow) {
      e.code = "context_length_exceeded";
      e.param = "max_tokens";  // the prompt plus max_tokens: the one a client can lower without losing text
    } else if (message.starts_with(chat::kNoChatTemplateMessage) || message.starts_with("messages") ||
               message.starts_with("chat template") || message.starts_with("the chat template")) {
      e.param = "messages";  // the runtime's rendering errors (daemon/engine_runtime.cpp)
    } else if (message.starts_with("the prompt")) {
      e.param = "prompt";
    }
  } else if (code == protocol::code::kNotFound) {
    e.status = 404;
    e.code = "model_not_found";
    e.param = "model";
  } else if (code == protocol::code::kForbidden) {
    e.status = 400;  // a model id with a path in it: the client's mistake
    e.code = "invalid_model";
    e.param = "model";
  } else if (code == protocol::code::kBusy) {
    e.status = 429;
    e.type = "rate_limit_error";
  } else if (code == protocol::code::kShuttingDown) {
    e.status = 503;
    e.type = "server_error";
  } else if (code == protocol::code::kCancelled) {
    e.status = 499;  // the client went away (no one reads this)
    e.type = "server_error";
  } else {
    e.status = 500;
    e.type = "server_error";
  }
  return e;
}

std::string finish_reason(std::string_view car_reason) {
  if (car_reason == "eos" || car_reason == "stop") return "stop";
  return std::string(car_reason);
}

json usage(const protocol::GenerateOutput& output) {
  const auto prompt = static_cast<int64_t>(output.prompt_tokens);
  const auto completion = static_cast<int64_t>(output.tokens.size());
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", static_cast<int64_t>(output.cached_tokens)}}}};
}

std::string response(Endpoint endpoint, const Mapped& req, const protocol::InferResult& result,
                     const std::string& id, int64_t created) {
  const protocol::GenerateOutput& out = result.output;
  Writer w;
  w.raw(R"({"choices":[{"finish_reason":)").value(finish_reason(out.finish_reason));
  w.raw(R"(,"index":0,"logprobs":)");
  if (req.logprobs) {
    logprobs_object(w, endpoint, out.logprobs, req.top_logprobs);
  } else {
    w.raw("null");
  }
  if (endpoint == Endpoint::kChat) {
    w.raw(R"(,"message":{"content":)").value(out.text).raw(R"(,"refusal":null,"role":"assistant"}})");
  } else {
    w.raw(R"(,"text":)").value(out.text).raw("}");
  }
  envelope_tail(w, endpoint, req, id, created, /*chunk=*/false);
  return w.raw(R"(,"usage":)").value(usage(out)).raw("}").take();
}

std::string text_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                       std::string_view text, bool first, const protocol::TokenLogprobs* logprobs) {
  Writer w;
  w.raw(R"({"choices":[{)");
  if (endpoint == Endpoint::kChat) {
    w.raw(R"("delta":{"content":)").value(text);
    if (first) w.raw(R"(,"role":"assistant")");
    w.raw("},");
  }
  w.raw(R"("finish_reason":null,"index":0,"logprobs":)");
  if (req.logprobs && logprobs != nullptr) {
    logprobs_object(w, endpoint, std::span(logprobs, 1), req.top_logprobs);
  } else {
    w.raw("null");
  }
  if (endpoint != Endpoint::kChat) w.raw(R"(,"text":)").value(text);
  w.raw("}");
  envelope_tail(w, endpoint, req, id, created, /*chunk=*/true);
  return end_chunk(w, req);
}

std::string finish_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                         std::string_view car_reason) {
  Writer w;
  w.raw(endpoint == Endpoint::kChat ? R"({"choices":[{"delta":{},"finish_reason":)"
                                    : R"({"choices":[{"finish_reason":)");
  w.value(finish_reason(car_reason)).raw(R"(,"index":0,"logprobs":null)");
  if (endpoint != Endpoint::kChat) w.raw(R"(,"text":"")");
  w.raw("}");
  envelope_tail(w, endpoint, req, id, created, /*chunk=*/true);
  return end_chunk(w, req);
}

std::string usage_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                        const protocol::GenerateOutput& output) {
  Writer w;
  w.raw(R"({"choices":[)");
  envelope_tail(w, endpoint, req, id, created, /*chunk=*/true);
  return w.raw(R"(,"usage":)").value(usage(output)).raw("}").take();
}

std::string sse_event(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  std::size_t start = 0;
  while (true) {
    const std::size_t nl = data.find('\n', start);
    out += "data: ";
    out.append(data.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    out += '\n';
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  out += '\n';
  return out;
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

}  // namespace car::daemon::http::openai
