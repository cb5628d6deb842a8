#include "daemon/protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include "core/util/error_codes.h"

namespace car::protocol {

using nlohmann::json;

namespace {

Error bad(std::string message) {
  return make_error(code::kBadRequest, std::move(message));
}

bool is_scalar(const json& v) {
  return v.is_null() || v.is_boolean() || v.is_number() || v.is_string();
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

/// Index just past the JSON string starting at `i` (a '"'); the text is known to be valid JSON.
std::size_t skip_string(std::string_view s, std::size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return s.size();
}

std::size_t skip_space(std::string_view s, std::size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}

/// Index just past the JSON value starting at `i`.
std::size_t skip_value(std::string_view s, std::size_t i) {
  if (i >= s.size()) return i;
  if (s[i] == '"') return skip_string(s, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    while (i < s.size()) {
      const char c = s[i];
      if (c == '"') {
        i = skip_string(s, i);
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if ((c == '}' || c == ']') && --depth == 0) return i + 1;
      ++i;
    }
    return i;
  }
  while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
         s[i] != '\n' && s[i] != '\r') {
    ++i;
  }
  return i;
}

/// The text of the top-level member `key` of the JSON object `line` (already parsed successfully, so it is
/// valid), as it was written; the last one when the key repeats (as the parser keeps the last).
std::string_view raw_member(std::string_view line, std::string_view key) {
  std::string_view found;
  std::size_t i = skip_space(line, 0);
  if (i >= line.size() || line[i] != '{') return found;
  i = skip_space(line, i + 1);
  while (i < line.size() && line[i] == '"') {
    const std::size_t key_end = skip_string(line, i);
    const std::string_view raw_key = line.substr(i, key_end - i);
    i = skip_space(line, key_end);
    i = skip_space(line, i + 1);  // the ':'
    const std::size_t value_end = skip_value(line, i);
    bool match = raw_key.size() == key.size() + 2 && raw_key.substr(1, key.size()) == key;
    if (!match && raw_key.find('\\') != std::string_view::npos) {  // an escaped spelling of the key
      json k = json::parse(raw_key, nullptr, false);
      match = k.is_string() && k.get_ref<const std::string&>() == key;
    }
    if (match) found = line.substr(i, value_end - i);
    i = skip_space(line, value_end);
    if (i < line.size() && line[i] == ',') i = skip_space(line, i + 1);
  }
  return found;
}

/// The compact request of an op without fields, exactly as `car` and most clients write it:
/// `{"op":"NAME"}` or `{"id":INTEGER,"op":"NAME"}` - no spaces, the integer of at most 18 digits (not -0),
/// NAME an op whose only members are id and op (health, stats, list, metrics); nullopt for anything else,
/// which the full parser then takes. Read by hand, the line needs no document: that was the dearest part of
/// a `health` round trip after the system calls. The Request is the full parser's but for its body, an
/// empty object (the ops it admits read nothing from the body, and `id` and `op` are in the Request).
std::optional<Request> parse_compact(std::string_view s) {
  auto take = [&s](std::string_view prefix) {
    if (s.substr(0, prefix.size()) != prefix) return false;
    s.remove_prefix(prefix.size());
    return true;
  };
  Request req;  // id null
  if (!take("{")) return std::nullopt;
  if (take(R"("id":)")) {
    const bool negative = take("-");
    std::size_t digits = 0;
    while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
    if (digits == 0 || digits > 18 || (s[0] == '0' && (digits > 1 || negative))) return std::nullopt;
    uint64_t value = 0;
    for (std::size_t i = 0; i < digits; ++i) value = value * 10 + static_cast<uint64_t>(s[i] - '0');
    s.remove_prefix(digits);
    // The full parser's types: a negative integer is signed, any other unsigned.
    req.id = negative ? json(-static_cast<int64_t>(value)) : json(value);
    if (!take(",")) return std::nullopt;
  }
  if (!take(R"("op":")")) return std::nullopt;
  std::size_t n = 0;
  while (n < s.size() && s[n] >= 'a' && s[n] <= 'z') ++n;
  const std::string_view name = s.substr(0, n);
  s.remove_prefix(n);
  if (s != R"("})") return std::nullopt;
  const auto op = op_from_name(name);
  if (!op || !known_fields(*op).empty()) return std::nullopt;
  req.op = std::string(name);
  req.body = json::object();
  return req;
}

}  // namespace

bool nests_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      i = skip_string(text, i) - 1;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Request> parse_request(std::string_view line, json* id_out) {
  if (auto compact = parse_compact(line)) {
    if (id_out != nullptr) *id_out = compact->id;
    return std::move(*compact);
  }
  if (id_out != nullptr) *id_out = nullptr;
  if (nests_deeper_than(line, kMaxRequestDepth)) {
    // Not parsed; the id is still echoed when it is a plain string or integer at the top level.
    if (id_out != nullptr) {
      const std::string_view raw = raw_member(line, "id");
      json id = json::parse(raw.begin(), raw.end(), nullptr, false);
      if (id.is_string() || (id.is_number_integer() && !(id.get<int64_t>() == 0 && raw.starts_with("-")))) {
        *id_out = std::move(id);
      }
    }
    return bad("request nests deeper than " + std::to_string(kMaxRequestDepth) +
               " levels of arrays and objects");
  }
  json doc = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("request is not valid JSON");
  if (!doc.is_object()) return bad(std::string("request must be a JSON object, got ") + type_name(doc));
  Request req;
  if (auto it = doc.find("id"); it != doc.end()) {
    if (!is_scalar(*it)) return bad("field 'id' must be a JSON scalar (string, number, boolean or null)");
    // Every reply echoes the id exactly as sent, which the parsed value can do for integers alone: a
    // fraction or exponent (2.5, 1e3), an integer beyond int64/uint64 (parsed as a double) and -0 (parsed
    // as 0) would come back spelled differently.
    if (it->is_number_float() ||
        (it->is_number_integer() && it->get<int64_t>() == 0 && raw_member(line, "id").substr(0, 1) == "-")) {
      return bad(
          "field 'id': a numeric id must be an integer from -9223372036854775808 to "
          "18446744073709551615 without fraction, exponent or '-0'; use a string for anything else");
    }
    req.id = *it;
    if (id_out != nullptr) *id_out = *it;
  }
  auto op = doc.find("op");
  if (op == doc.end()) return bad("field 'op' is missing");
  if (!op->is_string()) return bad("field 'op' must be a string, got " + type_name(*op));
  req.op = op->get<std::string>();
  req.body = std::move(doc);
  return req;
}

std::string_view wire_code(std::string_view code) {
  const ErrorCodeInfo* row = find_error_code(code);
  return row != nullptr && row->reach == Reach::kWire ? row->name : code::kInternal;
}

namespace {
constexpr std::string_view kOpNames[] = {
#define CAR_PROTOCOL_OP_NAME(e, name) name,
    CAR_PROTOCOL_OPS(CAR_PROTOCOL_OP_NAME)
#undef CAR_PROTOCOL_OP_NAME
};
}  // namespace

std::optional<Op> op_from_name(std::string_view name) {
  for (std::size_t i = 0; i < std::size(kOpNames); ++i) {
    if (kOpNames[i] == name) return static_cast<Op>(i);
  }
  return std::nullopt;
}

std::string_view op_name(Op op) {
  return kOpNames[static_cast<std::size_t>(op)];
}

const std::string& known_ops_text() {
  static const std::string text = [] {
    std::string t;
    for (std::string_view name : kOpNames) {
      if (!t.empty()) t += ", ";
      t += name;
    }
    return t;
  }();
  return text;
}

namespace {

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

namespace {
/// One reply line built by appending literal text and serialized values (dump()'s serializer: compact,
/// invalid UTF-8 replaced), instead of copying the values into a document only to serialize it. The
/// literals spell the members in the order a document would (nlohmann::json sorts keys), so the bytes
/// are the same.
class LineBuilder {
 public:
  LineBuilder() : state_(thread_state()) {
    CAR_CHECK(!state_.building);  // one line at a time per thread
    state_.building = true;
    state_.out.clear();
  }
  ~LineBuilder() { state_.building = false; }
  LineBuilder(const LineBuilder&) = delete;
  LineBuilder& operator=(const LineBuilder&) = delete;
  LineBuilder& raw(std::string_view text) {
    state_.out.append(text);
    return *this;
  }
  LineBuilder& value(const json& v) {
    state_.serializer.dump(v, /*pretty_print=*/false, /*ensure_ascii=*/false, 0);
    return *this;
  }
  /// The line (a copy of the thread's buffer, which keeps its capacity for the next line).
  std::string take() { return state_.out; }

