// Python json.dumps reproduction (see pyjson.h for the rules followed).
#include "manifest/pyjson.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "util/pyrepr.h"
#include "util/sha256.h"

namespace k3pack::manifest {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void AppendU16Escape(std::string& out, uint32_t u) {
  char buf[6] = {'\\', 'u', kHex[(u >> 12) & 15], kHex[(u >> 8) & 15], kHex[(u >> 4) & 15], kHex[u & 15]};
  out.append(buf, 6);
}

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i.
// Invalid input (bad lead, truncated, overlong, > U+10FFFF, surrogate) yields
// U+FFFD and consumes one byte, like a strict decoder with replacement.
uint32_t DecodeUtf8(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int len = 0;
  uint32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
  else { ++i; return 0xFFFD; }
  if (i + len > s.size()) { ++i; return 0xFFFD; }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) { ++i; return 0xFFFD; }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { ++i; return 0xFFFD; }
  i += len;
  return cp;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The escapes both modes share: `"`, `\` and C0 controls.
bool AppendAsciiEscape(std::string& out, unsigned char c) {
  switch (c) {
    case '"': out += "\\\""; return true;
    case '\\': out += "\\\\"; return true;
    case '\b': out += "\\b"; return true;
    case '\f': out += "\\f"; return true;
    case '\n': out += "\\n"; return true;
    case '\r': out += "\\r"; return true;
    case '\t': out += "\\t"; return true;
    default:
      if (c < 0x20) {
        AppendU16Escape(out, c);
        return true;
      }
      return false;
  }
}

void AppendInt(std::string& out, const nlohmann::json& v) {
  char buf[32];
  std::to_chars_result r;
  if (v.is_number_unsigned()) {
    r = std::to_chars(buf, buf + sizeof buf, v.get<uint64_t>());
  } else {
    r = std::to_chars(buf, buf + sizeof buf, v.get<int64_t>());
  }
  out.append(buf, r.ptr);
}

void AppendNewline(std::string& out, int indent, int level) {
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void Dump(std::string& out, const nlohmann::json& v, const PyJsonOptions& o, int level) {
  using T = nlohmann::json::value_t;
  switch (v.type()) {
    case T::null: out += "null"; return;
    case T::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case T::number_integer:
    case T::number_unsigned: AppendInt(out, v); return;
    case T::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += PyFloatRepr(d);
      return;
    }
    case T::string: PyJsonAppendString(out, v.get_ref<const std::string&>(), o.ensure_ascii); return;
    case T::array: {
      if (v.empty()) { out += "[]"; return; }
      out.push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += o.item_separator;
        first = false;
        if (o.indent >= 0) AppendNewline(out, o.indent, level + 1);
        Dump(out, item, o, level + 1);
      }
      if (o.indent >= 0) AppendNewline(out, o.indent, level);
      out.push_back(']');
      return;
    }
    case T::object: {
      if (v.empty()) { out += "{}"; return; }
      out.push_back('{');
      bool first = true;
      // nlohmann::json's object is a std::map<std::string, ...>: iteration is
      // ordered by char_traits<char>::lt, i.e. unsigned byte order, which for
      // UTF-8 is code point order, Python's str order. (Tested.)
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += o.item_separator;
        first = false;
        if (o.indent >= 0) AppendNewline(out, o.indent, level + 1);
        PyJsonAppendString(out, it.key(), o.ensure_ascii);
        out += o.key_separator;
        Dump(out, it.value(), o, level + 1);
      }
      if (o.indent >= 0) AppendNewline(out, o.indent, level);
      out.push_back('}');
      return;
    }
    case T::binary:
    case T::discarded:
      out += "null";
      return;
  }
}

}  // namespace

PyJsonOptions PyJsonOptionsFor(PyJsonStyle style) {
  PyJsonOptions o;
  switch (style) {
    case PyJsonStyle::kIndent2: o = {2, false, ",", ": "}; break;
    case PyJsonStyle::kCanonical: o = {-1, false, ",", ":"}; break;
    case PyJsonStyle::kIndent2Ascii: o = {2, true, ",", ": "}; break;
    case PyJsonStyle::kCanonicalAscii: o = {-1, true, ",", ":"}; break;
    case PyJsonStyle::kDefaultAscii: o = {-1, true, ", ", ": "}; break;
  }
  return o;
}

void PyJsonAppendString(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    // Copy the longest run needing no attention in one go.
    size_t j = i;
    while (j < s.size()) {
      const auto c = static_cast<unsigned char>(s[j]);
      if (c < 0x20 || c == '"' || c == '\\' || c >= 0x7F) break;
      ++j;
    }
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      if (AppendAsciiEscape(out, c)) continue;
      // Only DEL reaches here: raw unless ensure_ascii (Python's ESCAPE_ASCII
      // escapes everything outside ' '..'~').
      if (ensure_ascii) AppendU16Escape(out, c);
      else out.push_back(static_cast<char>(c));
      continue;
    }
    const uint32_t cp = DecodeUtf8(s, i);
    if (!ensure_ascii) {
      AppendUtf8(out, cp);
    } else if (cp < 0x10000) {
      AppendU16Escape(out, cp);
    } else {
      const uint32_t v = cp - 0x10000;
      AppendU16Escape(out, 0xD800 | (v >> 10));
      AppendU16Escape(out, 0xDC00 | (v & 0x3FF));
    }
  }
  out.push_back('"');
}

std::string PyJsonDumps(const nlohmann::json& value, const PyJsonOptions& options) {
  std::string out;
  Dump(out, value, options, 0);
  return out;
}

std::string PyJsonDumps(const nlohmann::json& value, PyJsonStyle style) {
  return PyJsonDumps(value, PyJsonOptionsFor(style));
}

std::string CanonicalSha256(const nlohmann::json& value) {
  return Sha256Hex(PyJsonDumps(value, PyJsonStyle::kCanonical));
}

// CPython's float_repr_style "short": shortest round-trip digits, then
// exponent notation when the decimal point position is <= -4 or > 16.
std::string PyFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  std::string out;
  if (!sci.empty() && sci[0] == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) {
    if (c != '.') digits.push_back(c);
  }
  int exp10 = 0;
  std::string_view es = sci.substr(epos + 1);
  if (!es.empty() && es[0] == '+') es.remove_prefix(1);
  std::from_chars(es.data(), es.data() + es.size(), exp10);
  const int decpt = exp10 + 1;  // digits d1d2... represent 0.d1d2... * 10^decpt
  const int nd = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out += eb;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt < nd) {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  } else {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  }
  return out;
}

std::string PyReprJson(const nlohmann::json& v) {
  using T = nlohmann::json::value_t;
  switch (v.type()) {
    case T::null: return "None";
    case T::boolean: return v.get<bool>() ? "True" : "False";
    case T::number_integer:
    case T::number_unsigned: {
      std::string s;
      AppendInt(s, v);
      return s;
    }
    case T::number_float: return PyFloatRepr(v.get<double>());
    case T::string: return PyRepr(v.get_ref<const std::string&>());
    case T::array: {
      std::string s = "[";
      bool first = true;
      for (const auto& item : v) {
        if (!first) s += ", ";
        first = false;
        s += PyReprJson(item);
      }
      return s + "]";
    }
    case T::object: {
      std::string s = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) s += ", ";
        first = false;
        s += PyRepr(it.key()) + ": " + PyReprJson(it.value());
      }
      return s + "}";
    }
    default: return "None";
  }
}

namespace {

bool IsPyNumber(const nlohmann::json& v) { return v.is_number() || v.is_boolean(); }

// Integers (bool included) exactly; a float against an integer by exact
// value, as Python compares int and float (long double holds every 64-bit
// integer exactly on the x86-64 ABI this builds for).
bool PyNumberEqual(const nlohmann::json& a, const nlohmann::json& b) {
  auto as_int = [](const nlohmann::json& v) -> __int128 {
    if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
    if (v.is_number_unsigned()) return static_cast<__int128>(v.get<uint64_t>());
    return static_cast<__int128>(v.get<int64_t>());
  };
  auto as_ld = [&](const nlohmann::json& v) -> long double {
    return v.is_number_float() ? static_cast<long double>(v.get<double>()) : static_cast<long double>(as_int(v));
  };
  if (!a.is_number_float() && !b.is_number_float()) return as_int(a) == as_int(b);
  return as_ld(a) == as_ld(b);  // NaN != NaN, as in Python
}

}  // namespace

bool PyJsonEqual(const nlohmann::json& a, const nlohmann::json& b) {
  if (IsPyNumber(a) || IsPyNumber(b)) return IsPyNumber(a) && IsPyNumber(b) && PyNumberEqual(a, b);
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto other = b.find(it.key());
      if (other == b.end() || !PyJsonEqual(it.value(), *other)) return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!PyJsonEqual(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;  // strings, null
}

}  // namespace k3pack::manifest
