// Strict UTF-8 validation, shared by the pack index (entry names) and the
// manifest writer (paths and names it must emit as Python would decode them),
// and the one escaping rule for showing bytes that are not UTF-8 (GGUF
// strings are bytes: a key, value or tensor name may hold anything).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace k3pack {

// True when `s` is UTF-8 that Python's strict decoder accepts: no overlong
// forms, no surrogates, nothing above U+10FFFF, no truncated sequences.
bool IsValidUtf8(std::string_view s);

// The message of the UnicodeDecodeError Python's strict bytes.decode("utf-8")
// raises on `s` (e.g. "'utf-8' codec can't decode byte 0xe2 in position 3:
// invalid continuation byte"), or "" when `s` is valid UTF-8. SGLang's
// store decodes index names strictly, so a damaged name is this error.
std::string PythonUtf8DecodeError(std::string_view s);

// `s` as Python's bytes.decode("utf-8", "backslashreplace") shows it: valid
// sequences kept, every other byte written as the four characters \xNN
// (lowercase hex). Valid UTF-8 comes back unchanged. The result is valid
// UTF-8, so JSON output of it cannot fail.
std::string EscapeInvalidUtf8(std::string_view s);

// Escapes every string value and object key under `j` that is not valid
// UTF-8 (EscapeInvalidUtf8), so j.dump() cannot throw; returns how many were
// escaped.
size_t EscapeInvalidUtf8InJson(nlohmann::json& j);

// j.dump(indent) after EscapeInvalidUtf8InJson: JSON text that cannot throw,
// for every k3pack output that may hold a path (a path is bytes on Linux).
std::string DumpJsonEscaped(nlohmann::json j, int indent = 2);

// For a JSON object: escapes its members as above and returns the names of
// the members that held anything not UTF-8 (a key among them is reported by
// its escaped name). Callers record the list as the object's "not_utf8".
std::vector<std::string> EscapeInvalidUtf8Members(nlohmann::json& object);

// Python's int(s) when `s` (UTF-8) is one or more Unicode decimal digits:
// the characters of category Nd, which `\d` matches in a str pattern (the
// `(?P<layer>\d+)` of SGLang's tensor-name regexes) and int() reads by their
// digit value ("\u0663" is 3). nullopt for an empty string or any other
// character (a superscript "\u00b2" is no decimal digit). The value saturates
// at UINT64_MAX. The digits are Unicode 15.0's, which Python 3.12 and 3.13
// both use; Python 3.10 and 3.11 lack a few scripts' (Kawi, Nag Mundari).
std::optional<uint64_t> PyDecimalValue(std::string_view s);
// str(int(s)) for the same `s`: ASCII digits without leading zeros
// ("0\u0663" -> "3", "00" -> "0"), of any length; nullopt likewise.
std::optional<std::string> PyDecimalText(std::string_view s);
// Both from one decoding of `s`, for a caller that needs both.
struct PyDecimal {
  uint64_t value = 0;  // PyDecimalValue
  std::string text;    // PyDecimalText
};
std::optional<PyDecimal> ParsePyDecimal(std::string_view s);

}  // namespace k3pack