 private:
  /// One buffer and one serializer per thread, made once: a serializer's construction allocates its output
  /// adapter and reads the locale, which was a tenth of a small reply's cost. Lines are built one at a time
  /// on a thread (value() never calls back into a LineBuilder).
  struct State {
    bool building = false;
    std::string out;  // before serializer, which appends to it
    nlohmann::detail::serializer<json> serializer{nlohmann::detail::output_adapter<char, std::string>(out), ' ',
                                                  json::error_handler_t::replace};
  };
  static State& thread_state() {
    thread_local State state;
    return state;
  }
  State& state_;
};
}  // namespace

std::string ok_line(const json& id, const json& result) {
  return LineBuilder()
      .raw(R"({"id":)")
      .value(id)
      .raw(R"(,"ok":true,"result":)")
      .value(result)
      .raw("}")
      .take();
}

std::string error_line(const json& id, std::string_view code, std::string_view message) {
  return LineBuilder()
      .raw(R"({"error":{"code":)")
      .value(json(code))
      .raw(R"(,"message":)")
      .value(json(message))
      .raw(R"(},"id":)")
      .value(id)
      .raw(R"(,"ok":false})")
      .take();
}

namespace {
json logprob_entry(const TokenLogprob& lp) {
  return {{"token", lp.token}, {"text", lp.text}, {"logprob", lp.logprob}};
}
json top_json(const TokenLogprobs& lp) {
  json top = json::array();
  for (const auto& t : lp.top_logprobs) top.push_back(logprob_entry(t));
  return top;
}
}  // namespace

json logprobs_json(const TokenLogprobs& lp) {
  json j = logprob_entry(lp);
  j["top_logprobs"] = top_json(lp);
  return j;
}

std::string token_line(const json& id, const TokenEvent& event) {
  if (event.logprobs) {
    json j = {{"id", id}, {"event", "token"}, {"text", event.text}, {"token", event.token}};
    j["logprob"] = event.logprobs->logprob;
    j["top_logprobs"] = top_json(*event.logprobs);
    return dump(j);
  }
  // The common case without a document (the keys in the order a json object dumps them).
  return LineBuilder()
      .raw(R"({"event":"token","id":)")
      .value(id)
      .raw(R"(,"text":)")
      .value(json(event.text))
      .raw(R"(,"token":)")
      .value(json(event.token))
      .raw("}")
      .take();
}

Result<Reply> parse_reply(std::string_view line) {
  json doc = json::parse(line.begin(), line.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(errc::kProtocolError, "the daemon sent a line that is not a JSON object");
  }
  Reply r;
  if (auto it = doc.find("id"); it != doc.end()) r.id = *it;
  if (auto ev = doc.find("event"); ev != doc.end()) {
    if (!ev->is_string()) return make_error(errc::kProtocolError, "event name is not a string");
    r.is_event = true;
    r.event = ev->get<std::string>();
    r.raw = std::move(doc);
    return r;
  }
  auto ok = doc.find("ok");
  if (ok == doc.end() || !ok->is_boolean())
    return make_error(errc::kProtocolError, "reply has no boolean 'ok'");
  r.ok = ok->get<bool>();
  if (r.ok) {
    if (auto res = doc.find("result"); res != doc.end()) r.result = *res;
  } else {
    auto err = doc.find("error");
    if (err == doc.end() || !err->is_object())
      return make_error(errc::kProtocolError, "failed reply has no 'error'");
    r.error_code = err->value("code", std::string("unknown"));
    r.error_message = err->value("message", std::string());
  }
  r.raw = std::move(doc);
  return r;
}

void LineFramer::feed(std::string_view bytes, std::vector<Item>& out) {
  while (!bytes.empty()) {
    std::size_t nl = bytes.find('\n');
    std::string_view chunk = bytes.substr(0, nl);  // npos -> all
    if (discarding_) {
      if (nl == std::string_view::npos) return;  // still inside the over-long line
      discarding_ = false;
    } else if (partial_.size() + chunk.size() > max_line_) {
      partial_.clear();
      partial_.shrink_to_fit();
      out.push_back({Item::Kind::kOversized, {}});
      if (nl == std::string_view::npos) {
        discarding_ = true;
        return;
      }
    } else {
      partial_.append(chunk);
      if (nl == std::string_view::npos) return;
      out.push_back({Item::Kind::kLine, std::move(partial_)});
      partial_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

}  // namespace car::protocol
