// k3pack's single error type and the Status / Result<T> returns built on it.
//
// Every fallible call returns Status or Result<T>. An Error carries the
// human-readable message (which, where SGLang defines a text for the same
// condition, is that text verbatim), the errno when an OS call failed, and a
// kind that maps onto the Python exception SGLang raises for the condition, so
// the Python bindings can raise the same exception type.
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace k3pack {

// Mirrors the Python exception classes SGLang uses for each condition.
enum class ErrorKind {
  kValue,         // ValueError: bad input data or arguments
  kKey,           // KeyError: unknown name / missing key
  kFileNotFound,  // FileNotFoundError
  kFileExists,    // FileExistsError
  kOS,            // OSError: an OS call failed (errno set)
  kEOF,           // EOFError: short read
  kRuntime,       // RuntimeError: broken invariant at run time
  kMemory,        // MemoryError: a budget cannot hold what is required
};

const char* ErrorKindName(ErrorKind kind);  // "ValueError", "KeyError", ...

class Error {
 public:
  explicit Error(std::string message, ErrorKind kind = ErrorKind::kValue, int sys_errno = 0)
      : message_(std::move(message)), kind_(kind), errno_(sys_errno) {}

  // An OS failure: message + ": " + strerror(err). A process limit that
  // `err` may stand for (EMFILE, ENFILE, EFBIG under `ulimit -f`, ENOMEM under
  // `ulimit -v`) is named in a hint with its value.
  static Error FromErrno(std::string what, int err);

  const std::string& message() const { return message_; }
  ErrorKind kind() const { return kind_; }
  int sys_errno() const { return errno_; }

  // Adds a second line (a hint on how to fix the problem) without changing
  // the first line, which may be SGLang's verbatim text.
  Error WithHint(const std::string& hint) const;
  // The first line of the message (SGLang's text where it gives one).
  std::string headline() const;
  // What WithHint added, one hint per line, without their labels ("" when
  // none).
  std::string hint() const;
  // Prefixes context ("file.gguf: ") to the message.
  Error WithContext(const std::string& context) const;

 private:
  std::string message_;
  ErrorKind kind_;
  int errno_;
};

// What error() gives on an OK Status or Result (message "OK", kind
// kRuntime), so a caller that asks without checking ok() reads a defined
// value instead of an empty optional (undefined behaviour).
const Error& ErrorOfOk();

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT: implicit by design
  static Status OK() { return Status(); }

  bool ok() const { return !error_.has_value(); }
  // The error; ErrorOfOk() when ok().
  const Error& error() const { return error_ ? *error_ : ErrorOfOk(); }
  std::string message() const { return ok() ? std::string("OK") : error_->message(); }

 private:
  std::optional<Error> error_;
};

// A value or an error. value() / * / -> of an error throw
// std::bad_variant_access (the only exception k3pack's API lets out, and only
// to a caller that did not check ok()).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT
  Result(Error error) : v_(std::move(error)) {}      // NOLINT
  // From a failed Status. An OK Status has no value to give: the Result
  // holds an error saying so (a bug in the caller), never an empty one.
  Result(Status status)  // NOLINT
      : v_(status.ok() ? Error("Result made from an OK Status: no value and no error", ErrorKind::kRuntime)
                       : status.error()) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; ErrorOfOk() when ok().
  const Error& error() const {
    const Error* e = std::get_if<Error>(&v_);
    return e ? *e : ErrorOfOk();
  }
  Status status() const { return ok() ? Status::OK() : Status(error()); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace k3pack

#define K3_CONCAT_INNER(a, b) a##b
#define K3_CONCAT(a, b) K3_CONCAT_INNER(a, b)

// Returns the Status/Error from the enclosing function if `expr` failed.
#define K3_RETURN_IF_ERROR(expr)                         \
  do {                                                   \
    auto&& k3_status_ = (expr);                          \
    if (!k3_status_.ok()) return k3_status_.error();     \
  } while (0)

// `K3_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define K3_ASSIGN_OR_RETURN(lhs, expr) \
  K3_ASSIGN_OR_RETURN_IMPL(K3_CONCAT(k3_result_, __LINE__), lhs, expr)
#define K3_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.error();             \
  lhs = std::move(tmp).value()
