// Reading manifest JSON fields as SGLang's Python does: a missing key is the
// bare KeyError text `'key'` (ErrorKind::kKey), a value of the wrong kind
// names the key and the value. Shared by the store's checks and the
// manifest-only loader rules.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "util/pyint.h"

namespace k3pack::manifest::fields {

inline Error KeyErr(const std::string& key) { return Error("'" + key + "'", ErrorKind::kKey); }

inline Result<const nlohmann::json*> At(const nlohmann::json& j, const std::string& key) {
  if (!j.is_object()) return Error("manifest value holding '" + key + "' is not an object");
  auto it = j.find(key);
  if (it == j.end()) return KeyErr(key);
  return &*it;
}

inline Result<uint64_t> U64(const nlohmann::json& j, const std::string& key) {
  K3_ASSIGN_OR_RETURN(const nlohmann::json* v, At(j, key));
  if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
    return Error("manifest key '" + key + "' must be a non-negative integer, got " + v->dump());
  return v->get<uint64_t>();
}

inline Result<std::string> Str(const nlohmann::json& j, const std::string& key) {
  K3_ASSIGN_OR_RETURN(const nlohmann::json* v, At(j, key));
  if (!v->is_string()) return Error("manifest key '" + key + "' must be a string, got " + v->dump());
  return v->get<std::string>();
}

// Python int() on a JSON value: util/pyint.h.
using k3pack::PyInt;

// int(obj[key]): a bare KeyError when missing, then PyInt.
inline Result<int64_t> IntAt(const nlohmann::json& j, const std::string& key) {
  K3_ASSIGN_OR_RETURN(const nlohmann::json* v, At(j, key));
  return PyInt(*v);
}

// Python truthiness of a dict.get() result.
inline bool Truthy(const nlohmann::json& j, const std::string& key) {
  if (!j.is_object() || !j.contains(key)) return false;
  const nlohmann::json& v = j[key];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  // json::empty() is false for every string; Python's "" is falsy.
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;
}

}  // namespace k3pack::manifest::fields
