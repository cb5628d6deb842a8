#include "daemon/protocol/schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/util/suggest.h"
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

std::string field(std::string_view name) {
  return "field '" + std::string(name) + "'";
}

/// A client-supplied field name quoted for a message: as a JSON string when it holds anything but plain
/// printable ASCII, else in single quotes.
std::string log_name(const std::string& key) {
  const bool plain = std::all_of(key.begin(), key.end(),
                                 [](char c) { return c >= 0x20 && c < 0x7f && c != '\'' && c != '\\'; });
  if (plain && key.size() <= 64) return "'" + key + "'";
  return json(key.substr(0, 64)).dump(-1, ' ', true, json::error_handler_t::replace);
}

/// An integer in [lo, hi]. Accepts JSON integers and integral floats (1.0), nothing else.
Result<int64_t> integer_value(std::string_view name, const json& v, int64_t lo, int64_t hi) {
  int64_t n = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return bad(field(name) + " out of range");
    }
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) ||
        d > static_cast<double>(hi)) {
      return bad(field(name) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "]");
    }
    n = static_cast<int64_t>(d);
  } else {
    return bad(field(name) + " must be an integer, got " + type_name(v));
  }
  if (n < lo || n > hi) {
    return bad(field(name) + " = " + std::to_string(n) + " is outside [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]");
  }
  return n;
}

/// A range bound as a person writes it ("0", "0.5", "100"), not std::to_string's "0.000000".
std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

/// `keep_alive`'s value: whole seconds, with a message that says so.
Result<int64_t> keep_alive_value(const json& v) {
  if (!v.is_number()) {
    return bad("field 'keep_alive' must be a number of seconds (0: unload after this request), got " +
               type_name(v));
  }
  return integer_value("keep_alive", v, 0, limits::kMaxIdleSecs);
}

Result<StreamExperts> stream_experts_value(const json& v) {
  if (v.is_string()) {
    if (auto mode = parse_stream_experts(v.get_ref<const std::string&>())) return *mode;
  }
  return bad("field 'stream_experts' must be \"on\", \"off\" or \"auto\", got " + dump(v));
}

// ---- The readers of the infer rows: one per member type, each given its row and a value other than null.

Result<void> read(const InferFieldInfo& f, json& v, std::string& out) {
  if (!v.is_string()) return bad(field(f.name) + " must be a string, got " + type_name(v));
  out = std::move(v.get_ref<std::string&>());
  return {};
}

Result<void> read(const InferFieldInfo& f, json& v, std::optional<std::string>& out) {
  return read(f, v, out.emplace());
}

Result<void> read(const InferFieldInfo& f, json& v, bool& out) {
  if (!v.is_boolean()) return bad(field(f.name) + " must be a boolean, got " + type_name(v));
  out = v.get<bool>();
  return {};
}

Result<void> read(const InferFieldInfo& f, json& v, int& out) {
  auto n = integer_value(f.name, v, static_cast<int64_t>(f.lo), static_cast<int64_t>(f.hi));
  if (!n) return n.error();
  out = static_cast<int>(*n);
  return {};
}

Result<void> read(const InferFieldInfo& f, json& v, float& out) {
  if (!v.is_number()) return bad(field(f.name) + " must be a number, got " + type_name(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < f.lo || d > f.hi) {
    return bad(field(f.name) + " must be in [" + number_text(f.lo) + ", " + number_text(f.hi) + "]");
  }
  out = static_cast<float>(d);
  return {};
}

/// `seed`: any JSON integer 0..2^64-1 (not a float: a seed must come back exactly as sent).
Result<void> read(const InferFieldInfo& f, json& v, uint64_t& out) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return bad(field(f.name) + " must be a non-negative integer");
  }
  out = v.get<uint64_t>();
  return {};
}

/// `stop`: a string or an array of non-empty strings.
Result<void> read(const InferFieldInfo& f, json& v, std::vector<std::string>& out) {
  if (v.is_string()) {
    out.push_back(std::move(v.get_ref<std::string&>()));
  } else if (v.is_array()) {
    for (json& s : v) {
      if (!s.is_string()) return bad(field(f.name) + " must be a string or an array of strings");
      out.push_back(std::move(s.get_ref<std::string&>()));
    }
  } else {
    return bad(field(f.name) + " must be a string or an array of strings");
  }
  for (const auto& s : out) {
    if (s.empty()) return bad(field(f.name) + " must not contain an empty string");
  }
  return {};
}

