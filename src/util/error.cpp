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

Error Error::FromErrno(std::string what, int err) {
  ErrorKind kind = ErrorKind::kOS;
  if (err == ENOENT) kind = ErrorKind::kFileNotFound;
  if (err == EEXIST) kind = ErrorKind::kFileExists;
  return Error(what + ": " + std::strerror(err), kind, err);
}

Error Error::WithHint(const std::string& hint) const {
  return Error(message_ + "\nhint: " + hint, kind_, errno_);
}

Error Error::WithContext(const std::string& context) const {
  return Error(context + ": " + message_, kind_, errno_);
}

}  // namespace k3pack
