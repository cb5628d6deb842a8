// The evaluator's expressions: names, literals, calls, Python's operator semantics (arithmetic, `~`,
// `in`, chained comparisons, equality), indexing and slicing (code points for strings).
#include "core/chat/eval_internal.h"

namespace car::chat::eval_internal {

CallArgs Renderer::eval_args(const Node& n, const ScopeP& scope) {
  CallArgs a;
  for (const NodeP& k : n.kids) a.positional.push_back(eval(*k, scope));
  for (const auto& [key, k] : n.kwargs) a.keyword.emplace_back(key, eval(*k, scope));
  return a;
}

Value Renderer::invoke(const Node& n, const Value& callee, CallArgs& args) {
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

Value Renderer::eval(const Node& n, const ScopeP& scope) {
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
        if (!k.is_string()) fail(*n.kids[i], std::string("dict keys must be strings, got ") + k.kind_name());
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

Value Renderer::eval_filter_chain(const Node& n, const Value& input, const ScopeP& scope) {
  if (n.type != NodeType::kFilter) return eval(n, scope);
  check_stack(n);
  const Value v = n.a ? eval_filter_chain(*n.a, input, scope) : input;
  CallArgs args = eval_args(n, scope);
  return filter(n, n.name, v, args, scope);
}

Value Renderer::binary(const Node& n, const ScopeP& scope) {
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
    fail(n,
         std::string("unsupported operand types for ") + op + ": " + l.kind_name() + " and " + r.kind_name());
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

bool Renderer::equal(const Value& a, const Value& b, int depth) const {
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

bool Renderer::contains(const Node& n, const Value& container, const Value& item) const {
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

int Renderer::order(const Node& n, const std::string& op, const Value& a, const Value& b) const {
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

bool Renderer::compare(const Node& n, const std::string& op, const Value& a, const Value& b) const {
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

bool Renderer::index_of(int64_t i, size_t size, size_t& out) {
  const auto s = static_cast<int64_t>(size);
  if (i < 0) i += s;
  if (i < 0 || i >= s) return false;
  out = static_cast<size_t>(i);
  return true;
}

Value Renderer::subscript(const Node& n, const Value& obj, const Value& key) {
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

Value Renderer::slice(const Node& n, const Value& obj, const Value& start, const Value& stop,
                      const Value& stepv) {
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

}  // namespace car::chat::eval_internal
