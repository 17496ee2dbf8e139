// Python-compatible JSON text: reproduces CPython's json.dumps byte for byte
// for the styles SGLang writes, so manifests, canonical digests and stats
// files made by k3pack are interchangeable with SGLang's.
//
// Python semantics reproduced: keys sorted by code point (equal to unsigned
// UTF-8 byte order, which is what we sort by); strings escape only `"`, `\`
// and control characters < 0x20 (\b \f \n \r \t, others \u00XX lowercase);
// `/` is not escaped; non-ASCII is raw UTF-8 unless ensure_ascii, where it is
// \uXXXX (lowercase hex, surrogate pairs above the BMP); integers plain
// decimal over the full int64/uint64 range; floats as Python's repr
// (shortest round trip: 0.0, 1e-05, 1.5e+20, NaN, Infinity).
//
// Strings must be valid UTF-8 (Python str always is). Invalid bytes are
// written as U+FFFD rather than producing text Python could never emit;
// IsValidUtf8 lets callers reject such input earlier with a proper error.
#pragma once

#include "util/utf8.h"

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace k3pack::manifest {

enum class PyJsonStyle {
  // json.dumps(v, ensure_ascii=False, indent=2, sort_keys=True): manifest files.
  kIndent2,
  // json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":")): canonical_sha256.
  kCanonical,
  // json.dumps(v, indent=2, sort_keys=True): stats files (ensure_ascii default True).
  kIndent2Ascii,
  // json.dumps(v, sort_keys=True, separators=(",", ":")).
  kCanonicalAscii,
  // json.dumps(v, sort_keys=True): default separators (", ", ": "), ASCII.
  kDefaultAscii,
};

// General form; the styles above are presets of it. Keys are always sorted.
struct PyJsonOptions {
  int indent = -1;               // < 0: no newlines (Python indent=None)
  bool ensure_ascii = true;
  std::string item_separator = ", ";  // Python uses "," when indent is given
  std::string key_separator = ": ";
};
PyJsonOptions PyJsonOptionsFor(PyJsonStyle style);

std::string PyJsonDumps(const nlohmann::json& value, PyJsonStyle style);
std::string PyJsonDumps(const nlohmann::json& value, const PyJsonOptions& options);

// Appends one JSON string literal (with quotes) for `utf8`.
void PyJsonAppendString(std::string& out, std::string_view utf8, bool ensure_ascii);

// SGLang's canonical_sha256(v): lowercase hex SHA-256 of the kCanonical text.
std::string CanonicalSha256(const nlohmann::json& value);

// Python repr(float) (also what json.dumps writes for finite floats).
std::string PyFloatRepr(double v);

// Python repr() of a str / int / float / bool / None / list / dict held in
// `value` (dict items in the json's key order; build the text by hand where
// Python's insertion order differs). Strings go through k3pack::PyRepr
// (src/util/pyrepr.h). Used to reproduce SGLang's f-string error texts.
std::string PyReprJson(const nlohmann::json& value);

// Python's `a == b` on the values json.load returns: dicts by key set and
// values (order irrelevant), lists element-wise, and numbers by value across
// int, float and bool (True == 1 == 1.0, as Python's bool is an int). SGLang
// compares manifest values this way (e.g. hard_constraints against its dict).
bool PyJsonEqual(const nlohmann::json& a, const nlohmann::json& b);

using k3pack::IsValidUtf8;  // util/utf8.h

}  // namespace k3pack::manifest
