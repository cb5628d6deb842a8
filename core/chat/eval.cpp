// The evaluator: walks the AST with Jinja2's scoping (a for-loop body and a macro body get their own
// scope; `if` does not), Python's operator semantics, and the filters, tests, methods and globals chat
// templates use. Every node evaluated counts against a step budget; strings, lists, the output and macro
// recursion are bounded (RenderLimits).
//
// This file: the render entry points, printing (str/repr), scopes, and the UTF-8 and string helpers. The
// Renderer is declared in eval_internal.h; its statements, expressions, builtins, tests and filters live
// in the eval_*.cpp files named there.
#include "core/chat/eval_internal.h"
#include "core/util/error_codes.h"

namespace car::chat::eval_internal {

// ---- UTF-8 helpers (string length, indexing and slicing count code points) ----

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + len > s.size()) len = 1;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

std::string python_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

ScopeP Renderer::new_scope(const ScopeP& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  if (scopes_.size() >= 1024 && (scopes_.size() & (scopes_.size() - 1)) == 0) {
    std::erase_if(scopes_, [](const std::weak_ptr<Scope>& w) { return w.expired(); });
  }
  scopes_.push_back(s);
  return s;
}

void Renderer::release(detail::Arena& arena) {
  std::vector<std::shared_ptr<void>> keep;  // hold them while clearing, so clearing one frees none midway
  for (auto& w : scopes_) {
    if (auto s = w.lock()) {
      keep.push_back(s);
      s->vars.clear();
      s->parent.reset();
    }
  }
  for (auto& w : arena.lists) {
    if (auto l = w.lock()) {
      keep.push_back(l);
      l->clear();
    }
  }
  for (auto& w : arena.dicts) {
    if (auto d = w.lock()) {
      keep.push_back(d);
      d->clear();
    }
  }
}

std::string Renderer::str(const Value& v) const {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return js() ? "" : "None";
    case Value::Kind::kBool:
      return v.as_bool() ? (js() ? "true" : "True") : (js() ? "false" : "False");
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return format_float(v.as_float());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      if (js()) {
        std::string out, err;
        if (!to_json_text(v, -1, out, err)) return "";
        return out;
      }
      return repr(v, 0);
    case Value::Kind::kCallable:
      return "<function " + v.callable_name() + ">";
  }
  return "";
}

std::string Renderer::repr(const Value& v, int depth) const {
  if (depth > 200) return "...";
  switch (v.kind()) {
    case Value::Kind::kString:
      return python_repr_string(v.as_string());
    case Value::Kind::kList: {
      std::string s = "[";
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) s += ", ";
        first = false;
        s += repr(e, depth + 1);
      }
      return s + "]";
    }
    case Value::Kind::kDict: {
      std::string s = "{";
      bool first = true;
      for (const auto& [k, e] : v.as_dict().items()) {
        if (!first) s += ", ";
        first = false;
        s += python_repr_string(k) + ": " + repr(e, depth + 1);
      }
      return s + "}";
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return str(v);
  }
}

std::string Renderer::text_of(const Node& n, const Value& v, const char* what) const {
  if (v.is_string()) return v.as_string();
  if (js() || v.is_undefined()) {
    if (v.is_undefined() && !js()) return "";
    fail(n, std::string(what) + " expects a string, got " + v.kind_name());
  }
  return str(v);
}

Value Renderer::lookup(const ScopeP& scope, const std::string& name) const {
  for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
    if (const Value* v = s->vars.find(name)) return *v;
  }
  if (context_.is_dict()) {
    if (const Value* v = context_.as_dict().find(name)) return *v;
  }
  return global(name);
}

}  // namespace car::chat::eval_internal

namespace car::chat {

using eval_internal::Renderer;

Result<Template> Template::parse(std::string_view source) {
  try {
    Template t;
    t.root_ = parse_template(source);
    return t;
  } catch (const TemplateFailure& f) {
    return make_error(f.code, f.message);
  }
}

Result<std::string> Template::render(const Value& context, const RenderOptions& options) const {
  if (!root_) return make_error(errc::kTemplateError, "render of an empty (unparsed) template");
  detail::Arena arena;
  detail::Arena* const saved = detail::current_arena;
  detail::current_arena = &arena;
  Renderer r(options, context);
  Result<std::string> result = std::string();
  try {
    result = r.run(*root_);
  } catch (const TemplateFailure& f) {
    result = make_error(f.code, f.message);
  }
  detail::current_arena = saved;
  r.release(arena);
  return result;
}

Result<std::string> render_template(std::string_view source, const Value& context,
                                    const RenderOptions& options) {
  auto t = Template::parse(source);
  if (!t.ok()) return t.error();
  return t->render(context, options);
}

}  // namespace car::chat
