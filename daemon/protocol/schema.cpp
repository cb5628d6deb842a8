#include "daemon/protocol/schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include "daemon/protocol/reply_lines.h"

namespace car::protocol {

using nlohmann::json;

namespace {

Error bad(std::string message) {
  return make_error(code::kBadRequest, std::move(message));
}

std::string type_name(const json& v) {
  return v.type_name();
}

/// A client-supplied field name quoted for a message: as a JSON string when it holds anything but plain
/// printable ASCII, else in single quotes.
std::string log_name(const std::string& key) {
  const bool plain = std::all_of(key.begin(), key.end(),
                                 [](char c) { return c >= 0x20 && c < 0x7f && c != '\'' && c != '\\'; });
  if (plain && key.size() <= 64) return "'" + key + "'";
  return json(key.substr(0, 64)).dump(-1, ' ', true, json::error_handler_t::replace);
}

/// An integer field in [lo, hi]. Accepts JSON integers and integral floats (1.0), nothing else.
Result<std::optional<int64_t>> int_field(const json& body, const char* name, int64_t lo, int64_t hi) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<int64_t>{};
  int64_t v = 0;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return bad(std::string("field '") + name + "' out of range");
    }
    v = it->get<int64_t>();
  } else if (it->is_number_float()) {
    double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) ||
        d > static_cast<double>(hi)) {
      return bad(std::string("field '") + name + "' must be an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
    }
    v = static_cast<int64_t>(d);
  } else {
    return bad(std::string("field '") + name + "' must be an integer, got " + type_name(*it));
  }
  if (v < lo || v > hi) {
    return bad(std::string("field '") + name + "' = " + std::to_string(v) + " is outside [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return std::optional<int64_t>{v};
}

/// A range bound as a person writes it ("0", "0.5", "100"), not std::to_string's "0.000000".
std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Result<std::optional<double>> number_field(const json& body, const char* name, double lo, double hi) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<double>{};
  if (!it->is_number())
    return bad(std::string("field '") + name + "' must be a number, got " + type_name(*it));
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return bad(std::string("field '") + name + "' must be in [" + number_text(lo) + ", " + number_text(hi) +
               "]");
  }
  return std::optional<double>{v};
}

/// Levenshtein distance of two short field names (case-sensitive), for did-you-mean suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::vector<std::string_view>& known_fields(Op op) {
  static const std::vector<std::string_view> kNone;
  static const std::vector<std::string_view> kLoad = {"model", "stream_experts", "keep_alive"};
  static const std::vector<std::string_view> kInvalidate = {"model"};
  static const std::vector<std::string_view> kCancel = {"target"};
  static const std::vector<std::string_view> kInfer = {
      "model",         "prompt",         "messages",     "add_generation_prompt",
      "chat_template", "max_tokens",     "temperature",  "top_k",
      "top_p",         "seed",           "stop",         "stream",
      "ignore_eos",    "stream_experts", "min_p",        "repeat_penalty",
      "repeat_last_n", "logprobs",       "top_logprobs", "num_ctx",
      "keep_alive"};
  switch (op) {
    case Op::kLoad:
      return kLoad;
    case Op::kInfer:
      return kInfer;
    case Op::kInvalidate:
      return kInvalidate;
    case Op::kCancel:
      return kCancel;
    case Op::kStats:
    case Op::kList:
    case Op::kHealth:
    case Op::kMetrics:
      return kNone;
  }
  return kNone;
}

Result<void> check_fields(Op op, const json& body) {
  if (!body.is_object()) return {};
  if (auto it = body.find("strict"); it != body.end()) {
    if (!it->is_boolean()) return bad("field 'strict' must be a boolean, got " + type_name(*it));
    if (!it->get<bool>()) return {};
  }
  const auto& fields = known_fields(op);
  for (const auto& [key, value] : body.items()) {
    (void)value;
    if (key == "id" || key == "op" || key == "strict") continue;
    if (std::find(fields.begin(), fields.end(), std::string_view(key)) != fields.end()) continue;
    std::string message = "unknown field " + log_name(key) + " for op '" + std::string(op_name(op)) + "'";
    // The closest known field when it is a plausible misspelling: at most a third of its length edited.
    std::string_view best;
    std::size_t best_distance = std::numeric_limits<std::size_t>::max();
    for (std::string_view f : fields) {
      const std::size_t d = edit_distance(key, f);
      if (d < best_distance) {
        best_distance = d;
        best = f;
      }
    }
    if (!best.empty() && best_distance <= std::max<std::size_t>(1, best.size() / 3)) {
      message += " (did you mean '" + std::string(best) + "'?)";
    } else if (fields.empty()) {
      message += " (it takes no fields)";
    } else {
      message += " (known: ";
      for (std::size_t i = 0; i < fields.size(); ++i) message += (i ? ", " : "") + std::string(fields[i]);
      message += ")";
    }
    return bad(message + "; send \"strict\": false to ignore unknown fields");
  }
  return {};
}

Result<std::string> model_field(const json& body) {
  auto it = body.find("model");
  if (it == body.end()) return bad("field 'model' is missing");
  if (!it->is_string()) return bad("field 'model' must be a string, got " + type_name(*it));
  return it->get<std::string>();
}

