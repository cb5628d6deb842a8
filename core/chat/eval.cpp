// The evaluator: walks the AST with Jinja2's scoping (a for-loop body and a macro body get their own
// scope; `if` does not), Python's operator semantics, and the filters, tests, methods and globals chat
// templates use. Every node evaluated counts against a step budget; strings, lists, the output and macro
// recursion are bounded (RenderLimits).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include "core/chat/ast.h"
#include "core/chat/jinja.h"

namespace car::chat {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

struct Scope {
  std::shared_ptr<Scope> parent;
  Dict vars;
};
using ScopeP = std::shared_ptr<Scope>;

std::string where(const Node& n) {
  return "line " + std::to_string(n.line) + ":" + std::to_string(n.col);
}

[[noreturn]] void fail(const Node& n, const std::string& msg) {
  throw TemplateFailure{"template_error", where(n) + ": " + msg};
}

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

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right) {
  auto in_set = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_ws(c); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && in_set(s[b])) ++b;
  }
  if (right) {
    while (e > b && in_set(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
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

class Renderer;

struct Macro {
  const Node* node;
  ScopeP closure;
};

class Renderer {
 public:
  Renderer(const RenderOptions& o, const Value& context) : opt_(o), context_(context) {}

  std::string run(const Node& root) {
    std::string out;
    out_ = &out;
    auto top = new_scope(nullptr);
    exec(root, top);
    return out;
  }

  // Every scope the render makes, so that release() can break cycles through them (a macro's closure).
  ScopeP new_scope(const ScopeP& parent) {
    auto s = std::make_shared<Scope>();
    s->parent = parent;
    if (scopes_.size() >= 1024 && (scopes_.size() & (scopes_.size() - 1)) == 0) {
      std::erase_if(scopes_, [](const std::weak_ptr<Scope>& w) { return w.expired(); });
    }
    scopes_.push_back(s);
    return s;
  }

  // Empties every scope, list and dict the render made and that is still alive (only a reference cycle
  // keeps one alive after the render), so all of them are freed.
  void release(detail::Arena& arena) {
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

 private:
  bool js() const { return opt_.js_strip_quirk; }

  void step(const Node& n) {
    if (++steps_ > opt_.limits.max_steps) {
      fail(n, "the template ran more than " + std::to_string(opt_.limits.max_steps) + " steps");
    }
  }

  void emit(const Node& n, const std::string& s) {
    if (out_->size() + s.size() > opt_.limits.max_output_bytes) {
      fail(n, "the output exceeds " + std::to_string(opt_.limits.max_output_bytes) + " bytes");
    }
    out_->append(s);
  }

  Value make_string(const Node& n, std::string s) const {
    if (s.size() > opt_.limits.max_string_bytes) {
      fail(n, "a string exceeds " + std::to_string(opt_.limits.max_string_bytes) + " bytes");
    }
    return Value::string(std::move(s));
  }
  Value make_list(const Node& n, List l) const {
    if (l.size() > opt_.limits.max_list_items) {
      fail(n, "a list exceeds " + std::to_string(opt_.limits.max_list_items) + " items");
    }
    return Value::list(std::move(l));
  }

  // ---- printing ----

  std::string str(const Value& v) const {
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

  std::string repr(const Value& v, int depth) const {
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

  // A string argument of a filter or method. Python Jinja2 converts anything to its text (None -> "None");
  // @huggingface/jinja raises for a non-string.
  std::string text_of(const Node& n, const Value& v, const char* what) const {
    if (v.is_string()) return v.as_string();
    if (js() || v.is_undefined()) {
      if (v.is_undefined() && !js()) return "";
      fail(n, std::string(what) + " expects a string, got " + v.kind_name());
    }
    return str(v);
  }

  // ---- scopes ----

  Value lookup(const ScopeP& scope, const std::string& name) const {
    for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
      if (const Value* v = s->vars.find(name)) return *v;
    }
    if (context_.is_dict()) {
      if (const Value* v = context_.as_dict().find(name)) return *v;
    }
    return global(name);
  }

  Value global(const std::string& name) const;

  // ---- statements ----

  Flow exec(const Node& n, const ScopeP& scope) {
    step(n);
    switch (n.type) {
      case NodeType::kBlock:
        for (const NodeP& k : n.kids) {
          const Flow f = exec(*k, scope);
          if (f != Flow::kNormal) return f;
        }
        return Flow::kNormal;
      case NodeType::kText:
        emit(n, n.text);
        return Flow::kNormal;
      case NodeType::kOutput:
        emit(n, str(eval(*n.a, scope)));
        return Flow::kNormal;
      case NodeType::kIf:
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          if (eval(*n.kids[i], scope).truthy()) return exec(*n.kids[i + 1], scope);
        }
        if (n.b) return exec(*n.b, scope);
        return Flow::kNormal;
      case NodeType::kFor:
        exec_for(n, scope);
        return Flow::kNormal;
      case NodeType::kSet:
        exec_set(n, scope);
        return Flow::kNormal;
      case NodeType::kMacro: {
        scope->vars.set(n.name, make_macro(n, scope, n.name));
        return Flow::kNormal;
      }
      case NodeType::kCallBlock: {
        const Node& call = *n.a;
        Value caller = make_macro(n, scope, "caller");
        Value callee = eval(*call.a, scope);
        CallArgs args = eval_args(call, scope);
        args.keyword.emplace_back("caller", caller);
        emit(n, str(invoke(call, callee, args)));
        return Flow::kNormal;
      }
      case NodeType::kFilterBlock: {
        const std::string body = capture(*n.c, scope);
        emit(n, str(eval_filter_chain(*n.a, Value::string(body), scope)));
        return Flow::kNormal;
      }
      case NodeType::kBreak:
        return Flow::kBreak;
      case NodeType::kContinue:
        return Flow::kContinue;
      default:
        fail(n, "internal: not a statement");
    }
  }

  std::string capture(const Node& body, const ScopeP& scope) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      const Flow f = exec(body, scope);
      (void)f;
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  List iterate(const Node& n, const Value& v) const {
    switch (v.kind()) {
      case Value::Kind::kList:
        return v.as_list();
      case Value::Kind::kDict: {
        List keys;
        for (const auto& [k, e] : v.as_dict().items()) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::Kind::kString: {
        List chars;
        for (auto& c : code_points(v.as_string())) chars.push_back(Value::string(std::move(c)));
        return chars;
      }
      case Value::Kind::kUndefined:
        return {};
      default:
        fail(n, std::string("cannot iterate over a value of type ") + v.kind_name());
    }
  }

  void bind(const Node& n, Scope& s, const std::vector<std::string>& names, const Value& v) const {
    if (names.size() == 1) {
      s.vars.set(names[0], v);
      return;
    }
    List parts;
    if (v.is_list()) {
      parts = v.as_list();
    } else if (v.is_string()) {
      for (auto& c : code_points(v.as_string())) parts.push_back(Value::string(std::move(c)));
    } else {
      fail(n, std::string("cannot unpack a value of type ") + v.kind_name() + " into " +
                  std::to_string(names.size()) + " names");
    }
    if (parts.size() != names.size()) {
      fail(n, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                  std::to_string(names.size()) + " names");
    }
    for (size_t i = 0; i < names.size(); ++i) s.vars.set(names[i], parts[i]);
  }

  void exec_for(const Node& n, const ScopeP& scope) {
    const Value iterable = eval(*n.a, scope);
    List items = iterate(n, iterable);
    if (n.b) {  // `for x in xs if cond`: filter first, so loop.* counts what passed
      List kept;
      for (const Value& item : items) {
        auto s = new_scope(scope);
        bind(n, *s, n.names, item);
        if (eval(*n.b, s).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.d) exec(*n.d, scope);
      return;
    }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      step(n);
      auto s = new_scope(scope);
      auto loop = std::make_shared<Dict>();
      loop->set("index", Value::integer(i + 1));
      loop->set("index0", Value::integer(i));
      loop->set("revindex", Value::integer(len - i));
      loop->set("revindex0", Value::integer(len - i - 1));
      loop->set("first", Value::boolean(i == 0));
      loop->set("last", Value::boolean(i == len - 1));
      loop->set("length", Value::integer(len));
      loop->set("depth", Value::integer(1));
      loop->set("depth0", Value::integer(0));
      loop->set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      loop->set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value());
      loop->set("cycle", Value::callable(
                             [i](CallArgs& a) -> Value {
                               if (a.positional.empty()) return Value();
                               return a.positional[static_cast<size_t>(i) % a.positional.size()];
                             },
                             "loop.cycle"));
      s->vars.set("loop", Value::dict(loop));
      bind(n, *s, n.names, items[static_cast<size_t>(i)]);
      if (exec(*n.c, s) == Flow::kBreak) break;
    }
  }

  void exec_set(const Node& n, const ScopeP& scope) {
    if (!n.attr.empty()) {
      const Value target = lookup(scope, n.names[0]);
      if (!target.is_dict() || !target.as_dict().is_namespace) {
        fail(n, "'set " + n.names[0] + "." + n.attr + "' needs a namespace(), but " + n.names[0] + " is " +
                    (target.is_undefined() ? "undefined" : std::string("a ") + target.kind_name()));
      }
      target.as_dict().set(n.attr, eval(*n.a, scope));
      return;
    }
    if (n.c) {
      scope->vars.set(n.names[0], make_string(n, capture(*n.c, scope)));
      return;
    }
    bind(n, *scope, n.names, eval(*n.a, scope));
  }

  Value make_macro(const Node& n, const ScopeP& scope, const std::string& name) {
    Macro m{&n, scope};
    return Value::callable([this, m](CallArgs& args) -> Value { return call_macro(m, args); }, name);
  }

  Value call_macro(const Macro& m, CallArgs& args) {
    const Node& n = *m.node;
    if (++call_depth_ > opt_.limits.max_call_depth) {
      --call_depth_;
      fail(n, "macro calls nest deeper than " + std::to_string(opt_.limits.max_call_depth));
    }
    auto s = new_scope(m.closure);
    if (args.positional.size() > n.names.size()) {
      --call_depth_;
      fail(n, "macro '" + n.name + "' takes " + std::to_string(n.names.size()) + " arguments, got " +
                  std::to_string(args.positional.size()));
    }
    for (size_t i = 0; i < n.names.size(); ++i) {
      if (i < args.positional.size()) {
        s->vars.set(n.names[i], args.positional[i]);
      } else if (n.kids[i]) {
        s->vars.set(n.names[i], eval(*n.kids[i], s));
      } else {
        s->vars.set(n.names[i], Value());
      }
    }
    for (auto& [k, v] : args.keyword) {
      if (k == "caller" || std::find(n.names.begin(), n.names.end(), k) != n.names.end()) {
        s->vars.set(k, v);
      } else {
        --call_depth_;
        fail(n, "macro '" + n.name + "' has no parameter '" + k + "'");
      }
    }
    std::string out;
    try {
      out = capture(*n.c, s);
    } catch (...) {
      --call_depth_;
      throw;
    }
    --call_depth_;
    return Value::string(std::move(out));
  }

  // ---- expressions ----

  CallArgs eval_args(const Node& n, const ScopeP& scope) {
    CallArgs a;
    for (const NodeP& k : n.kids) a.positional.push_back(eval(*k, scope));
    for (const auto& [key, k] : n.kwargs) a.keyword.emplace_back(key, eval(*k, scope));
    return a;
  }

  Value invoke(const Node& n, const Value& callee, CallArgs& args) {
    if (!callee.is_callable()) {
      fail(n, std::string("cannot call a value of type ") + callee.kind_name() +
                  (n.a && n.a->type == NodeType::kName ? " ('" + n.a->name + "' is not a function)" : ""));
    }
    try {
      return callee.as_function()(args);
    } catch (const std::string& msg) {  // builtins report argument errors as plain strings
      fail(n, callee.callable_name() + ": " + msg);
    }
  }

  Value eval(const Node& n, const ScopeP& scope) {
    step(n);
    switch (n.type) {
      case NodeType::kLiteral:
        return n.value;
      case NodeType::kName:
        return lookup(scope, n.name);
      case NodeType::kList: {
        List items;
        for (const NodeP& k : n.kids) items.push_back(eval(*k, scope));
        return Value::list(std::move(items));
      }
      case NodeType::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          const Value k = eval(*n.kids[i], scope);
          if (!k.is_string())
            fail(*n.kids[i], std::string("dict keys must be strings, got ") + k.kind_name());
          d->set(k.as_string(), eval(*n.kids[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
      case NodeType::kAttr:
        return attribute(n, eval(*n.a, scope), n.name);
      case NodeType::kIndex:
        return subscript(n, eval(*n.a, scope), eval(*n.b, scope));
      case NodeType::kSlice:
        return slice(n, eval(*n.a, scope), n.b ? eval(*n.b, scope) : Value::none(),
                     n.c ? eval(*n.c, scope) : Value::none(), n.d ? eval(*n.d, scope) : Value::none());
      case NodeType::kCall: {
        const Value callee = eval(*n.a, scope);
        CallArgs args = eval_args(n, scope);
        return invoke(n, callee, args);
      }
      case NodeType::kFilter:
        return eval_filter_chain(n, Value(), scope);
      case NodeType::kTest: {
        const Value v = eval(*n.a, scope);
        CallArgs args = eval_args(n, scope);
        const bool r = test(n, v, args);
        return Value::boolean(n.negate ? !r : r);
      }
      case NodeType::kUnary: {
        const Value v = eval(*n.a, scope);
        if (n.name == "not") return Value::boolean(!v.truthy());
        if (!v.is_number() && !v.is_bool())
          fail(n, std::string("bad operand type for unary ") + n.name + ": " + v.kind_name());
        if (n.name == "+") return v;
        if (v.is_float()) return Value::floating(-v.as_float());
        const int64_t i = v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int();
        if (i == std::numeric_limits<int64_t>::min()) fail(n, "integer overflow");
        return Value::integer(-i);
      }
      case NodeType::kBinary:
        return binary(n, scope);
      case NodeType::kCompare: {
        Value left = eval(*n.kids[0], scope);
        for (size_t i = 0; i < n.ops.size(); ++i) {
          Value right = eval(*n.kids[i + 1], scope);
          if (!compare(n, n.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case NodeType::kCond:
        if (eval(*n.b, scope).truthy()) return eval(*n.a, scope);
        return n.c ? eval(*n.c, scope) : Value();
      default:
        fail(n, "internal: not an expression");
    }
  }

  // A filter node: its operand is `n.a` or, when that is null (innermost in a filter block), `input`.
  Value eval_filter_chain(const Node& n, const Value& input, const ScopeP& scope) {
    if (n.type != NodeType::kFilter) return eval(n, scope);
    const Value v = n.a ? eval_filter_chain(*n.a, input, scope) : input;
    CallArgs args = eval_args(n, scope);
    return filter(n, n.name, v, args, scope);
  }

  static bool num(const Value& v) { return v.is_number() || v.is_bool(); }
  static double fnum(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_float(); }
  static int64_t inum(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }
  static bool intlike(const Value& v) { return v.is_int() || v.is_bool(); }

  Value binary(const Node& n, const ScopeP& scope) {
    const std::string& op = n.name;
    if (op == "and") {
      Value l = eval(*n.a, scope);
      return l.truthy() ? eval(*n.b, scope) : l;
    }
    if (op == "or") {
      Value l = eval(*n.a, scope);
      return l.truthy() ? l : eval(*n.b, scope);
    }
    const Value l = eval(*n.a, scope);
    const Value r = eval(*n.b, scope);
    if (op == "~") return make_string(n, str(l) + str(r));
    if (op == "+") {
      if (l.is_string() && r.is_string()) return make_string(n, l.as_string() + r.as_string());
      if (l.is_list() && r.is_list()) {
        List out = l.as_list();
        out.insert(out.end(), r.as_list().begin(), r.as_list().end());
        return make_list(n, std::move(out));
      }
    }
    if (op == "*") {
      const Value* seq = l.is_string() || l.is_list() ? &l : r.is_string() || r.is_list() ? &r : nullptr;
      const Value* cnt = seq == &l ? &r : &l;
      if (seq != nullptr && intlike(*cnt)) {
        const int64_t k = std::max<int64_t>(0, inum(*cnt));
        if (seq->is_string()) {
          const size_t sz = seq->as_string().size();
          if (sz != 0 && static_cast<uint64_t>(k) > opt_.limits.max_string_bytes / sz) {
            fail(n, "a string exceeds " + std::to_string(opt_.limits.max_string_bytes) + " bytes");
          }
          std::string out;
          for (int64_t i = 0; i < k; ++i) out += seq->as_string();
          return Value::string(std::move(out));
        }
        const size_t sz = seq->as_list().size();
        if (sz != 0 && static_cast<uint64_t>(k) > opt_.limits.max_list_items / sz) {
          fail(n, "a list exceeds " + std::to_string(opt_.limits.max_list_items) + " items");
        }
        List out;
        for (int64_t i = 0; i < k; ++i) out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
        return Value::list(std::move(out));
      }
    }
    if (!num(l) || !num(r)) {
      if (op == "%" && l.is_string()) fail(n, "unsupported construct: '%' string formatting");
      fail(n, std::string("unsupported operand types for ") + op + ": " + l.kind_name() + " and " +
                  r.kind_name());
    }
    const bool ints = intlike(l) && intlike(r);
    if (op == "/") {
      if (fnum(r) == 0.0) fail(n, "division by zero");
      return Value::floating(fnum(l) / fnum(r));
    }
    if (ints) {
      const int64_t a = inum(l), b = inum(r);
      int64_t out = 0;
      if (op == "+") {
        if (__builtin_add_overflow(a, b, &out)) fail(n, "integer overflow");
        return Value::integer(out);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(a, b, &out)) fail(n, "integer overflow");
        return Value::integer(out);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(a, b, &out)) fail(n, "integer overflow");
        return Value::integer(out);
      }
      if (op == "//" || op == "%") {
        if (b == 0) fail(n, "integer division or modulo by zero");
        if (a == std::numeric_limits<int64_t>::min() && b == -1) fail(n, "integer overflow");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**") {
        if (b >= 0) {
          int64_t acc = 1;
          for (int64_t i = 0; i < b; ++i) {
            if (__builtin_mul_overflow(acc, a, &acc)) fail(n, "integer overflow");
            if (acc == 0 || acc == 1) break;
          }
          if (acc == 1 && a == -1) acc = (b % 2 == 0) ? 1 : -1;
          return Value::integer(acc);
        }
        return Value::floating(std::pow(static_cast<double>(a), static_cast<double>(b)));
      }
    }
    const double a = fnum(l), b = fnum(r);
    if (op == "+") return Value::floating(a + b);
    if (op == "-") return Value::floating(a - b);
    if (op == "*") return Value::floating(a * b);
    if (op == "**") return Value::floating(std::pow(a, b));
    if (op == "//" || op == "%") {
      if (b == 0.0) fail(n, "float division or modulo by zero");
      double m = std::fmod(a, b);
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      if (op == "%") return Value::floating(m);
      return Value::floating(std::floor(a / b));
    }
    fail(n, "unknown operator '" + op + "'");
  }

  bool equal(const Value& a, const Value& b, int depth = 0) const {
    if (depth > 200) return false;
    if (num(a) && num(b)) {
      if (intlike(a) && intlike(b)) return inum(a) == inum(b);
      return fnum(a) == fnum(b);
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
      case Value::Kind::kUndefined:
      case Value::Kind::kNone:
        return true;
      case Value::Kind::kString:
        return a.as_string() == b.as_string();
      case Value::Kind::kList: {
        const List &x = a.as_list(), &y = b.as_list();
        if (x.size() != y.size()) return false;
        for (size_t i = 0; i < x.size(); ++i) {
          if (!equal(x[i], y[i], depth + 1)) return false;
        }
        return true;
      }
      case Value::Kind::kDict: {
        const Dict &x = a.as_dict(), &y = b.as_dict();
        if (x.size() != y.size()) return false;
        for (const auto& [k, v] : x.items()) {
          const Value* o = y.find(k);
          if (o == nullptr || !equal(v, *o, depth + 1)) return false;
        }
        return true;
      }
      case Value::Kind::kCallable:
        return a.as_function().target_type() == b.as_function().target_type() &&
               &a.as_function() == &b.as_function();
      default:
        return false;
    }
  }

  bool contains(const Node& n, const Value& container, const Value& item) const {
    switch (container.kind()) {
      case Value::Kind::kString:
        if (!item.is_string())
          fail(n, std::string("'in <string>' needs a string on the left, got ") + item.kind_name());
        return container.as_string().find(item.as_string()) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& e : container.as_list()) {
          if (equal(e, item)) return true;
        }
        return false;
      case Value::Kind::kDict:
        return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
      case Value::Kind::kUndefined:
        return false;
      default:
        fail(n, std::string("'in' needs a string, list or dict on the right, got ") + container.kind_name());
    }
  }

  int order(const Node& n, const std::string& op, const Value& a, const Value& b) const {
    if (num(a) && num(b)) {
      if (intlike(a) && intlike(b)) return inum(a) < inum(b) ? -1 : inum(a) > inum(b) ? 1 : 0;
      const double x = fnum(a), y = fnum(b);
      if (std::isnan(x) || std::isnan(y)) return 2;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.as_string().compare(b.as_string());
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    fail(n, "'" + op + "' not supported between " + a.kind_name() + " and " + b.kind_name());
  }

  bool compare(const Node& n, const std::string& op, const Value& a, const Value& b) const {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in") return contains(n, b, a);
    if (op == "not in") return !contains(n, b, a);
    const int c = order(n, op, a, b);
    if (c == 2) return false;
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  static bool index_of(int64_t i, size_t size, size_t& out) {
    const auto s = static_cast<int64_t>(size);
    if (i < 0) i += s;
    if (i < 0 || i >= s) return false;
    out = static_cast<size_t>(i);
    return true;
  }

  Value subscript(const Node& n, const Value& obj, const Value& key) {
    if (obj.is_undefined() && !js()) fail(n, "cannot subscript an undefined value");
    if (obj.is_none() && js()) fail(n, "cannot subscript none");
    if (obj.is_dict()) {
      if (key.is_string()) {
        const Value* v = obj.as_dict().find(key.as_string());
        return v ? *v : Value();
      }
      return Value();
    }
    if ((obj.is_list() || obj.is_string()) && intlike(key)) {
      size_t i;
      if (obj.is_list()) return index_of(inum(key), obj.as_list().size(), i) ? obj.as_list()[i] : Value();
      auto cps = code_points(obj.as_string());
      return index_of(inum(key), cps.size(), i) ? Value::string(cps[i]) : Value();
    }
    if (key.is_string()) return attribute(n, obj, key.as_string());
    return Value();
  }

  Value slice(const Node& n, const Value& obj, const Value& start, const Value& stop, const Value& stepv) {
    for (const Value* v : {&start, &stop, &stepv}) {
      if (!v->is_none() && !v->is_undefined() && !intlike(*v)) fail(n, "slice indices must be integers");
    }
    List items;
    std::vector<std::string> cps;
    size_t size;
    if (obj.is_list()) {
      size = obj.as_list().size();
    } else if (obj.is_string()) {
      cps = code_points(obj.as_string());
      size = cps.size();
    } else {
      fail(n, std::string("cannot slice a value of type ") + obj.kind_name());
    }
    const int64_t len = static_cast<int64_t>(size);
    const int64_t st = intlike(stepv) ? inum(stepv) : 1;
    if (st == 0) fail(n, "slice step cannot be zero");
    auto clamp = [&](const Value& v, int64_t dflt) {
      if (!intlike(v)) return dflt;
      int64_t i = inum(v);
      if (i < 0) i = std::max<int64_t>(i + len, st < 0 ? -1 : 0);
      if (i > len) i = st < 0 ? len - 1 : len;
      if (i >= len && st < 0) i = len - 1;
      return i;
    };
    const int64_t b = clamp(start, st > 0 ? 0 : len - 1);
    const int64_t e = clamp(stop, st > 0 ? len : -1);
    std::vector<size_t> picks;
    if (st > 0) {
      for (int64_t i = b; i < e; i += st) picks.push_back(static_cast<size_t>(i));
    } else {
      for (int64_t i = b; i > e; i += st) picks.push_back(static_cast<size_t>(i));
    }
    if (obj.is_list()) {
      for (size_t i : picks) items.push_back(obj.as_list()[i]);
      return Value::list(std::move(items));
    }
    std::string s;
    for (size_t i : picks) s += cps[i];
    return Value::string(std::move(s));
  }

  Value attribute(const Node& n, const Value& obj, const std::string& name);
  Value filter(const Node& n, const std::string& name, const Value& v, CallArgs& args, const ScopeP& scope);
  bool test(const Node& n, const Value& v, CallArgs& args);
  bool test_named(const Node& n, const std::string& name, const Value& v, const List& args);

  const RenderOptions& opt_;
  const Value& context_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<std::weak_ptr<Scope>> scopes_;
};

// ---- argument helpers for builtins (errors are thrown as strings and located by invoke()) ----

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
                                ? std::string("raise_exception")
                                : a.positional[0].as_string();
          throw TemplateFailure{"raise_exception", std::move(msg)};
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
          return Value::string(strip_chars(s, &chars->as_string(), l, r));
        }
        return Value::string(strip_chars(s, nullptr, l, r));
      });
    }
    if (name == "upper") return method([s](CallArgs&) -> Value { return Value::string(upper(s)); });
    if (name == "lower") return method([s](CallArgs&) -> Value { return Value::string(lower(s)); });
    if (name == "title" || name == "capitalize") {
      const bool title = name == "title";
      return method([s, title](CallArgs&) -> Value {
        std::string out = s;
        bool start = true;
        for (char& c : out) {
          const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
          if (start && alpha) {
            c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
          } else if (alpha || !title) {
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          }
          start = title ? !alpha : false;
        }
        return Value::string(std::move(out));
      });
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
      return method([s, max_items](CallArgs& a) -> Value {
        check_args(a, 2, {"sep", "maxsplit"});
        const Value* sep = arg(a, 0, "sep");
        const Value* ms = arg(a, 1, "maxsplit");
        int64_t maxsplit = ms != nullptr && ms->is_int() ? ms->as_int() : -1;
        List out;
        if (sep == nullptr || sep->is_none()) {
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && is_ws(s[i])) ++i;
            if (i >= s.size()) break;
            if (maxsplit == 0) {
              size_t e = s.size();
              while (e > i && is_ws(s[e - 1])) --e;
              out.push_back(Value::string(s.substr(i, e - i)));
              break;
            }
            size_t e = i;
            while (e < s.size() && !is_ws(s[e])) ++e;
            out.push_back(Value::string(s.substr(i, e - i)));
            if (maxsplit > 0) --maxsplit;
            i = e;
          }
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

bool Renderer::test_named(const Node& n, const std::string& name, const Value& v, const List& args) {
  auto need = [&](size_t k) {
    if (args.size() < k) fail(n, "test '" + name + "' needs " + std::to_string(k) + " argument(s)");
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "lower") return v.is_string() && lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && upper(v.as_string()) == v.as_string();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) fail(n, "test '" + name + "' needs an integer, got " + v.kind_name());
    const bool odd = (v.as_int() % 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "divisibleby") {
    need(1);
    if (!v.is_int() || !args[0].is_int() || args[0].as_int() == 0)
      fail(n, "divisibleby needs non-zero integers");
    if (args[0].as_int() == -1) return true;
    return v.as_int() % args[0].as_int() == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    need(1);
    return equal(v, args[0]);
  }
  if (name == "ne" || name == "!=") {
    need(1);
    return !equal(v, args[0]);
  }
  if (name == "lt" || name == "gt" || name == "le" || name == "ge" || name == "lessthan" ||
      name == "greaterthan") {
    need(1);
    const std::string op = name == "lt" || name == "lessthan"      ? "<"
                           : name == "gt" || name == "greaterthan" ? ">"
                           : name == "le"                          ? "<="
                                                                   : ">=";
    return compare(n, op, v, args[0]);
  }
  if (name == "in") {
    need(1);
    return contains(n, args[0], v);
  }
  fail(n, "unknown test '" + name + "'");
}

bool Renderer::test(const Node& n, const Value& v, CallArgs& args) {
  if (!args.keyword.empty()) fail(n, "test '" + n.name + "' takes no keyword arguments");
  return test_named(n, n.name, v, args.positional);
}

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
      if (chars != nullptr && chars->is_string())
        return Value::string(strip_chars(s, &chars->as_string(), true, true));
      return Value::string(strip_chars(s, nullptr, true, true));
    }
    if (name == "length" || name == "count") {
      if (v.is_string()) return Value::integer(static_cast<int64_t>(code_point_count(v.as_string())));
      if (v.is_list()) return Value::integer(static_cast<int64_t>(v.as_list().size()));
      if (v.is_dict()) return Value::integer(static_cast<int64_t>(v.as_dict().size()));
      if (v.is_undefined()) return Value::integer(0);
      bad(std::string("object of type ") + v.kind_name() + " has no length");
    }
    if (name == "upper") return make_string(n, upper(text_of(n, v, "upper")));
    if (name == "lower") return make_string(n, lower(text_of(n, v, "lower")));
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
          x = Value::string(lower(x.as_string()));
          y = Value::string(lower(y.as_string()));
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
        if (!case_sensitive && k.is_string()) k = Value::string(lower(k.as_string()));
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
      const Value* indent = karg(0, "indent");
      const Value* sort_keys = arg(args, 99, "sort_keys");
      int ind = -1;
      if (indent != nullptr && !indent->is_none()) {
        if (!indent->is_int() || indent->as_int() < 0 || indent->as_int() > 64)
          bad("indent must be an integer 0..64");
        ind = static_cast<int>(indent->as_int());
      }
      Value src = v;
      if (sort_keys != nullptr && sort_keys->truthy()) bad("sort_keys is not supported");
      std::string out, err;
      if (!to_json_text(src, ind, out, err)) bad(err);
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
        const std::string s = strip_chars(v.as_string(), nullptr, true, true);
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
        const std::string s = strip_chars(v.as_string(), nullptr, true, true);
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

}  // namespace

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
  if (!root_) return make_error("template_error", "render of an empty (unparsed) template");
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
