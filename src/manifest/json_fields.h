// Reading manifest JSON fields as SGLang's Python does: a missing key is the
// bare KeyError text `'key'` (ErrorKind::kKey), a value of the wrong kind
// names the key and the value. Shared by the store's checks and the
// manifest-only loader rules.
#pragma once

#include <cstdint>
#include <initializer_list>
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

// The value at a key path (e.g. {"k3pack", "ep"}), or nullptr where a key is
// missing or a value on the way is no object: for readers that report or
// tolerate an absent record themselves.
inline const nlohmann::json* Find(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* cur = &j;
  for (const char* k : path) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
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

// Python truthiness of a JSON value: null, false, 0, 0.0, "", [] and {} are
// false, everything else true.
inline bool PyTruthy(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return false;
    case nlohmann::json::value_t::boolean: return v.get<bool>();
    case nlohmann::json::value_t::number_integer: return v.get<int64_t>() != 0;
    case nlohmann::json::value_t::number_unsigned: return v.get<uint64_t>() != 0;
    case nlohmann::json::value_t::number_float: return v.get<double>() != 0.0;
    case nlohmann::json::value_t::string: return !v.get_ref<const std::string&>().empty();
    case nlohmann::json::value_t::array:
    case nlohmann::json::value_t::object: return !v.empty();
    default: return true;
  }
}

// Python int() on a JSON value: util/pyint.h.
using k3pack::PyInt;

// int(obj[key]): a bare KeyError when missing, then PyInt.
inline Result<int64_t> IntAt(const nlohmann::json& j, const std::string& key) {
  K3_ASSIGN_OR_RETURN(const nlohmann::json* v, At(j, key));
  return PyInt(*v);
}

// Python truthiness of a dict.get() result (a missing key is None).
inline bool Truthy(const nlohmann::json& j, const std::string& key) {
  return j.is_object() && j.contains(key) && PyTruthy(j[key]);
}

}  // namespace k3pack::manifest::fields
