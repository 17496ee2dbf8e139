// Python's int() and str() on values json.load returns, for reproducing
// SGLang's reads of manifest and config values (int(model["num_experts"]),
// str(text_config["hidden_act"])) and their error texts.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "util/pyrepr.h"

namespace k3pack {

// Python int(v) on a value json.load returned, as SGLang's store applies it
// to manifest counts: bools are 0/1, floats truncate toward zero, strings are
// parsed (surrounding whitespace, a sign, digits with single underscores);
// anything else fails with Python's text (ValueError's; Python raises
// TypeError / OverflowError for some, which k3pack reports as kValue).
inline Result<int64_t> PyInt(const nlohmann::json& v) {
  if (v.is_boolean()) return static_cast<int64_t>(v.get<bool>());
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return Error("integer " + v.dump() + " is out of range");
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isnan(d)) return Error("cannot convert float NaN to integer");
    if (std::isinf(d)) return Error("cannot convert float infinity to integer");
    if (std::fabs(d) >= 9.2e18) return Error("integer " + v.dump() + " is out of range");
    return static_cast<int64_t>(std::trunc(d));
  }
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const char* ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws), e = s.find_last_not_of(ws);
    std::string t = b == std::string::npos ? "" : s.substr(b, e - b + 1);
    bool neg = false;
    size_t i = 0;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
    bool ok = i < t.size(), prev_digit = false;
    unsigned __int128 acc = 0;
    for (; ok && i < t.size(); ++i) {
      if (t[i] >= '0' && t[i] <= '9') {
        acc = acc * 10 + static_cast<unsigned>(t[i] - '0');
        if (acc > static_cast<unsigned __int128>(INT64_MAX) + 1) return Error("integer " + s + " is out of range");
        prev_digit = true;
      } else if (t[i] == '_' && prev_digit && i + 1 < t.size()) {
        prev_digit = false;
      } else {
        ok = false;
      }
    }
    if (!ok || !prev_digit) {
      return Error("invalid literal for int() with base 10: " + PyRepr(s));
    }
    if (!neg && acc > static_cast<unsigned __int128>(INT64_MAX)) return Error("integer " + s + " is out of range");
    return neg ? static_cast<int64_t>(-static_cast<__int128>(acc)) : static_cast<int64_t>(acc);
  }
  const char* type = v.is_null() ? "NoneType" : v.is_array() ? "list" : "dict";
  return Error(std::string("int() argument must be a string, a bytes-like object or a real number, not '") + type + "'");
}

// Python str(v) for the scalar kinds (None, True/False, integers, strings);
// other kinds fall back to their JSON text.
inline std::string PyStr(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  return v.dump();
}

}  // namespace k3pack
