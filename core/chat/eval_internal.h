// Internal to core/chat: the evaluator's Renderer, shared by the eval*.cpp files that implement it by
// concept (eval.cpp: render entry points, printing, scopes and string helpers; eval_statements.cpp;
// eval_expressions.cpp: operators, comparison, indexing; eval_builtins.cpp: globals and methods;
// eval_tests.cpp: `is` tests; eval_filters.cpp: `|` filters). Not part of the module's interface.
#pragma once

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/chat/ast.h"
#include "core/chat/jinja.h"
#include "core/chat/stack_limit.h"
#include "core/chat/unicode_text.h"
#include "core/util/error_codes.h"

namespace car::chat::eval_internal {

enum class Flow { kNormal, kBreak, kContinue };

struct Scope {
  std::shared_ptr<Scope> parent;
  Dict vars;
};
using ScopeP = std::shared_ptr<Scope>;

inline std::string where(const Node& n) {
  return "line " + std::to_string(n.line) + ":" + std::to_string(n.col);
}

[[noreturn]] inline void fail(const Node& n, const std::string& msg) {
  throw TemplateFailure{errc::kTemplateError, where(n) + ": " + msg};
}

// ---- UTF-8 and string helpers (eval.cpp; string length, indexing and slicing count code points) ----

std::vector<std::string> code_points(const std::string& s);
size_t code_point_count(const std::string& s);
std::string python_repr_string(const std::string& s);

class Renderer;

struct Macro {
  const Node* node;
  ScopeP closure;
};

class Renderer {
 public:
  Renderer(const RenderOptions& o, const Value& context)
      : opt_(o),
        context_(context),
        deadline_(std::chrono::steady_clock::now() + o.limits.max_duration),
        stack_(o.limits.max_stack_bytes) {}

  std::string run(const Node& root) {
    std::string out;
    out_ = &out;
    auto top = new_scope(nullptr);
    exec(root, top);
    return out;
  }

  // The stack check on its own, where the recursion does not pass through step() (a filter chain).
  void check_stack(const Node& n) const {
    if (stack_.exceeded()) {
      fail(n, "the template nests too deeply for the stack (" + std::to_string(opt_.limits.max_stack_bytes) +
                  " bytes at most)");
    }
  }

  // Every scope the render makes, so that release() can break cycles through them (a macro's closure).
  ScopeP new_scope(const ScopeP& parent);

  // Empties every scope, list and dict the render made and that is still alive (only a reference cycle
  // keeps one alive after the render), so all of them are freed.
  void release(detail::Arena& arena);

 private:
  bool js() const { return opt_.js_strip_quirk; }

  // Every statement and expression evaluated passes here: the step limit, the stack check (each level of
  // the evaluator's recursion evaluates a node) and, every 1024 steps, cancellation and the deadline.
  void step(const Node& n) {
    if (++steps_ > opt_.limits.max_steps) {
      fail(n, "the template ran more than " + std::to_string(opt_.limits.max_steps) + " steps");
    }
    check_stack(n);
    if ((steps_ & 1023u) == 0) poll(n);
  }
  void poll(const Node& n) const {
    if (opt_.cancelled != nullptr && opt_.cancelled->load(std::memory_order_relaxed)) {
      throw TemplateFailure{errc::kCancelled, "the render was cancelled"};
    }
    if (std::chrono::steady_clock::now() > deadline_) {
      fail(n, "the template ran longer than " + std::to_string(opt_.limits.max_duration.count()) + " ms");
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

  std::string str(const Value& v) const;
  std::string repr(const Value& v, int depth) const;

  // A string argument of a filter or method. Python Jinja2 converts anything to its text (None -> "None");
  // @huggingface/jinja raises for a non-string.
  std::string text_of(const Node& n, const Value& v, const char* what) const;

  // ---- scopes ----

  Value lookup(const ScopeP& scope, const std::string& name) const;
  Value global(const std::string& name) const;

  // ---- statements ----

  Flow exec(const Node& n, const ScopeP& scope);
  std::string capture(const Node& body, const ScopeP& scope);
  List iterate(const Node& n, const Value& v) const;
  void bind(const Node& n, Scope& s, const std::vector<std::string>& names, const Value& v) const;
  void exec_for(const Node& n, const ScopeP& scope);
  void exec_set(const Node& n, const ScopeP& scope);
  Value make_macro(const Node& n, const ScopeP& scope, const std::string& name);
  Value call_macro(const Macro& m, CallArgs& args);

  // ---- expressions ----

  CallArgs eval_args(const Node& n, const ScopeP& scope);
  Value invoke(const Node& n, const Value& callee, CallArgs& args);
  Value eval(const Node& n, const ScopeP& scope);

  // A filter node: its operand is `n.a` or, when that is null (innermost in a filter block), `input`.
  Value eval_filter_chain(const Node& n, const Value& input, const ScopeP& scope);

  static bool num(const Value& v) { return v.is_number() || v.is_bool(); }
  static double fnum(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_float(); }
  static int64_t inum(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }
  static bool intlike(const Value& v) { return v.is_int() || v.is_bool(); }

  Value binary(const Node& n, const ScopeP& scope);
  bool equal(const Value& a, const Value& b, int depth = 0) const;
  bool contains(const Node& n, const Value& container, const Value& item) const;
  int order(const Node& n, const std::string& op, const Value& a, const Value& b) const;
  bool compare(const Node& n, const std::string& op, const Value& a, const Value& b) const;
  static bool index_of(int64_t i, size_t size, size_t& out);
  Value subscript(const Node& n, const Value& obj, const Value& key);
  Value slice(const Node& n, const Value& obj, const Value& start, const Value& stop, const Value& stepv);
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
  std::chrono::steady_clock::time_point deadline_;
  StackLimit stack_;
};

// ---- argument helpers for builtins (eval_builtins.cpp; errors are thrown as strings and located by
// invoke()) ----

const Value* arg(const CallArgs& a, size_t pos, const char* name);
void check_args(const CallArgs& a, size_t max_pos, std::initializer_list<const char*> names);
std::string string_arg(const CallArgs& a, size_t pos, const char* name);

}  // namespace car::chat::eval_internal