Result<std::optional<StreamExperts>> stream_experts_field(const json& body) {
  auto it = body.find("stream_experts");
  if (it == body.end() || it->is_null()) return std::optional<StreamExperts>{};
  if (it->is_string()) {
    if (auto v = parse_stream_experts(it->get_ref<const std::string&>())) return std::optional<StreamExperts>{*v};
  }
  return bad("field 'stream_experts' must be \"on\", \"off\" or \"auto\", got " + dump(*it));
}

Result<std::optional<int64_t>> keep_alive_field(const json& body) {
  auto it = body.find("keep_alive");
  if (it != body.end() && !it->is_null() && !it->is_number()) {
    return bad("field 'keep_alive' must be a number of seconds (0: unload after this request), got " +
               type_name(*it));
  }
  return int_field(body, "keep_alive", 0, kMaxKeepAliveSecs);
}

Result<InferParams> parse_infer(const json& body) {
  InferParams p;
  auto model = model_field(body);
  if (!model) return model.error();
  p.model = std::move(*model);

  auto prompt = body.find("prompt");
  auto messages = body.find("messages");
  const bool has_prompt = prompt != body.end() && !prompt->is_null();
  const bool has_messages = messages != body.end() && !messages->is_null();
  if (has_prompt && has_messages) return bad("give 'prompt' or 'messages', not both");
  if (!has_prompt && !has_messages) return bad("field 'prompt' (or 'messages') is missing");
  if (has_prompt) {
    if (!prompt->is_string()) return bad("field 'prompt' must be a string, got " + type_name(*prompt));
    p.generate.prompt = prompt->get<std::string>();
  } else {
    if (!messages->is_array() || messages->empty()) {
      return bad("field 'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    }
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return bad("field '" + where + "' must be an object, got " + type_name(m));
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) return bad("field '" + where + ".role' must be a string");
      if (auto content = m.find("content");
          content != m.end() && !content->is_null() && !content->is_string()) {
        return bad("field '" + where + ".content' must be a string or null, got " + type_name(*content));
      }
    }
    p.messages = *messages;
  }
  if (auto it = body.find("add_generation_prompt"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return bad("field 'add_generation_prompt' must be a boolean, got " + type_name(*it));
    if (!has_messages) return bad("field 'add_generation_prompt' applies to 'messages' only");
    p.add_generation_prompt = it->get<bool>();
  }
  if (auto it = body.find("chat_template"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad("field 'chat_template' must be a string, got " + type_name(*it));
    if (!has_messages) return bad("field 'chat_template' applies to 'messages' only");
    p.chat_template = it->get<std::string>();
  }

  engine::GenerateRequest& g = p.generate;
  engine::SamplingParams& sp = g.sampling;
  auto max_tokens = int_field(body, "max_tokens", 0, kMaxTokensLimit);
  if (!max_tokens) return max_tokens.error();
  if (*max_tokens) g.max_tokens = static_cast<int>(**max_tokens);

  // The sampler's settings (engine/sampler.h): a field absent or null keeps the engine's default.
  for (auto [name, field, lo, hi] :
       {std::tuple{"temperature", &sp.temperature, 0.0, 100.0}, std::tuple{"top_p", &sp.top_p, 0.0, 1.0},
        std::tuple{"min_p", &sp.min_p, 0.0, 1.0},
        std::tuple{"repeat_penalty", &sp.repeat_penalty, 0.0, 100.0}}) {
    auto v = number_field(body, name, lo, hi);
    if (!v) return v.error();
    if (*v) *field = static_cast<float>(**v);
  }
  if (sp.repeat_penalty <= 0) return bad("field 'repeat_penalty' must be > 0 (1 = off)");
  for (auto [name, field, hi] :
       {std::tuple{"top_k", &sp.top_k, int64_t{std::numeric_limits<int32_t>::max()}},
        std::tuple{"repeat_last_n", &sp.repeat_last_n, int64_t{kMaxTokensLimit} * 16},
        std::tuple{"top_logprobs", &g.top_logprobs, int64_t{kMaxTopLogprobs}},
        std::tuple{"num_ctx", &g.num_ctx, int64_t{kMaxContextLimit}}}) {
    auto v = int_field(body, name, 0, hi);
    if (!v) return v.error();
    if (*v) *field = static_cast<int>(**v);
  }

  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() ||
        (it->is_number_integer() && !it->is_number_unsigned() && it->get<int64_t>() < 0)) {
      return bad("field 'seed' must be a non-negative integer");
    }
    sp.seed = it->get<uint64_t>();
    p.seed_given = true;
  }

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      g.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return bad("field 'stop' must be a string or an array of strings");
        g.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad("field 'stop' must be a string or an array of strings");
    }
    for (const auto& s : g.stop) {
      if (s.empty()) return bad("field 'stop' must not contain an empty string");
    }
  }

  for (auto [name, field] : {std::pair{"stream", &p.stream}, std::pair{"ignore_eos", &g.ignore_eos},
                             std::pair{"logprobs", &g.logprobs}}) {
    if (auto it = body.find(name); it != body.end() && !it->is_null()) {
      if (!it->is_boolean())
        return bad(std::string("field '") + name + "' must be a boolean, got " + type_name(*it));
      *field = it->get<bool>();
    }
  }
  if (g.top_logprobs > 0) g.logprobs = true;  // top_logprobs implies logprobs
  auto stream_experts = stream_experts_field(body);
  if (!stream_experts) return stream_experts.error();
  p.stream_experts = std::move(*stream_experts);
  return p;
}

}  // namespace car::protocol
