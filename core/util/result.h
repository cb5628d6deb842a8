// Result<T>: a value or an Error, for every public boundary that handles untrusted input.
//
// Modules return Result instead of throwing across their public API (STYLE.md: exceptions do not cross a
// module's boundary). An Error carries a stable snake_case `code` that tests and the wire protocol match on
// (e.g. "gguf_truncated", "not_found"), and a `message` written for a person, naming the field and numbers.
// Broken internal invariants are not Errors: they abort (assert / CAR_CHECK).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace car {

struct Error {
  std::string code;     ///< stable, snake_case, machine-matched
  std::string message;  ///< for a person: what, where, which numbers
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}       // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

/// Result<void>: success or an Error.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return err_; }

 private:
  Error err_;
  bool ok_ = true;
};

inline Error make_error(std::string code, std::string message) {
  return Error{std::move(code), std::move(message)};
}

}  // namespace car

/// Evaluate a Result-returning `expr`; on error return its Error from the enclosing function, else assign
/// the value to `lhs`.
#define CAR_TRY_ASSIGN(lhs, expr)                    \
  do {                                               \
    auto car_try_r_ = (expr);                        \
    if (!car_try_r_.ok()) return car_try_r_.error(); \
    lhs = *car_try_r_;                               \
  } while (0)

/// Abort with a message when an internal invariant is broken (never for untrusted input).
#define CAR_CHECK(cond)                                                                       \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);       \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
