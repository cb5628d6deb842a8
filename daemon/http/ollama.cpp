#include "daemon/http/ollama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include "core/util/limits.h"
#include "core/util/suggest.h"
#include "daemon/protocol.h"

namespace car::daemon::http::ollama {

using nlohmann::json;
using protocol::InferField;

namespace {

openai::ApiError bad(std::string message, int status = 400) {
  openai::ApiError e;
  e.status = status;
  e.message = std::move(message);
  return e;
}

openai::ApiError unsupported(const std::string& what) {
  return bad(what + " is not supported by car-inferenced");
}

bool present(const json& body, const char* name) {
  auto it = body.find(name);
  return it != body.end() && !it->is_null();
}

/// A field given but empty ("", [], {}) asks for nothing: Ollama's clients send some that way.
bool empty_value(const json& v) {
  return v.is_null() || (v.is_string() && v.get_ref<const std::string&>().empty()) || (v.is_array() && v.empty()) ||
         (v.is_object() && v.empty());
}

/// The first key of `object` not in `known`, as an error naming it and the nearest known one.
std::optional<openai::ApiError> unknown_key(const json& object, const std::vector<std::string_view>& known,
                                            const char* what) {
  for (const auto& [key, value] : object.items()) {
    (void)value;
    if (std::find(known.begin(), known.end(), std::string_view(key)) != known.end()) continue;
    const std::string best = closest_name(key, known);
    return bad(std::string("unknown ") + what + " " + protocol::dump(json(key)) +
               (best.empty() ? "" : " (did you mean '" + best + "'?)"));
  }
  return std::nullopt;
}

/// The options car maps to its own fields, those it requires neutral, and those that only tune the machine.
const std::vector<std::string_view>& known_options() {
  static const std::vector<std::string_view> k = {
      // mapped
      "temperature", "top_k", "top_p", "min_p", "seed", "stop", "num_predict", "repeat_penalty",
      "repeat_last_n", "num_ctx",
      // must be neutral (they would change the result)
      "presence_penalty", "frequency_penalty", "mirostat", "typical_p", "tfs_z",
      // accepted and ignored: they tune the machine, or only act with an option car requires off
      "mirostat_tau", "mirostat_eta", "num_keep", "num_thread", "num_gpu", "main_gpu", "use_mmap",
      "use_mlock", "numa", "num_batch", "low_vram", "f16_kv", "vocab_only", "logits_all", "embedding_only",
      "penalize_newline"};
  return k;
}

std::optional<openai::ApiError> require_neutral(const json& options, const char* name, double neutral) {
  if (!present(options, name)) return std::nullopt;
  const json& v = options.at(name);
  if (!v.is_number()) return bad(std::string("option '") + name + "' must be a number");
  if (v.get<double>() != neutral) {
    return unsupported(std::string("option '") + name + "' other than " + protocol::dump(json(neutral)));
  }
  return std::nullopt;
}

/// Map `options` onto car's rows (each value checked by its row, as a socket request's field).
std::optional<openai::ApiError> map_options(const json& options, Mapped& out) {
  if (!options.is_object()) return bad("'options' must be an object");
  if (auto e = unknown_key(options, known_options(), "option")) return e;
  if (auto e = require_neutral(options, "presence_penalty", 0.0)) return e;
  if (auto e = require_neutral(options, "frequency_penalty", 0.0)) return e;
  if (auto e = require_neutral(options, "mirostat", 0.0)) return e;
  if (auto e = require_neutral(options, "typical_p", 1.0)) return e;
  if (auto e = require_neutral(options, "tfs_z", 1.0)) return e;
  protocol::InferBuilder& car = out.infer;
  static constexpr std::pair<const char*, InferField> kSame[] = {
      {"temperature", InferField::kTemperature}, {"top_k", InferField::kTopK},
      {"top_p", InferField::kTopP},               {"min_p", InferField::kMinP},
      {"seed", InferField::kSeed},                {"stop", InferField::kStop},
      {"repeat_penalty", InferField::kRepeatPenalty}, {"num_ctx", InferField::kNumCtx}};
  for (const auto& [name, field] : kSame) {
    if (present(options, name)) car.set(field, options.at(name));
  }
  if (present(options, "num_predict")) {
    const json& n = options.at("num_predict");
    if (!n.is_number_integer()) return bad("option 'num_predict' must be an integer");
    if (n.get<int64_t>() >= 0) {
      out.to_context = false;
      car.set(InferField::kMaxTokens, n);
    }
  }
  if (present(options, "repeat_last_n")) {
    const json& n = options.at("repeat_last_n");
    if (!n.is_number_integer()) return bad("option 'repeat_last_n' must be an integer");
    // -1: the whole context, which the largest window covers.
    car.set(InferField::kRepeatLastN,
            n.get<int64_t>() == -1 ? json(16 * int64_t{limits::kMaxGenerateTokens}) : n);
  }
  return std::nullopt;
}

}  // namespace

std::string model_id(std::string_view name) {
  constexpr std::string_view kLatest = ":latest";
  if (name.size() > kLatest.size() && name.ends_with(kLatest)) name.remove_suffix(kLatest.size());
  return std::string(name);
}

std::optional<int64_t> keep_alive_seconds(const json& v, std::string& error) {
  const int64_t forever = limits::kMaxIdleSecs;
  auto clamp = [&](double secs) -> int64_t {
    if (secs < 0) return forever;
    if (secs >= static_cast<double>(forever)) return forever;
    return static_cast<int64_t>(std::ceil(secs));
  };
  if (v.is_number()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) {
      error = "'keep_alive' must be a finite number of seconds";
      return std::nullopt;
    }
    return clamp(d);
  }
  if (!v.is_string()) {
    error = "'keep_alive' must be a duration (\"5m\", \"1h30m\", \"-1\") or a number of seconds";
    return std::nullopt;
  }
  // A Go duration: [sign] (number unit)+, units ns us µs ms s m h; a bare number is seconds (Ollama).
  const std::string& s = v.get_ref<const std::string&>();
  std::string_view t(s);
  bool negative = false;
  if (!t.empty() && (t[0] == '-' || t[0] == '+')) {
    negative = t[0] == '-';
    t.remove_prefix(1);
  }
  auto fail = [&]() -> std::optional<int64_t> {
    error = "'keep_alive' " + protocol::dump(json(s)) +
            " is not a duration (\"300ms\", \"5m\", \"1h30m\", \"-1\" for ever, or a number of seconds)";
    return std::nullopt;
  };
  if (t.empty()) return fail();
  double total = 0;
  bool bare = true;
  while (!t.empty()) {
    std::size_t i = 0;
    while (i < t.size() && ((t[i] >= '0' && t[i] <= '9') || t[i] == '.')) ++i;
    if (i == 0 || i > 30) return fail();
    const std::string number(t.substr(0, i));
    char* end = nullptr;
    const double x = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return fail();
    t.remove_prefix(i);
    std::size_t u = 0;
    while (u < t.size() && !((t[u] >= '0' && t[u] <= '9') || t[u] == '.')) ++u;
    const std::string_view unit = t.substr(0, u);
    t.remove_prefix(u);
    double scale = 0;
    if (unit.empty()) {
      if (!bare || !t.empty()) return fail();
      scale = 1;  // "300": seconds
    } else if (unit == "ns") {
      scale = 1e-9;
    } else if (unit == "us" || unit == "\xC2\xB5s" || unit == "\xCE\xBCs") {
      scale = 1e-6;
    } else if (unit == "ms") {
      scale = 1e-3;
    } else if (unit == "s") {
      scale = 1;
    } else if (unit == "m") {
      scale = 60;
    } else if (unit == "h") {
      scale = 3600;
    } else {
      return fail();
    }
    bare = false;
    total += x * scale;
  }
  if (negative && total > 0) return forever;
  return clamp(total);
}

