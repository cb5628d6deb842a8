// The value type the chat-template interpreter computes with: undefined, none, bool, int, float, string,
// list, dict (insertion-ordered, string keys) and callable. Lists and dicts are shared by reference, as in
// Jinja (a namespace or a list changed through one name is changed for every name).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace car::chat {

class Value;

using List = std::vector<Value>;

class Dict;

namespace detail {
/// While a render runs, every list and dict it creates is recorded here, so that the render can break the
/// reference cycles a template may build (`l.append(l)`, a macro stored in its own scope) when it ends.
struct Arena {
  std::vector<std::weak_ptr<std::vector<Value>>> lists;
  std::vector<std::weak_ptr<Dict>> dicts;
};
extern thread_local Arena* current_arena;
void arena_note(const std::shared_ptr<std::vector<Value>>& l);
void arena_note(const std::shared_ptr<Dict>& d);
}  // namespace detail

/// Arguments of a call: positional then keyword, in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  /// Frees a list or dict it held last without recursing: its items are freed one at a time from a
  /// worklist, so a value nested 100,000 deep (a template can build one in a loop) does not exhaust the
  /// stack on its way out.
  ~Value() {
    if ((list_ && list_.use_count() == 1) || (dict_ && dict_.use_count() == 1)) free_containers();
  }
  static Value none() { return Value(Kind::kNone); }
  static Value boolean(bool b) {
    Value v(Kind::kBool);
    v.b_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Kind::kInt);
    v.i_ = i;
    return v;
  }
  static Value floating(double f) {
    Value v(Kind::kFloat);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s) {
    Value v(Kind::kString);
    v.s_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value list(List items = {}) {
    Value v(Kind::kList);
    v.list_ = std::make_shared<List>(std::move(items));
    if (detail::current_arena != nullptr) detail::arena_note(v.list_);
    return v;
  }
  static Value dict(std::shared_ptr<Dict> d = nullptr);  ///< a new empty dict when d is null
  static Value callable(Function f, std::string name) {
    Value v(Kind::kCallable);
    v.fn_ = std::make_shared<Function>(std::move(f));
    v.s_ = std::make_shared<const std::string>(std::move(name));
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& as_string() const { return *s_; }
  List& as_list() const { return *list_; }
  Dict& as_dict() const { return *dict_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const std::shared_ptr<List>& list_ptr() const { return list_; }
  Function& as_function() const { return *fn_; }
  const std::string& callable_name() const { return *s_; }

  /// Jinja truthiness: undefined, none, false, 0, 0.0, "" and empty containers are false.
  bool truthy() const;

  /// The kind's name as error messages give it ("string", "list", ...).
  const char* kind_name() const;

  /// From JSON (objects keep key order; null is none; integers stay int unless out of int64 range).
  /// Throws std::invalid_argument when `j` nests deeper than kMaxJsonDepth (the conversion recurses; check
  /// with json_depth() first to report it).
  static Value from_json(const nlohmann::ordered_json& j);

 private:
  explicit Value(Kind k) : kind_(k) {}
  void free_containers() noexcept;
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

/// An insertion-ordered map from string keys to values (JSON objects keep their key order when rendered).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value v);
  size_t size() const { return items_.size(); }
  void clear() { items_.clear(); }
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

  bool is_namespace = false;  ///< made by namespace(): its attributes may be assigned with `set ns.x = ...`

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

inline Value Value::dict(std::shared_ptr<Dict> d) {
  Value v(Kind::kDict);
  v.dict_ = d ? std::move(d) : std::make_shared<Dict>();
  if (detail::current_arena != nullptr) detail::arena_note(v.dict_);
  return v;
}

/// How deep a JSON document converted to template values may nest (arrays and objects, the outermost
/// counting 1). Real conversations and tool schemas stay within a few tens.
constexpr int kMaxJsonDepth = 128;

/// The nesting depth of `j` (a scalar: 0, `[]`: 1, `[[1]]`: 2), computed without recursion and stopping
/// once it passes `limit`.
int json_depth(const nlohmann::ordered_json& j, int limit = kMaxJsonDepth);

/// A float as the interpreter prints it: the shortest text that reads back to the same double, with ".0"
/// added to whole numbers (Python's repr: 2.0, 0.30000000000000004, 1e+20, inf, nan).
std::string format_float(double f);

/// How `tojson` writes JSON: the keyword arguments of transformers' tojson (Python's json.dumps).
struct JsonFormat {
  std::optional<std::string> indent;  ///< each level's indentation; none = all on one line
  std::string item_separator = ", ";  ///< Python's defaults: ", " on one line, "," with indent
  std::string key_separator = ": ";
  bool sort_keys = false;             ///< objects' keys in code point order (or collated, below)
  bool collate_keys = false;          ///< sort_keys by the root collation (the reference renderer's order)
  bool ensure_ascii = false;          ///< U+007F and every non-ASCII character as \uXXXX (UTF-16 pairs past the BMP)
};

/// JSON text of `v` as transformers' `tojson` writes it (Python json.dumps, ensure_ascii off): separators
/// ", " and ": " without indent, "," and ": " with it; `indent` < 0 means none. Returns false (with a
/// message) when `v` holds something JSON cannot represent (undefined, a callable) or nests too deep.
bool to_json_text(const Value& v, int indent, std::string& out, std::string& error);
bool to_json_text(const Value& v, const JsonFormat& format, std::string& out, std::string& error);

}  // namespace car::chat
