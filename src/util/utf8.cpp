#include "util/utf8.h"

#include <nlohmann/json.hpp>

namespace k3pack {

namespace {

// Length of the valid UTF-8 sequence starting at b[0] (n bytes left), or 0
// when none starts there. Strict as Python's decoder: no overlongs, no
// surrogates, <= U+10FFFF.
size_t ValidSequenceLength(const unsigned char* b, size_t n) {
  const unsigned c = b[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 1;
  else if (c == 0xE0) { len = 2; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) len = 2;
  else if (c == 0xED) { len = 2; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) len = 2;
  else if (c == 0xF0) { len = 3; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) len = 3;
  else if (c == 0xF4) { len = 3; hi = 0x8F; }
  else return 0;
  for (size_t k = 1; k <= len; ++k) {
    if (k >= n) return 0;
    const unsigned cc = b[k];
    const unsigned l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (cc < l || cc > h) return 0;
  }
  return len + 1;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t n = ValidSequenceLength(b + i, s.size() - i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string EscapeInvalidUtf8(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = ValidSequenceLength(b + i, s.size() - i);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
      continue;
    }
    const char esc[4] = {'\\', 'x', kHex[b[i] >> 4], kHex[b[i] & 15]};
    out.append(esc, 4);
    ++i;
  }
  return out;
}

size_t EscapeInvalidUtf8InJson(nlohmann::json& j) {
  size_t n = 0;
  if (j.is_string()) {
    auto& s = j.get_ref<std::string&>();
    if (!IsValidUtf8(s)) {
      s = EscapeInvalidUtf8(s);
      ++n;
    }
  } else if (j.is_array()) {
    for (auto& e : j) n += EscapeInvalidUtf8InJson(e);
  } else if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    bool renamed = false;
    for (auto it = j.begin(); it != j.end(); ++it) {
      n += EscapeInvalidUtf8InJson(it.value());
      if (!IsValidUtf8(it.key())) {
        renamed = true;
        ++n;
      }
    }
    if (renamed) {
      for (auto it = j.begin(); it != j.end(); ++it) out[EscapeInvalidUtf8(it.key())] = std::move(it.value());
      j = std::move(out);
    }
  }
  return n;
}

std::vector<std::string> EscapeInvalidUtf8Members(nlohmann::json& object) {
  std::vector<std::string> names;
  if (!object.is_object()) {
    EscapeInvalidUtf8InJson(object);
    return names;
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    const bool key_bad = !IsValidUtf8(it.key());
    if (EscapeInvalidUtf8InJson(it.value()) > 0 || key_bad) names.push_back(EscapeInvalidUtf8(it.key()));
  }
  // Keys last: renaming rebuilds the object.
  nlohmann::json wrapper = nlohmann::json::array({std::move(object)});
  EscapeInvalidUtf8InJson(wrapper);
  object = std::move(wrapper[0]);
  return names;
}

std::string DumpJsonEscaped(nlohmann::json j, int indent) {
  EscapeInvalidUtf8InJson(j);
  return j.dump(indent);
}

std::string PythonUtf8DecodeError(std::string_view s) {
  // CPython's decoder: a lead byte outside C2..F4 is an invalid start byte
  // (range of one byte); after a valid lead, the first byte that is not an
  // allowed continuation ends the range before it ("invalid continuation
  // byte"); running out of input after valid continuations is "unexpected
  // end of data". The allowed second byte is narrowed after E0 (A0..BF),
  // ED (80..9F), F0 (90..BF) and F4 (80..8F).
  auto hex = [](unsigned char b) {
    const char* d = "0123456789abcdef";
    return std::string("0x") + d[b >> 4] + d[b & 15];
  };
  auto message = [&](size_t start, size_t end, const char* reason) {
    std::string where = end - start == 1 ? "byte " + hex(static_cast<unsigned char>(s[start])) + " in position " +
                                               std::to_string(start)
                                         : "bytes in position " + std::to_string(start) + "-" + std::to_string(end - 1);
    return "'utf-8' codec can't decode " + where + ": " + reason;
  };
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) {
      need = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b == 0xe0) lo = 0xa0;
      if (b == 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b == 0xf0) lo = 0x90;
      if (b == 0xf4) hi = 0x8f;
    } else {
      return message(i, i + 1, "invalid start byte");
    }
    size_t k = 1;
    for (; k <= need; ++k) {
      if (i + k >= s.size()) return message(i, i + k, "unexpected end of data");
      const auto c = static_cast<unsigned char>(s[i + k]);
      const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
      if (c < l || c > h) return message(i, i + k, "invalid continuation byte");
    }
    i += need + 1;
  }
  return "";
}

}  // namespace k3pack