std::optional<openai::ApiError> map_request(Endpoint endpoint, std::string_view text, Mapped& out) {
  out = Mapped{};
  if (protocol::nests_deeper_than(text, protocol::kMaxRequestDepth)) {
    return bad("the request body nests deeper than " + std::to_string(protocol::kMaxRequestDepth) +
               " levels of arrays and objects");
  }
  json body = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad("the request body is not valid JSON");
  if (!body.is_object()) return bad("the request body must be a JSON object");

  static const std::vector<std::string_view> kGenerate = {
      "model", "prompt", "system", "raw", "stream", "options", "keep_alive", "format", "images", "suffix",
      "template", "context", "think"};
  static const std::vector<std::string_view> kChat = {"model",  "messages", "stream", "options", "keep_alive",
                                                      "format", "tools",    "think"};
  if (auto e = unknown_key(body, endpoint == Endpoint::kChat ? kChat : kGenerate, "field")) return e;

  if (!present(body, "model")) return bad("'model' is required");
  if (!body.at("model").is_string()) return bad("'model' must be a string");
  out.name = body.at("model").get<std::string>();
  out.model = model_id(out.name);
  if (out.model.empty()) return bad("'model' must not be empty");

  // What Ollama would do and car cannot: refuse rather than answer something else.
  if (present(body, "format") && !empty_value(body.at("format"))) {
    return unsupported("'format' (structured output)");
  }
  if (present(body, "think")) {
    const json& th = body.at("think");
    if (!(th.is_boolean() && !th.get<bool>())) return unsupported("'think' other than false");
  }
  for (const char* name : {"images", "suffix", "template", "context", "tools"}) {
    if (present(body, name) && !empty_value(body.at(name))) {
      static const std::pair<const char*, const char*> kWhy[] = {
          {"images", "'images' (vision)"},
          {"suffix", "'suffix' (fill in the middle)"},
          {"template", "'template' (a Go template instead of the model's chat template)"},
          {"context", "'context' (send the conversation again: its shared prefix is reused)"},
          {"tools", "'tools' (tool calling)"}};
      for (const auto& [n, why] : kWhy) {
        if (std::string_view(n) == name) return unsupported(why);
      }
    }
  }

  protocol::InferBuilder& car = out.infer;
  car.set(InferField::kModel, out.model);
  if (present(body, "stream")) {
    if (!body.at("stream").is_boolean()) return bad("'stream' must be a boolean");
    out.stream = body.at("stream").get<bool>();
  }
  car.set(InferField::kStream, out.stream);
  if (present(body, "keep_alive")) {
    std::string error;
    auto secs = keep_alive_seconds(body.at("keep_alive"), error);
    if (!secs) return bad(error);
    out.keep_alive_s = secs;
  }
  if (present(body, "options")) {
    if (auto e = map_options(body.at("options"), out)) return e;
  }

  if (endpoint == Endpoint::kChat) {
    const json messages = present(body, "messages") ? body.at("messages") : json::array();
    if (!messages.is_array()) return bad("'messages' must be an array");
    json mapped = json::array();
    static const std::vector<std::string_view> kMessage = {"role", "content", "images", "tool_calls",
                                                           "thinking", "tool_name"};
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const json& m = messages[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return bad("'" + where + "' must be an object");
      if (auto e = unknown_key(m, kMessage, ("field of " + where + ":").c_str())) return e;
      if (!m.contains("role") || !m.at("role").is_string()) return bad("'" + where + ".role' must be a string");
      if (present(m, "images") && !empty_value(m.at("images"))) return unsupported("'" + where + ".images' (vision)");
      if (present(m, "tool_calls") && !empty_value(m.at("tool_calls"))) {
        return unsupported("'" + where + ".tool_calls' (tool calling)");
      }
      if (present(m, "content") && !m.at("content").is_string()) {
        return bad("'" + where + ".content' must be a string");
      }
      json msg = {{"role", m.at("role")}, {"content", m.value("content", json(""))}};
      if (present(m, "tool_name")) {
        if (!m.at("tool_name").is_string()) return bad("'" + where + ".tool_name' must be a string");
        msg["name"] = m.at("tool_name");
      }
      mapped.push_back(std::move(msg));
    }
    if (mapped.empty()) {
      out.load_only = true;
    } else {
      car.set(InferField::kMessages, std::move(mapped));
    }
  } else {
    std::string prompt;
    if (present(body, "prompt")) {
      if (!body.at("prompt").is_string()) return bad("'prompt' must be a string");
      prompt = body.at("prompt").get<std::string>();
    }
    std::string system;
    if (present(body, "system")) {
      if (!body.at("system").is_string()) return bad("'system' must be a string");
      system = body.at("system").get<std::string>();
    }
    bool raw = false;
    if (present(body, "raw")) {
      if (!body.at("raw").is_boolean()) return bad("'raw' must be a boolean");
      raw = body.at("raw").get<bool>();
    }
    if (prompt.empty()) {
      out.load_only = true;
    } else if (raw) {
      if (!system.empty()) return bad("'system' cannot be used with 'raw': put it in the prompt");
      car.set(InferField::kPrompt, prompt);
    } else {
      // The prompt as a user turn in the model's own format; as it is when the model has no template.
      json messages = json::array();
      if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
      messages.push_back({{"role", "user"}, {"content", prompt}});
      car.set(InferField::kMessages, std::move(messages));
      out.raw_without_template = true;
      out.raw_prompt = std::move(prompt);
    }
  }
  if (out.load_only) {
    out.unload = out.keep_alive_s && *out.keep_alive_s == 0;
    return std::nullopt;
  }
  if (out.keep_alive_s) car.set(InferField::kKeepAlive, *out.keep_alive_s);
  if (const auto& refused = car.refused()) {
    return bad("option '" + std::string(protocol::info(car.refused_field()).name) + "': " + refused->message);
  }
  return std::nullopt;
}

