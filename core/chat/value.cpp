#include "core/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "core/chat/unicode_text.h"

namespace car::chat {

namespace detail {

thread_local Arena* current_arena = nullptr;

namespace {
// Drops the entries whose object is gone once the list has doubled, so the record stays proportional to
// what is alive.
template <typename T>
void note(std::vector<std::weak_ptr<T>>& v, const std::shared_ptr<T>& p) {
  if (v.size() >= 1024 && (v.size() & (v.size() - 1)) == 0) {
    std::erase_if(v, [](const std::weak_ptr<T>& w) { return w.expired(); });
  }
  v.push_back(p);
}
}  // namespace

void arena_note(const std::shared_ptr<std::vector<Value>>& l) {
  note(current_arena->lists, l);
}
void arena_note(const std::shared_ptr<Dict>& d) {
  note(current_arena->dicts, d);
}

}  // namespace detail

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  if (Value* existing = find(key)) {
    *existing = std::move(v);
    return;
  }
  items_.emplace_back(std::move(key), std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return dict_->size() != 0;
    case Kind::kCallable:
      return true;
  }
  return false;
}

const char* Value::kind_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kCallable:
      return "callable";
  }
  return "?";
}

namespace {
// While free_containers() runs on this thread, the worklist it drains: lists and dicts whose last owner
// went away while another was being freed are queued there instead of freed by recursion. A plain pointer
// (to the outermost call's local vector), so that nothing here is destroyed at thread exit before the last
// Values (a static one is destroyed after the thread's thread_locals).
thread_local std::vector<std::shared_ptr<void>>* t_pending = nullptr;
}  // namespace

void Value::free_containers() noexcept {
  if (t_pending != nullptr) {
    if (list_.use_count() == 1) t_pending->push_back(std::move(list_));
    if (dict_.use_count() == 1) t_pending->push_back(std::move(dict_));
    return;
  }
  std::vector<std::shared_ptr<void>> pending;  // allocates only when the container holds containers
  t_pending = &pending;
  list_.reset();  // its items queue their own containers
  dict_.reset();
  while (!pending.empty()) {
    std::shared_ptr<void> p = std::move(pending.back());
    pending.pop_back();
    p.reset();  // may queue more
  }
  t_pending = nullptr;
}

namespace {
Value from_json_at(const nlohmann::ordered_json& j, int depth);
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  return from_json_at(j, 0);
}

int json_depth(const nlohmann::ordered_json& j, int limit) {
  // Depth-first with an explicit stack of (container, depth).
  int deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, int>> todo{{&j, 0}};
  while (!todo.empty()) {
    const auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    if (deepest > limit) return deepest;
    for (const auto& e : *v) {
      if (e.is_structured()) todo.emplace_back(&e, d + 1);
    }
  }
  return deepest;
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (j.is_structured() && depth >= kMaxJsonDepth) {
    throw std::invalid_argument("the JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  using V = Value;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return V::none();
    case nlohmann::ordered_json::value_t::boolean:
      return V::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return V::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return V::integer(static_cast<int64_t>(u));
      return V::floating(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return V::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return V::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return V::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(it.key(), from_json_at(it.value(), depth + 1));
      return V::dict(std::move(d));
    }
    default:
      return V::none();
  }
}

}  // namespace

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then laid out as Python's repr: positional for 1e-4 <= |f| < 1e16,
  // scientific (1e+16, 1.5e-05) otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exp >= 16 || exp < -4) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

// A JSON string literal (tojson and the js_strip_quirk printing): quotes and the JSON grammar's escapes
// (\" \\ \n \r \t \b \f, \u00XX for the other controls), every other byte as it is (DEL too), as Python's
// json.dumps(ensure_ascii=False) and JSON.stringify write them - the conformance outputs depend on it. Not
// the same job as tools/terminal_text.h, which makes text safe to show on a terminal (\xNN, no quotes, C1 and
// non-UTF-8 bytes escaped): its output is not JSON, and this one is not terminal-safe.
void json_string(const std::string& s, const JsonFormat& f, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char b[16];
        if (c < 0x20 || (c == 0x7F && f.ensure_ascii)) {
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else if (c >= 0x80 && f.ensure_ascii) {
          size_t next = i;
          bool valid = true;
          const uint32_t cp = next_code_point(s, next, valid);
          if (!valid) {
            out += static_cast<char>(c);  // not text: copied as it is
            break;
          }
          if (cp > 0xFFFF) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", cp);
          }
          out += b;
          i = next;
          continue;
        } else {
          out += static_cast<char>(c);
        }
      }
    }
    ++i;
  }
  out += '"';
}

bool json_rec(const Value& v, const JsonFormat& f, int depth, std::string& out, std::string& error) {
  if (depth > 256) {
    error = "tojson: value nests deeper than 256 levels";
    return false;
  }
  auto newline = [&](int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += *f.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      error = "tojson: cannot serialise an undefined value";
      return false;
    case Value::Kind::kCallable:
      error = "tojson: cannot serialise a callable";
      return false;
    case Value::Kind::kNone:
      out += "null";
      return true;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return true;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return true;
    case Value::Kind::kFloat: {
      const double x = v.as_float();
      if (std::isnan(x)) {
        out += "NaN";
      } else if (std::isinf(x)) {
        out += x > 0 ? "Infinity" : "-Infinity";
      } else {
        out += format_float(x);
      }
      return true;
    }
    case Value::Kind::kString:
      json_string(v.as_string(), f, out);
      return true;
    case Value::Kind::kList: {
      const List& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return true;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i > 0) out += f.item_separator;
        if (f.indent) newline(depth + 1);
        if (!json_rec(l[i], f, depth + 1, out, error)) return false;
      }
      if (f.indent) newline(depth);
      out += ']';
      return true;
    }
    case Value::Kind::kDict: {
      const auto& items = v.as_dict().items();
      if (items.empty()) {
        out += "{}";
        return true;
      }
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      // UTF-8 byte order is code point order.
      if (f.sort_keys) {
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return f.collate_keys ? collate(items[a].first, items[b].first) < 0 : items[a].first < items[b].first;
        });
      }
      out += '{';
      for (size_t k = 0; k < order.size(); ++k) {
        const auto& [key, value] = items[order[k]];
        if (k > 0) out += f.item_separator;
        if (f.indent) newline(depth + 1);
        json_string(key, f, out);
        out += f.key_separator;
        if (!json_rec(value, f, depth + 1, out, error)) return false;
      }
      if (f.indent) newline(depth);
      out += '}';
      return true;
    }
  }
  return false;
}

}  // namespace

bool to_json_text(const Value& v, int indent, std::string& out, std::string& error) {
  JsonFormat f;
  if (indent >= 0) {
    f.indent = std::string(static_cast<size_t>(indent), ' ');
    f.item_separator = ",";
  }
  return json_rec(v, f, 0, out, error);
}

bool to_json_text(const Value& v, const JsonFormat& format, std::string& out, std::string& error) {
  return json_rec(v, format, 0, out, error);
}

}  // namespace car::chat
