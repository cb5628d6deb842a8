// The evaluator's filters: `value | name(args)` (trim, tojson, join, map, selectattr, dictsort ...).
#include "core/chat/eval_internal.h"

namespace car::chat::eval_internal {

Value Renderer::filter(const Node& n, const std::string& name, const Value& v, CallArgs& args,
                       const ScopeP& scope) {
  auto bad = [&](const std::string& msg) { fail(n, "filter '" + name + "': " + msg); };
  auto karg = [&](size_t pos, const char* key) { return arg(args, pos, key); };
  auto to_list = [&](const Value& x) -> List {
    if (x.is_list()) return x.as_list();
    if (x.is_dict() || x.is_string() || x.is_undefined()) return iterate(n, x);
    bad(std::string("expects a list, got ") + x.kind_name());
    return {};
  };
  auto get_attr = [&](const Value& x, const std::string& path) {
    Value cur = x;
    size_t i = 0;
    while (true) {
      const size_t dot = path.find('.', i);
      const std::string part = path.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
      bool all_digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (all_digits && cur.is_list() && part.size() < 10) {
        cur = subscript(n, cur, Value::integer(std::stoll(part)));
      } else {
        cur = attribute(n, cur, part);
      }
      if (dot == std::string::npos) return cur;
      i = dot + 1;
    }
  };
  try {
    if (name == "trim") {
      const Value* chars = karg(0, "chars");
      const std::string s = text_of(n, v, "trim");
      if (chars != nullptr && chars->is_string()) return Value::string(strip_set(s, chars->as_string(), true, true));
      return Value::string(strip_space(s, true, true, js()));
    }
    if (name == "length" || name == "count") {
      if (v.is_string()) return Value::integer(static_cast<int64_t>(code_point_count(v.as_string())));
      if (v.is_list()) return Value::integer(static_cast<int64_t>(v.as_list().size()));
      if (v.is_dict()) return Value::integer(static_cast<int64_t>(v.as_dict().size()));
      if (v.is_undefined()) return Value::integer(0);
      bad(std::string("object of type ") + v.kind_name() + " has no length");
    }
    if (name == "upper") return make_string(n, to_upper(text_of(n, v, "upper")));
    if (name == "lower") return make_string(n, to_lower(text_of(n, v, "lower")));
    if (name == "title" && !js()) return make_string(n, jinja_title(text_of(n, v, "title")));
    if (name == "capitalize" || name == "title") {
      const Value s = Value::string(text_of(n, v, name.c_str()));
      CallArgs none;
      return attribute(n, s, name).as_function()(none);
    }
    if (name == "string") return make_string(n, str(v));
    if (name == "safe" || name == "e" || name == "escape") {
      if (name == "safe") return v;
      std::string out;
      for (char c : str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return make_string(n, std::move(out));
    }
    if (name == "default" || name == "d") {
      const Value* dflt = karg(0, "default_value");
      const Value* boolean = karg(1, "boolean");
      const bool use = v.is_undefined() || (boolean != nullptr && boolean->truthy() && !v.truthy());
      if (use) return dflt ? *dflt : Value::string("");
      return v;
    }
    if (name == "join") {
      const Value* sep = karg(0, "d");
      const Value* attr = karg(1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& e : to_list(v)) {
        if (!first) out += sep ? str(*sep) : "";
        first = false;
        out += str(attr && attr->is_string() ? get_attr(e, attr->as_string()) : e);
        if (out.size() > opt_.limits.max_string_bytes) bad("the result is too long");
      }
      return Value::string(std::move(out));
    }
    if (name == "first" || name == "last") {
      const List l = to_list(v);
      if (l.empty()) return Value();
      return name == "first" ? l.front() : l.back();
    }
    if (name == "list") return make_list(n, to_list(v));
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.as_string());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value::string(std::move(out));
      }
      List l = to_list(v);
      std::reverse(l.begin(), l.end());
      return Value::list(std::move(l));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::list();
      if (!v.is_dict()) bad(std::string("expects a dict, got ") + v.kind_name());
      List out;
      for (const auto& [k, e] : v.as_dict().items()) out.push_back(Value::list({Value::string(k), e}));
      return Value::list(std::move(out));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) bad(std::string("expects a dict, got ") + v.kind_name());
      const Value* cs = karg(0, "case_sensitive");
      const Value* by = karg(1, "by");
      const Value* rev = karg(2, "reverse");
      const bool by_value = by && by->is_string() && by->as_string() == "value";
      List out;
      for (const auto& [k, e] : v.as_dict().items()) out.push_back(Value::list({Value::string(k), e}));
      const bool case_sensitive = cs && cs->truthy();
      std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
        Value x = a.as_list()[by_value ? 1 : 0], y = b.as_list()[by_value ? 1 : 0];
        if (!case_sensitive && x.is_string() && y.is_string()) {
          x = Value::string(to_lower(x.as_string()));
          y = Value::string(to_lower(y.as_string()));
        }
        return order(n, "<", x, y) < 0;
      });
      if (rev && rev->truthy()) std::reverse(out.begin(), out.end());
      return Value::list(std::move(out));
    }
    if (name == "sort") {
      const Value* rev = karg(0, "reverse");
      const Value* cs = karg(1, "case_sensitive");
      const Value* attr = karg(2, "attribute");
      List l = to_list(v);
      const bool case_sensitive = cs && cs->truthy();
      auto key = [&](const Value& e) {
        Value k = attr && attr->is_string() ? get_attr(e, attr->as_string()) : e;
        if (!case_sensitive && k.is_string()) k = Value::string(to_lower(k.as_string()));
        return k;
      };
      std::stable_sort(l.begin(), l.end(),
                       [&](const Value& a, const Value& b) { return order(n, "<", key(a), key(b)) < 0; });
      if (rev && rev->truthy()) std::reverse(l.begin(), l.end());
      return Value::list(std::move(l));
    }
    if (name == "unique") {
      List out;
      for (const Value& e : to_list(v)) {
        bool seen = false;
        for (const Value& o : out) seen = seen || equal(o, e);
        if (!seen) out.push_back(e);
      }
      return Value::list(std::move(out));
    }
    if (name == "map") {
      const Value* attr = arg(args, 99, "attribute");
      List out;
      if (attr != nullptr) {
        if (!attr->is_string()) bad("attribute must be a string");
        const Value* dflt = arg(args, 99, "default");
        for (const Value& e : to_list(v)) {
          Value x = get_attr(e, attr->as_string());
          out.push_back(x.is_undefined() && dflt ? *dflt : x);
        }
        return Value::list(std::move(out));
      }
      if (args.positional.empty() || !args.positional[0].is_string())
        bad("needs a filter name or attribute=");
      const std::string fname = args.positional[0].as_string();
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      for (const Value& e : to_list(v)) {
        CallArgs copy = rest;
        out.push_back(filter(n, fname, e, copy, scope));
      }
      return Value::list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (args.positional.empty() || !args.positional[0].is_string()) bad("needs an attribute name");
        attr = args.positional[0].as_string();
        k = 1;
      }
      std::string test_name;
      List test_args;
      if (k < args.positional.size()) {
        if (!args.positional[k].is_string()) bad("the test name must be a string");
        test_name = args.positional[k].as_string();
        test_args.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(k + 1), args.positional.end());
      }
      List out;
      for (const Value& e : to_list(v)) {
        const Value x = by_attr ? get_attr(e, attr) : e;
        const bool r = test_name.empty() ? x.truthy() : test_named(n, test_name, x, test_args);
        if (r == keep_if) out.push_back(e);
      }
      return Value::list(std::move(out));
    }
    if (name == "tojson") {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), positional
      // arguments in that order. The reference renderer reads these keywords only (ignoring others and
      // positional arguments), takes indent 0 as none and sorts keys by collation (localeCompare).
      const bool reference = js();
      if (!reference) check_args(args, 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
      const size_t no = 99;  // the reference: keywords only
      const Value* ensure_ascii = arg(args, reference ? no : 0, "ensure_ascii");
      const Value* indent = arg(args, reference ? no : 1, "indent");
      const Value* separators = arg(args, reference ? no : 2, "separators");
      const Value* sort_keys = arg(args, reference ? no : 3, "sort_keys");
      JsonFormat f;
      if (indent != nullptr && !indent->is_none()) {
        if (indent->is_int()) {
          if (indent->as_int() < 0 || indent->as_int() > 64) bad("indent must be an integer 0..64");
          if (!reference || indent->as_int() > 0) f.indent = std::string(static_cast<size_t>(indent->as_int()), ' ');
        } else if (indent->is_string() && !reference) {
          if (indent->as_string().size() > 64) bad("indent must be at most 64 characters");
          f.indent = indent->as_string();
        } else {
          bad("indent must be an integer");
        }
      }
      if (f.indent) f.item_separator = ",";
      if (separators != nullptr && !separators->is_none()) {
        const List* l = separators->is_list() ? &separators->as_list() : nullptr;
        if (l == nullptr || l->size() != 2 || !(*l)[0].is_string() || !(*l)[1].is_string()) {
          bad("separators must be a pair of strings (item, key)");
        }
        f.item_separator = (*l)[0].as_string();
        f.key_separator = (*l)[1].as_string();
      }
      f.sort_keys = sort_keys != nullptr && sort_keys->truthy();
      f.ensure_ascii = ensure_ascii != nullptr && ensure_ascii->truthy();
      f.collate_keys = reference;
      std::string out, err;
      if (!to_json_text(v, f, out, err)) bad(err);
      return make_string(n, std::move(out));
    }
    if (name == "int") {
      const Value* dflt = karg(0, "default");
      const Value fallback = dflt ? *dflt : Value::integer(0);
      if (v.is_int()) return v;
      if (v.is_bool()) return Value::integer(v.as_bool() ? 1 : 0);
      if (v.is_float()) {
        const double f = v.as_float();
        if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return fallback;
        return Value::integer(static_cast<int64_t>(f));
      }
      if (v.is_string()) {
        const std::string s = strip_space(v.as_string(), true, true, js());
        char* end = nullptr;
        errno = 0;
        const long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::integer(i);
        const double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(f) && std::fabs(f) < 9.2e18) {
          return Value::integer(static_cast<int64_t>(f));
        }
      }
      return fallback;
    }
    if (name == "float") {
      const Value* dflt = karg(0, "default");
      const Value fallback = dflt ? *dflt : Value::floating(0.0);
      if (num(v)) return Value::floating(fnum(v));
      if (v.is_string()) {
        const std::string s = strip_space(v.as_string(), true, true, js());
        char* end = nullptr;
        const double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value::floating(f);
      }
      return fallback;
    }
    if (name == "abs") {
      if (v.is_float()) return Value::floating(std::fabs(v.as_float()));
      if (!intlike(v)) bad(std::string("expects a number, got ") + v.kind_name());
      if (inum(v) == std::numeric_limits<int64_t>::min()) bad("integer overflow");
      return Value::integer(std::llabs(inum(v)));
    }
    if (name == "round") {
      if (!num(v)) bad(std::string("expects a number, got ") + v.kind_name());
      const Value* prec = karg(0, "precision");
      const Value* method = karg(1, "method");
      const int64_t p = prec && prec->is_int() ? std::clamp<int64_t>(prec->as_int(), -300, 300) : 0;
      const std::string m = method && method->is_string() ? method->as_string() : "common";
      const double scale = std::pow(10.0, static_cast<double>(p));
      const double x = fnum(v) * scale;
      double r = m == "floor" ? std::floor(x) : m == "ceil" ? std::ceil(x) : std::round(x);
      return Value::floating(r / scale);
    }
    if (name == "sum" || name == "min" || name == "max") {
      const List l = to_list(v);
      const Value* attr = arg(args, 99, "attribute");
      auto key = [&](const Value& e) {
        return attr && attr->is_string() ? get_attr(e, attr->as_string()) : e;
      };
      if (name == "sum") {
        const Value* start = arg(args, 99, "start");
        Value acc = start ? *start : Value::integer(0);
        for (const Value& e : l) {
          const Value x = key(e);
          if (!num(acc) || !num(x)) bad("can only add numbers");
          if (intlike(acc) && intlike(x)) {
            int64_t s;
            if (__builtin_add_overflow(inum(acc), inum(x), &s)) bad("integer overflow");
            acc = Value::integer(s);
          } else {
            acc = Value::floating(fnum(acc) + fnum(x));
          }
        }
        return acc;
      }
      if (l.empty()) return Value();
      Value best = l[0];
      for (const Value& e : l) {
        const int c = order(n, "<", key(e), key(best));
        if (name == "min" ? c < 0 : (c > 0 && c != 2)) best = e;
      }
      return best;
    }
    if (name == "indent") {
      const Value* width = karg(0, "width");
      const Value* first = karg(1, "first");
      const Value* blank = karg(2, "blank");
      std::string pad;
      if (width && width->is_string()) {
        pad = width->as_string();
      } else {
        const int64_t w = width && width->is_int() ? width->as_int() : 4;
        if (w < 0 || w > 1024) bad("width must be 0..1024");
        pad.assign(static_cast<size_t>(w), ' ');
      }
      const std::string s = text_of(n, v, "indent") + "\n";
      std::vector<std::string> lines;
      size_t i = 0;
      while (i < s.size()) {
        const size_t e = s.find('\n', i);
        lines.push_back(s.substr(i, e - i));
        i = e + 1;
      }
      std::string out;
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k > 0) out += "\n";
        const bool indent_it =
            (k > 0 || (first && first->truthy())) && (!lines[k].empty() || (blank && blank->truthy()));
        if (indent_it) out += pad;
        out += lines[k];
        if (out.size() > opt_.limits.max_string_bytes) bad("the result is too long");
      }
      return Value::string(std::move(out));
    }
    if (name == "replace") {
      const Value s = Value::string(text_of(n, v, "replace"));
      return attribute(n, s, "replace").as_function()(args);
    }
    if (name == "wordcount") {
      const Value s = Value::string(text_of(n, v, "wordcount"));
      CallArgs none;
      return Value::integer(
          static_cast<int64_t>(attribute(n, s, "split").as_function()(none).as_list().size()));
    }
    if (name == "attr") {
      const std::string key = string_arg(args, 0, "name");
      return attribute(n, v, key);
    }
  } catch (const std::string& msg) {
    bad(msg);
  }
  fail(n, "unknown filter '" + name + "'");
}

}  // namespace car::chat::eval_internal
