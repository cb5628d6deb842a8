// The evaluator's builtins: the globals a chat template may call (range, namespace, raise_exception,
// strftime_now ...) and the methods of strings, lists and dicts (value.attribute / value.method()).
#include "core/chat/eval_internal.h"
#include "core/util/error_codes.h"

namespace car::chat::eval_internal {

const Value* arg(const CallArgs& a, size_t pos, const char* name) {
  for (const auto& [k, v] : a.keyword) {
    if (k == name) return &v;
  }
  return pos < a.positional.size() ? &a.positional[pos] : nullptr;
}

void check_args(const CallArgs& a, size_t max_pos, std::initializer_list<const char*> names) {
  if (a.positional.size() > max_pos) {
    throw std::string("takes at most " + std::to_string(max_pos) + " positional arguments, got " +
                      std::to_string(a.positional.size()));
  }
  for (const auto& [k, v] : a.keyword) {
    bool known = false;
    for (const char* nm : names) known = known || k == nm;
    if (!known) throw std::string("unexpected keyword argument '" + k + "'");
  }
}

std::string string_arg(const CallArgs& a, size_t pos, const char* name) {
  const Value* v = arg(a, pos, name);
  if (v == nullptr) throw std::string("missing argument '") + name + "'";
  if (!v->is_string()) throw std::string("argument '") + name + "' must be a string, got " + v->kind_name();
  return v->as_string();
}

Value Renderer::global(const std::string& name) const {
  const RenderLimits lim = opt_.limits;
  if (name == "range") {
    return Value::callable(
        [lim](CallArgs& a) -> Value {
          check_args(a, 3, {});
          std::vector<int64_t> p;
          for (const Value& v : a.positional) {
            if (!v.is_int()) throw std::string("arguments must be integers");
            p.push_back(v.as_int());
          }
          if (p.empty()) throw std::string("expected 1 to 3 arguments");
          int64_t start = 0, stop = p[0], st = 1;
          if (p.size() >= 2) {
            start = p[0];
            stop = p[1];
          }
          if (p.size() == 3) st = p[2];
          if (st == 0) throw std::string("step must not be zero");
          List out;
          for (int64_t i = start; st > 0 ? i < stop : i > stop;) {
            if (out.size() >= lim.max_list_items) {
              throw std::string("more than " + std::to_string(lim.max_list_items) + " items");
            }
            out.push_back(Value::integer(i));
            if (__builtin_add_overflow(i, st, &i)) break;
          }
          return Value::list(std::move(out));
        },
        "range");
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::callable(
        [ns](CallArgs& a) -> Value {
          auto d = std::make_shared<Dict>();
          d->is_namespace = ns;
          for (const Value& p : a.positional) {
            if (!p.is_dict()) throw std::string("positional arguments must be dicts");
            for (const auto& [k, v] : p.as_dict().items()) d->set(k, v);
          }
          for (const auto& [k, v] : a.keyword) d->set(k, v);
          return Value::dict(std::move(d));
        },
        name);
  }
  if (name == "raise_exception") {
    return Value::callable(
        [](CallArgs& a) -> Value {
          std::string msg = a.positional.empty() || !a.positional[0].is_string()
                                ? std::string(errc::kRaiseException)
                                : a.positional[0].as_string();
          throw TemplateFailure{errc::kRaiseException, std::move(msg)};
        },
        "raise_exception");
  }
  if (name == "strftime_now") {
    const std::optional<std::tm> fixed = opt_.now;
    return Value::callable(
        [fixed](CallArgs& a) -> Value {
          check_args(a, 1, {"format"});
          const std::string fmt = string_arg(a, 0, "format");
          std::tm tm{};
          if (fixed) {
            tm = *fixed;
          } else {
            const std::time_t t = std::time(nullptr);
            localtime_r(&t, &tm);
          }
          if (fmt.empty()) return Value::string("");
          if (fmt.size() > 1024) throw std::string("format longer than 1024 bytes");
          std::string buf(fmt.size() * 64 + 64, '\0');
          const size_t len = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
          buf.resize(len);
          return Value::string(std::move(buf));
        },
        "strftime_now");
  }
  return Value();
}

Value Renderer::attribute(const Node& n, const Value& obj, const std::string& name) {
  // Python Jinja2's Undefined raises on attribute access; @huggingface/jinja yields undefined again.
  if (obj.is_undefined() && !js()) fail(n, "cannot read attribute '" + name + "' of an undefined value");
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
    const std::shared_ptr<Dict> d = obj.dict_ptr();
    if (name == "items" || name == "keys" || name == "values") {
      return Value::callable(
          [d, name](CallArgs& a) -> Value {
            check_args(a, 0, {});
            List out;
            for (const auto& [k, v] : d->items()) {
              if (name == "items") {
                out.push_back(Value::list({Value::string(k), v}));
              } else {
                out.push_back(name == "keys" ? Value::string(k) : v);
              }
            }
            return Value::list(std::move(out));
          },
          name);
    }
    if (name == "get") {
      return Value::callable(
          [d](CallArgs& a) -> Value {
            check_args(a, 2, {});
            if (a.positional.empty()) throw std::string("missing the key");
            if (a.positional[0].is_string()) {
              if (const Value* v = d->find(a.positional[0].as_string())) return *v;
            }
            return a.positional.size() > 1 ? a.positional[1] : Value::none();
          },
          "get");
    }
    return Value();
  }
  if (obj.is_string()) {
    const std::string s = obj.as_string();
    const bool js_strip = js();
    auto method = [&](auto fn) { return Value::callable(fn, name); };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return method([s, l, r, js_strip](CallArgs& a) -> Value {
        check_args(a, 1, {});
        const Value* chars = arg(a, 0, "chars");
        if (chars != nullptr && chars->is_string() && !js_strip) {
          return Value::string(strip_set(s, chars->as_string(), l, r));
        }
        return Value::string(strip_space(s, l, r, js_strip));
      });
    }
    if (name == "upper") return method([s](CallArgs&) -> Value { return Value::string(to_upper(s)); });
    if (name == "lower") return method([s](CallArgs&) -> Value { return Value::string(to_lower(s)); });
    if (name == "title") return method([s, js_strip](CallArgs&) -> Value { return Value::string(to_title(s, js_strip)); });
    if (name == "capitalize") {
      return method([s, js_strip](CallArgs&) -> Value { return Value::string(capitalize(s, js_strip)); });
    }
    if (name == "startswith" || name == "endswith") {
      const bool sw = name == "startswith";
      return method([s, sw](CallArgs& a) -> Value {
        check_args(a, 1, {});
        if (a.positional.empty()) throw std::string("missing the prefix");
        List options = a.positional[0].is_list() ? a.positional[0].as_list() : List{a.positional[0]};
        for (const Value& o : options) {
          if (!o.is_string()) throw std::string("expects a string or a tuple of strings");
          const std::string& p = o.as_string();
          if (p.size() <= s.size() &&
              (sw ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0)) {
            return Value::boolean(true);
          }
        }
        return Value::boolean(false);
      });
    }
    if (name == "split") {
      const size_t max_items = opt_.limits.max_list_items;
      return method([s, max_items, js_strip](CallArgs& a) -> Value {
        check_args(a, 2, {"sep", "maxsplit"});
        const Value* sep = arg(a, 0, "sep");
        const Value* ms = arg(a, 1, "maxsplit");
        int64_t maxsplit = ms != nullptr && ms->is_int() ? ms->as_int() : -1;
        List out;
        if (sep == nullptr || sep->is_none()) {
          split_space(s, maxsplit, js_strip, [&](std::string part) {
            if (out.size() >= max_items) throw std::string("too many parts");
            out.push_back(Value::string(std::move(part)));
          });
          return Value::list(std::move(out));
        }
        if (!sep->is_string()) throw std::string("the separator must be a string");
        const std::string& p = sep->as_string();
        if (p.empty()) throw std::string("empty separator");
        size_t i = 0;
        while (true) {
          if (out.size() >= max_items) throw std::string("too many parts");
          const size_t f = maxsplit == 0 ? std::string::npos : s.find(p, i);
          if (f == std::string::npos) {
            out.push_back(Value::string(s.substr(i)));
            break;
          }
          out.push_back(Value::string(s.substr(i, f - i)));
          i = f + p.size();
          if (maxsplit > 0) --maxsplit;
        }
        return Value::list(std::move(out));
      });
    }
    if (name == "replace") {
      const size_t max_bytes = opt_.limits.max_string_bytes;
      return method([s, max_bytes](CallArgs& a) -> Value {
        check_args(a, 3, {"count"});
        const std::string from = string_arg(a, 0, "old"), to = string_arg(a, 1, "new");
        const Value* c = arg(a, 2, "count");
        int64_t count = c != nullptr && c->is_int() ? c->as_int() : -1;
        std::string out;
        if (from.empty()) {
          // Python inserts `to` around every code point.
          auto cps = code_points(s);
          for (size_t i = 0; i <= cps.size(); ++i) {
            if (count != 0) {
              out += to;
              if (count > 0) --count;
            }
            if (i < cps.size()) out += cps[i];
            if (out.size() > max_bytes) throw std::string("the result is too long");
          }
          return Value::string(std::move(out));
        }
        size_t i = 0;
        while (count != 0) {
          const size_t f = s.find(from, i);
          if (f == std::string::npos) break;
          out.append(s, i, f - i);
          out += to;
          if (out.size() > max_bytes) throw std::string("the result is too long");
          i = f + from.size();
          if (count > 0) --count;
        }
        out.append(s, i, std::string::npos);
        return Value::string(std::move(out));
      });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return method([s, find](CallArgs& a) -> Value {
        check_args(a, 1, {});
        const std::string p = string_arg(a, 0, "sub");
        if (find) {
          const size_t f = s.find(p);
          return Value::integer(
              f == std::string::npos ? -1 : static_cast<int64_t>(code_point_count(s.substr(0, f))));
        }
        if (p.empty()) return Value::integer(static_cast<int64_t>(code_point_count(s) + 1));
        int64_t c = 0;
        for (size_t i = s.find(p); i != std::string::npos; i = s.find(p, i + p.size())) ++c;
        return Value::integer(c);
      });
    }
    if (name == "splitlines") {
      return method([s](CallArgs&) -> Value {
        List out;
        size_t i = 0;
        while (i < s.size()) {
          size_t e = s.find('\n', i);
          if (e == std::string::npos) e = s.size();
          std::string line = s.substr(i, e - i);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          out.push_back(Value::string(std::move(line)));
          i = e + 1;
        }
        return Value::list(std::move(out));
      });
    }
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" ||
        name == "islower" || name == "isupper") {
      return method([s, name](CallArgs&) -> Value {
        if (s.empty()) return Value::boolean(false);
        bool any_cased = false;
        for (unsigned char c : s) {
          if (name == "isdigit" && !std::isdigit(c)) return Value::boolean(false);
          if (name == "isspace" && !std::isspace(c)) return Value::boolean(false);
          if (name == "isalpha" && !std::isalpha(c)) return Value::boolean(false);
          if (name == "isalnum" && !std::isalnum(c)) return Value::boolean(false);
          if (name == "islower" && std::isupper(c)) return Value::boolean(false);
          if (name == "isupper" && std::islower(c)) return Value::boolean(false);
          any_cased = any_cased || std::isalpha(c);
        }
        return Value::boolean(name == "islower" || name == "isupper" ? any_cased : true);
      });
    }
    return Value();
  }
  if (obj.is_list()) {
    const std::shared_ptr<List> l = obj.list_ptr();
    const size_t max_items = opt_.limits.max_list_items;
    if (name == "append") {
      return Value::callable(
          [l, max_items](CallArgs& a) -> Value {
            check_args(a, 1, {});
            if (a.positional.size() != 1) throw std::string("takes exactly one argument");
            if (l->size() >= max_items) throw std::string("the list is full");
            l->push_back(a.positional[0]);
            return Value::none();
          },
          name);
    }
    if (name == "pop") {
      return Value::callable(
          [l](CallArgs& a) -> Value {
            check_args(a, 1, {});
            int64_t i = a.positional.empty() || !a.positional[0].is_int() ? -1 : a.positional[0].as_int();
            const auto sz = static_cast<int64_t>(l->size());
            if (i < 0) i += sz;
            if (i < 0 || i >= sz) throw std::string("index out of range");
            Value v = (*l)[static_cast<size_t>(i)];
            l->erase(l->begin() + i);
            return v;
          },
          name);
    }
    if (name == "index") {
      return Value::callable(
          [this, l](CallArgs& a) -> Value {
            check_args(a, 1, {});
            if (a.positional.empty()) throw std::string("missing the value");
            for (size_t i = 0; i < l->size(); ++i) {
              if (equal((*l)[i], a.positional[0])) return Value::integer(static_cast<int64_t>(i));
            }
            throw std::string("value not in list");
          },
          name);
    }
    return Value();
  }
  (void)n;
  return Value();
}

}  // namespace car::chat::eval_internal
