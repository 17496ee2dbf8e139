#include "util/utf8.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

namespace k3pack {

namespace {

// What CPython's strict decoder finds at b[0] (n bytes left): the length of
// the valid sequence starting there, or, when none does, how many bytes its
// error names and why. The allowed second byte is narrowed after E0 (A0..BF),
// ED (80..9F: no surrogates), F0 (90..BF: no overlongs) and F4 (80..8F:
// <= U+10FFFF); C0, C1 and F5..FF never start a sequence.
struct SequenceScan {
  size_t length = 0;        // bytes of the valid sequence; 0 when invalid
  size_t bad = 0;           // when invalid: the bytes CPython's error range covers
  const char* reason = "";  // CPython's reason for that range
};

SequenceScan ScanSequence(const unsigned char* b, size_t n) {
  const unsigned c = b[0];
  if (c < 0x80) return {1};
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {0, 1, "invalid start byte"};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= n) return {0, k, "unexpected end of data"};
    const unsigned cc = b[k];
    const unsigned l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (cc < l || cc > h) return {0, k, "invalid continuation byte"};
  }
  return {need + 1};
}

size_t ValidSequenceLength(const unsigned char* b, size_t n) { return ScanSequence(b, n).length; }

// The zero of every run of ten Nd code points (Unicode keeps each script's
// decimal digits contiguous, 0 to 9), from Python 3.12's unicodedata.
constexpr std::array<uint32_t, 68> kDecimalZeros = {
    0x30,    0x660,   0x6f0,   0x7c0,   0x966,   0x9e6,   0xa66,   0xae6,   0xb66,   0xbe6,   0xc66,   0xce6,
    0xd66,   0xde6,   0xe50,   0xed0,   0xf20,   0x1040,  0x1090,  0x17e0,  0x1810,  0x1946,  0x19d0,  0x1a80,
    0x1a90,  0x1b50,  0x1bb0,  0x1c40,  0x1c50,  0xa620,  0xa8d0,  0xa900,  0xa9d0,  0xa9f0,  0xaa50,  0xabf0,
    0xff10,  0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0, 0x112f0, 0x11450, 0x114d0, 0x11650, 0x116c0,
    0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0, 0x11f50, 0x16a60, 0x16ac0, 0x16b50, 0x1d7ce, 0x1d7d8,
    0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e4f0, 0x1e950, 0x1fbf0};

// The digit value of code point `cp`, or -1 when it is no decimal digit.
int DecimalDigitValue(uint32_t cp) {
  auto it = std::upper_bound(kDecimalZeros.begin(), kDecimalZeros.end(), cp);
  if (it == kDecimalZeros.begin()) return -1;
  const uint32_t zero = *(it - 1);
  return cp - zero < 10 ? static_cast<int>(cp - zero) : -1;
}

}  // namespace

namespace {

// `s` as the ASCII digits of its Unicode decimal digits ("1\u0662" -> "12");
// false when it is empty or holds anything else.
bool AsciiDecimalDigits(std::string_view s, std::string* ascii) {
  if (s.empty()) return false;
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t n = ValidSequenceLength(b + i, s.size() - i);
    if (n == 0) return false;
    // The lead byte's payload bits, then six from each continuation byte.
    uint32_t cp = n == 1 ? b[i] : b[i] & (0x7Fu >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b[i + k] & 0x3Fu);
    const int digit = DecimalDigitValue(cp);
    if (digit < 0) return false;
    ascii->push_back(static_cast<char>('0' + digit));
    i += n;
  }
  return true;
}

}  // namespace

std::optional<PyDecimal> ParsePyDecimal(std::string_view s) {
  std::string ascii;
  if (!AsciiDecimalDigits(s, &ascii)) return std::nullopt;
  PyDecimal d;
  const size_t first = ascii.find_first_not_of('0');
  d.text = first == std::string::npos ? std::string("0") : ascii.substr(first);
  for (char c : d.text) {
    if (__builtin_mul_overflow(d.value, uint64_t{10}, &d.value) ||
        __builtin_add_overflow(d.value, static_cast<uint64_t>(c - '0'), &d.value)) {
      d.value = UINT64_MAX;
      break;
    }
  }
  return d;
}

std::optional<std::string> PyDecimalText(std::string_view s) {
  std::optional<PyDecimal> d = ParsePyDecimal(s);
  if (!d) return std::nullopt;
  return std::move(d->text);
}

std::optional<uint64_t> PyDecimalValue(std::string_view s) {
  const std::optional<PyDecimal> d = ParsePyDecimal(s);
  if (!d) return std::nullopt;
  return d->value;
}

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
  auto hex = [](unsigned char b) {
    const char* d = "0123456789abcdef";
    return std::string("0x") + d[b >> 4] + d[b & 15];
  };
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const SequenceScan scan = ScanSequence(b + i, s.size() - i);
    if (scan.length > 0) {
      i += scan.length;
      continue;
    }
    const std::string where = scan.bad == 1 ? "byte " + hex(b[i]) + " in position " + std::to_string(i)
                                            : "bytes in position " + std::to_string(i) + "-" +
                                                  std::to_string(i + scan.bad - 1);
    return "'utf-8' codec can't decode " + where + ": " + scan.reason;
  }
  return "";
}

}  // namespace k3pack
