// The evaluator's tests: `value is [not] name(args)` (defined, none, string, mapping, divisibleby ...).
#include "core/chat/eval_internal.h"

namespace car::chat::eval_internal {

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
  if (name == "lower") return v.is_string() && to_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && to_upper(v.as_string()) == v.as_string();
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

}  // namespace car::chat::eval_internal
