// The evaluator's statements: output, if, for (with `loop` and Jinja2's loop scope), set and namespaces,
// macros and call blocks, filter blocks, break/continue.
#include "core/chat/eval_internal.h"

namespace car::chat::eval_internal {

Flow Renderer::exec(const Node& n, const ScopeP& scope) {
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

std::string Renderer::capture(const Node& body, const ScopeP& scope) {
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

List Renderer::iterate(const Node& n, const Value& v) const {
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

void Renderer::bind(const Node& n, Scope& s, const std::vector<std::string>& names, const Value& v) const {
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
    fail(n, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(names.size()) +
                " names");
  }
  for (size_t i = 0; i < names.size(); ++i) s.vars.set(names[i], parts[i]);
}

void Renderer::exec_for(const Node& n, const ScopeP& scope) {
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

void Renderer::exec_set(const Node& n, const ScopeP& scope) {
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

Value Renderer::make_macro(const Node& n, const ScopeP& scope, const std::string& name) {
  Macro m{&n, scope};
  return Value::callable([this, m](CallArgs& args) -> Value { return call_macro(m, args); }, name);
}

Value Renderer::call_macro(const Macro& m, CallArgs& args) {
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

}  // namespace car::chat::eval_internal
