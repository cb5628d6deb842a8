#include "daemon/http/openai.h"

#include <cmath>

#include "daemon/protocol.h"

namespace car::daemon::http::openai {

using nlohmann::json;

namespace {

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

/// Copy the fields both endpoints share from `body` into `car` (car validates their types and ranges).
void copy_common(const json& body, json& car) {
  for (const char* name : {"temperature", "top_p", "seed", "stop", "top_k"}) {
    if (present(body, name)) car[name] = body.at(name);
  }
}

std::string reason_of(const json& result) {
  auto it = result.find("finish_reason");
  return it != result.end() && it->is_string() ? finish_reason(it->get<std::string>()) : std::string("stop");
}

/// The UTF-8 bytes of `s` as a JSON array of integers (OpenAI's `bytes`).
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

double logprob_of(const json& entry) {
  auto it = entry.find("logprob");
  return it != entry.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string text_of(const json& entry) {
  auto it = entry.find("text");
  return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
}

json base(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created, bool chunk) {
  const char* object =
      endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", req.model},
          {"system_fingerprint", nullptr}};
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

  json car = {{"op", "infer"}, {"model", out.model}};
  copy_common(body, car);

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
  if (out.stream) car["stream"] = true;

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
    car["messages"] = std::move(mapped);
    const char* max_name = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (present(body, max_name)) car["max_tokens"] = body.at(max_name);
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
      car["prompt"] = prompt;
    } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
      car["prompt"] = prompt[0];
    } else if (prompt.is_array() && prompt.size() > 1 && prompt[0].is_string()) {
      return unsupported("prompt", "as an array of several prompts (batches)");
    } else {
      return bad("'prompt' must be a string (token arrays are not supported)", "prompt", "invalid_type");
    }
    if (present(body, "max_tokens")) {
      car["max_tokens"] = body.at("max_tokens");
    } else {
      car["max_tokens"] = 16;  // OpenAI's default for completions
    }
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
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > 5) {
        return bad("'logprobs' must be an integer from 0 to 5", "logprobs", "invalid_value");
      }
      out.logprobs = true;
      out.top_logprobs = static_cast<int>(l.get<int64_t>());
    }
  }
  if (out.logprobs) {
    car["logprobs"] = true;
    if (out.top_logprobs > 0) car["top_logprobs"] = out.top_logprobs;
  }
  out.car = std::move(car);
  return std::nullopt;
}

ApiError from_car_error(std::string_view code, std::string_view message) {
  ApiError e;
  e.message = std::string(message);
  e.code = std::string(code);
  if (code == protocol::code::kBadRequest || code == protocol::code::kContextOverflow) {
    e.status = 400;
    if (code == protocol::code::kContextOverflow) e.code = "context_length_exceeded";
  } else if (code == protocol::code::kNotFound) {
    e.status = 404;
    e.code = "model_not_found";
  } else if (code == protocol::code::kForbidden) {
    e.status = 400;  // a model id with a path in it: the client's mistake
    e.code = "invalid_model";
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

json usage(const json& car_usage) {
  const int64_t prompt = car_usage.is_object() ? car_usage.value("prompt_tokens", int64_t{0}) : 0;
  const int64_t completion = car_usage.is_object() ? car_usage.value("completion_tokens", int64_t{0}) : 0;
  return {
      {"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json chat_logprobs(const json& car_logprobs, int top) {
  json content = json::array();
  if (car_logprobs.is_array()) {
    for (const json& t : car_logprobs) {
      const std::string text = text_of(t);
      json tops = json::array();
      if (auto it = t.find("top_logprobs"); it != t.end() && it->is_array()) {
        for (const json& alt : *it) {
          if (static_cast<int>(tops.size()) >= top) break;
          const std::string alt_text = text_of(alt);
          tops.push_back({{"token", alt_text}, {"logprob", logprob_of(alt)}, {"bytes", bytes_of(alt_text)}});
        }
      }
      content.push_back(
          {{"token", text}, {"logprob", logprob_of(t)}, {"bytes", bytes_of(text)}, {"top_logprobs", tops}});
    }
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs(const json& car_logprobs, int top) {
  json tokens = json::array();
  json token_logprobs = json::array();
  json top_logprobs = json::array();
  json text_offset = json::array();
  int64_t offset = 0;
  if (car_logprobs.is_array()) {
    for (const json& t : car_logprobs) {
      const std::string text = text_of(t);
      tokens.push_back(text);
      token_logprobs.push_back(logprob_of(t));
      text_offset.push_back(offset);
      offset += static_cast<int64_t>(text.size());
      json tops = json::object();
      if (auto it = t.find("top_logprobs"); it != t.end() && it->is_array()) {
        int n = 0;
        for (const json& alt : *it) {
          if (n++ >= top) break;
          tops[text_of(alt)] = logprob_of(alt);
        }
      }
      top_logprobs.push_back(std::move(tops));
    }
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

json response(Endpoint endpoint, const Mapped& req, const json& car_result, const std::string& id,
              int64_t created) {
  json r = base(endpoint, req, id, created, /*chunk=*/false);
  const std::string text = car_result.value("text", std::string());
  json logprobs = nullptr;
  if (req.logprobs) {
    const json lp = car_result.value("logprobs", json::array());
    logprobs = endpoint == Endpoint::kChat ? chat_logprobs(lp, req.top_logprobs)
                                           : completion_logprobs(lp, req.top_logprobs);
  }
  json choice;
  if (endpoint == Endpoint::kChat) {
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}}},
              {"logprobs", logprobs},
              {"finish_reason", reason_of(car_result)}};
  } else {
    choice = {{"text", text}, {"index", 0}, {"logprobs", logprobs}, {"finish_reason", reason_of(car_result)}};
  }
  r["choices"] = json::array({std::move(choice)});
  r["usage"] = usage(car_result.value("usage", json::object()));
  return r;
}

json text_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                std::string_view text, bool first, const json& logprobs) {
  json r = base(endpoint, req, id, created, /*chunk=*/true);
  json lp = nullptr;
  if (req.logprobs && !logprobs.is_null()) {
    const json one = json::array({logprobs});
    lp = endpoint == Endpoint::kChat ? chat_logprobs(one, req.top_logprobs)
                                     : completion_logprobs(one, req.top_logprobs);
  }
  json choice;
  if (endpoint == Endpoint::kChat) {
    json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", lp}, {"finish_reason", nullptr}};
  } else {
    choice = {{"text", text}, {"index", 0}, {"logprobs", lp}, {"finish_reason", nullptr}};
  }
  r["choices"] = json::array({std::move(choice)});
  if (req.include_usage) r["usage"] = nullptr;
  return r;
}

json finish_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                  std::string_view car_reason) {
  json r = base(endpoint, req, id, created, /*chunk=*/true);
  json choice;
  if (endpoint == Endpoint::kChat) {
    choice = {{"index", 0},
              {"delta", json::object()},
              {"logprobs", nullptr},
              {"finish_reason", finish_reason(car_reason)}};
  } else {
    choice = {
        {"text", ""}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(car_reason)}};
  }
  r["choices"] = json::array({std::move(choice)});
  if (req.include_usage) r["usage"] = nullptr;
  return r;
}

json usage_chunk(Endpoint endpoint, const Mapped& req, const std::string& id, int64_t created,
                 const json& car_usage) {
  json r = base(endpoint, req, id, created, /*chunk=*/true);
  r["choices"] = json::array();
  r["usage"] = usage(car_usage);
  return r;
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