/// `messages`: a non-empty array of objects with a string `role` and a string or null `content`.
Result<void> read(const InferFieldInfo& f, json& v, std::optional<json>& out) {
  if (!v.is_array() || v.empty()) {
    return bad(field(f.name) + " must be a non-empty array of {\"role\", \"content\"} objects");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string where = std::string(f.name) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(field(where) + " must be an object, got " + type_name(m));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return bad(field(where + ".role") + " must be a string");
    if (auto content = m.find("content");
        content != m.end() && !content->is_null() && !content->is_string()) {
      return bad(field(where + ".content") + " must be a string or null, got " + type_name(*content));
    }
  }
  out = std::move(v);
  return {};
}

Result<void> read(const InferFieldInfo&, json& v, std::optional<StreamExperts>& out) {
  auto mode = stream_experts_value(v);
  if (!mode) return mode.error();
  out = *mode;
  return {};
}

Result<void> read(const InferFieldInfo&, json& v, std::optional<std::chrono::seconds>& out) {
  auto secs = keep_alive_value(v);
  if (!secs) return secs.error();
  out = std::chrono::seconds(*secs);
  return {};
}

/// `deadline_ms`: whole milliseconds within the row's range.
Result<void> read(const InferFieldInfo& f, json& v, std::optional<std::chrono::milliseconds>& out) {
  auto n = integer_value(f.name, v, static_cast<int64_t>(f.lo), static_cast<int64_t>(f.hi));
  if (!n) return n.error();
  out = std::chrono::milliseconds(*n);
  return {};
}

/// Set field `id` of `p` from `value` (not null) with its row's reader.
Result<void> read_field(InferField id, json& value, InferParams& p) {
  switch (id) {
#define CAR_INFER_FIELD_READ(e, name, type, lo, hi, member, openai) \
  case InferField::e:                                               \
    return read(info(id), value, p.member);
    CAR_INFER_FIELDS(CAR_INFER_FIELD_READ)
#undef CAR_INFER_FIELD_READ
  }
  CAR_CHECK(false);  // every enumerator has its case
  return {};
}

}  // namespace

const std::vector<std::string_view>& known_fields(Op op) {
  static const std::vector<std::string_view> kNone;
  static const std::vector<std::string_view> kLoad = {"model", "stream_experts", "keep_alive"};
  static const std::vector<std::string_view> kInvalidate = {"model"};
  static const std::vector<std::string_view> kCancel = {"target"};
  static const std::vector<std::string_view> kInfer = [] {
    std::vector<std::string_view> names;
    for (const InferFieldInfo& f : kInferFields) names.push_back(f.name);
    return names;
  }();
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
    if (const std::string best = closest_name(key, fields); !best.empty()) {
      message += " (did you mean '" + best + "'?)";
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
  auto mode = stream_experts_value(*it);
  if (!mode) return mode.error();
  return std::optional<StreamExperts>{*mode};
}

Result<std::optional<int64_t>> keep_alive_field(const json& body) {
  auto it = body.find("keep_alive");
  if (it == body.end() || it->is_null()) return std::optional<int64_t>{};
  auto secs = keep_alive_value(*it);
  if (!secs) return secs.error();
  return std::optional<int64_t>{*secs};
}

void InferBuilder::set(InferField id, json value) {
  if (value.is_null()) return;
  given_.set(static_cast<std::size_t>(id));
  auto r = read_field(id, value, params_);
  if (!r && (!error_ || id < error_field_)) {
    error_ = r.error();
    error_field_ = id;
  }
}

Result<InferParams> InferBuilder::finish() && {
  if (!given(InferField::kModel)) return bad("field 'model' is missing");
  if (error_ && error_field_ == InferField::kModel) return *error_;
  const bool has_prompt = given(InferField::kPrompt);
  const bool has_messages = given(InferField::kMessages);
  if (has_prompt && has_messages) return bad("give 'prompt' or 'messages', not both");
  if (!has_prompt && !has_messages) return bad("field 'prompt' (or 'messages') is missing");
  if (error_) return *error_;
  for (InferField f : {InferField::kAddGenerationPrompt, InferField::kChatTemplate}) {
    if (given(f) && !has_messages) return bad(field(info(f).name) + " applies to 'messages' only");
  }
  engine::GenerateRequest& g = params_.generate;
  if (g.sampling.repeat_penalty <= 0) return bad("field 'repeat_penalty' must be > 0 (1 = off)");
  if (g.top_logprobs > 0) g.logprobs = true;  // top_logprobs implies logprobs
  params_.seed_given = given(InferField::kSeed);
  return std::move(params_);
}

Result<InferParams> parse_infer(const json& body) {
  InferBuilder builder;
  for (std::size_t i = 0; i < kInferFieldCount; ++i) {
    if (auto it = body.find(kInferFields[i].name); it != body.end())
      builder.set(static_cast<InferField>(i), *it);
  }
  return std::move(builder).finish();
}

}  // namespace car::protocol
