#include "util/pyrepr.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace k3pack {

std::string PyRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

static std::string Join(const std::vector<int64_t>& v, char open, char close) {
  std::string out(1, open);
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(v[i]);
  }
  out += close;
  return out;
}

std::string PyList(const std::vector<int64_t>& v) { return Join(v, '[', ']'); }

std::string PySet(const std::vector<int64_t>& v) {
  if (v.empty()) return "set()";
  std::vector<int64_t> s = v;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return Join(s, '{', '}');
}

Error PyIsADirectoryError(const std::string& path) {
  return Error("[Errno 21] Is a directory: " + PyRepr(path), ErrorKind::kOS, EISDIR);
}

}  // namespace k3pack