json error_body(const openai::ApiError& e) { return json{{"error", e.message}}; }

openai::ApiError from_car_error(std::string_view code, std::string_view message) {
  // The statuses are the OpenAI front's (404 for a missing model, 429 for busy, 503 while shutting down ...).
  openai::ApiError e;
  e.status = openai::from_car_error(code, message).status;
  e.message = std::string(message);
  return e;
}

std::string rfc3339(int64_t unix_ns) {
  const std::time_t secs = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  const int64_t frac = unix_ns % 1'000'000'000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(frac < 0 ? 0 : frac));
  return buf;
}

std::string done_reason(std::string_view car_reason) {
  if (car_reason == "eos" || car_reason == "stop") return "stop";
  return std::string(car_reason);
}

namespace {

json head(Endpoint endpoint, const std::string& model, const std::string& created_at, std::string_view text) {
  json o = json::object();
  o["model"] = model;
  o["created_at"] = created_at;
  if (endpoint == Endpoint::kChat) {
    o["message"] = {{"role", "assistant"}, {"content", std::string(text)}};
  } else {
    o["response"] = std::string(text);
  }
  return o;
}

std::string line_of(const json& o, bool line) {
  std::string s = o.dump(-1, ' ', false, json::error_handler_t::replace);
  if (line) s += '\n';
  return s;
}

int64_t ns(double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); }

}  // namespace

