#include "k3pack/error.h"

#include <cstring>

namespace k3pack {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kValue: return "ValueError";
    case ErrorKind::kKey: return "KeyError";
    case ErrorKind::kFileNotFound: return "FileNotFoundError";
    case ErrorKind::kFileExists: return "FileExistsError";
    case ErrorKind::kOS: return "OSError";
    case ErrorKind::kEOF: return "EOFError";
    case ErrorKind::kRuntime: return "RuntimeError";
    case ErrorKind::kMemory: return "MemoryError";
  }
  return "Error";
}

namespace {
constexpr const char kHintLabel[] = "\nhint: ";
}  // namespace

const Error& ErrorOfOk() {
  static const Error ok("OK", ErrorKind::kRuntime);
  return ok;
}

Error Error::FromErrno(std::string what, int err) {
  ErrorKind kind = ErrorKind::kOS;
  if (err == ENOENT) kind = ErrorKind::kFileNotFound;
  if (err == EEXIST) kind = ErrorKind::kFileExists;
  return Error(what + ": " + std::strerror(err), kind, err);
}

Error Error::WithHint(const std::string& hint) const {
  return Error(message_ + kHintLabel + hint, kind_, errno_);
}

std::string Error::headline() const { return message_.substr(0, message_.find('\n')); }

std::string Error::hint() const {
  const size_t at = message_.find(kHintLabel);
  return at == std::string::npos ? std::string() : message_.substr(at + sizeof(kHintLabel) - 1);
}

Error Error::WithContext(const std::string& context) const {
  return Error(context + ": " + message_, kind_, errno_);
}

}  // namespace k3pack
