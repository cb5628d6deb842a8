#include "daemon/protocol/request.h"

#include <cstdint>

#include "daemon/protocol/ops.h"
#include "daemon/protocol/schema.h"

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

}  // namespace car::protocol