std::string text_line(Endpoint endpoint, const std::string& model, const std::string& created_at,
                      std::string_view text) {
  json o = head(endpoint, model, created_at, text);
  o["done"] = false;
  return line_of(o, true);
}

std::string final_object(Endpoint endpoint, const std::string& model, const std::string& created_at,
                         const protocol::InferResult& result, std::string_view text, bool line) {
  const protocol::GenerateOutput& out = result.output;
  json o = head(endpoint, model, created_at, text);
  o["done"] = true;
  o["done_reason"] = done_reason(out.finish_reason);
  // Durations in nanoseconds, as Ollama reports them: load (getting the model), the prompt (with the wait
  // for a sequence, which Ollama does not separate), decoding, and the whole request.
  const double total_ms = result.load_ms + result.queue_ms + out.prompt_ms + out.decode_ms;
  o["total_duration"] = ns(total_ms);
  o["load_duration"] = ns(result.load_ms);
  o["prompt_eval_count"] = out.prompt_tokens;
  o["prompt_eval_duration"] = ns(out.prompt_ms);
  o["eval_count"] = static_cast<int64_t>(out.tokens.size());
  o["eval_duration"] = ns(out.decode_ms);
  return line_of(o, line);
}

std::string load_object(Endpoint endpoint, const std::string& model, const std::string& created_at, bool unload) {
  json o = head(endpoint, model, created_at, "");
  o["done"] = true;
  o["done_reason"] = unload ? "unload" : "load";
  return line_of(o, false);
}

json details(const ModelFacts& m) {
  json d = {{"parent_model", ""}, {"format", "gguf"}, {"family", ""}, {"families", nullptr},
            {"parameter_size", ""}, {"quantization_level", ""}};
  if (m.info) {
    d["family"] = m.info->architecture;
    d["families"] = json::array({m.info->architecture});
    // "6.74 B" -> "6.7B": Ollama's spelling.
    std::string size = gguf::format_count(m.info->parameters);
    size.erase(std::remove(size.begin(), size.end(), ' '), size.end());
    d["parameter_size"] = size;
    d["quantization_level"] = m.info->quantization;
  }
  return d;
}

std::string digest(const ModelFacts& m) {
  // FNV-1a over the id, size and modification time, widened to 64 hex digits the way Ollama's look.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  };
  mix(m.id.data(), m.id.size());
  mix(&m.file_bytes, sizeof m.file_bytes);
  mix(&m.modified_unix_ns, sizeof m.modified_unix_ns);
  std::string out;
  for (int round = 0; round < 4; ++round) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += buf;
    mix(&round, sizeof round);
  }
  return out;
}

json tags_entry(const ModelFacts& m) {
  return json{{"name", m.id},
              {"model", m.id},
              {"modified_at", rfc3339(m.modified_unix_ns)},
              {"size", m.file_bytes},
              {"digest", digest(m)},
              {"details", details(m)}};
}

json ps_entry(const ModelFacts& m, uint64_t charged_bytes, std::optional<int64_t> expires_unix_ns) {
  // Never evicted for idleness: Ollama shows such a model (keep_alive -1) expiring far in the future.
  constexpr int64_t kFarFuture = int64_t{4102444800} * 1'000'000'000;  // 2100-01-01
  return json{{"name", m.id},
              {"model", m.id},
              {"size", charged_bytes},
              {"digest", digest(m)},
              {"details", details(m)},
              {"expires_at", rfc3339(expires_unix_ns ? std::min(*expires_unix_ns, kFarFuture) : kFarFuture)},
              {"size_vram", 0}};
}

}  // namespace car::daemon::http::ollama
