// PyJsonDumps against CPython's json.dumps (spawned as an independent oracle)
// on hand-picked edge cases and on randomly generated documents.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <limits>
#include <random>

#include "manifest/pyjson.h"
#include "test_util.h"
#include "util/sha256.h"

using k3pack::manifest::CanonicalSha256;
using k3pack::manifest::PyFloatRepr;
using k3pack::manifest::PyJsonDumps;
using k3pack::manifest::PyJsonStyle;
using k3pack::manifest::PyReprJson;
using nlohmann::json;

namespace {

std::string Utf8(uint32_t cp) {
  std::string out;
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
  return out;
}

// Code points that stress escaping and ordering; the first group is also
// printable for Python's repr.
const uint32_t kPrintable[] = {'a', 'Z', '0', ' ', '/', '\'', '"', '\\', '{', '~', 0xE9, 0xDF, 0x4E2D,
                               0xFF21, 0x1F600, 0x1D11E, 0x10000, 0x100, 0x7FF, 0x800};
const uint32_t kWeird[] = {0x00, 0x01, 0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x1F, 0x7F, 0x80, 0x9F, 0xA0,
                           0xAD, 0x2028, 0xE000, 0xFFFF, 0xFFFD, 0x10FFFF};

struct Gen {
  std::mt19937_64 rng;
  bool repr_safe = true;

  std::string Str(int max_len) {
    std::string s;
    int n = static_cast<int>(rng() % (max_len + 1));
    for (int i = 0; i < n; ++i) {
      if (rng() % 8 == 0) {
        s += Utf8(kWeird[rng() % std::size(kWeird)]);
        repr_safe = false;
      } else {
        s += Utf8(kPrintable[rng() % std::size(kPrintable)]);
      }
    }
    return s;
  }

  double Float() {
    switch (rng() % 4) {
      case 0: {  // random bit pattern, finite
        for (;;) {
          uint64_t bits = rng();
          double d;
          std::memcpy(&d, &bits, 8);
          if (std::isfinite(d)) return d;
        }
      }
      case 1: return static_cast<double>(static_cast<int64_t>(rng() % 2000000) - 1000000) / 1000.0;
      case 2: return std::ldexp(1.0, static_cast<int>(rng() % 200) - 100);
      default: return std::pow(10.0, static_cast<int>(rng() % 44) - 22) * (rng() % 2 ? 1 : -1.5);
    }
  }

  json Value(int depth) {
    int kind = static_cast<int>(rng() % (depth > 0 ? 9 : 7));
    switch (kind) {
      case 0: return nullptr;
      case 1: return rng() % 2 == 0;
      case 2: return static_cast<int64_t>(rng());
      case 3: return static_cast<uint64_t>(rng());
      case 4: return Float();
      case 5: return Str(6);
      case 6: return static_cast<int64_t>(rng() % 1000) - 500;
      case 7: {
        json a = json::array();
        int n = static_cast<int>(rng() % 5);
        for (int i = 0; i < n; ++i) a.push_back(Value(depth - 1));
        return a;
      }
      default: {
        json o = json::object();
        int n = static_cast<int>(rng() % 6);
        for (int i = 0; i < n; ++i) o[Str(4)] = Value(depth - 1);
        return o;
      }
    }
  }
};

struct OracleRecord {
  std::map<std::string, std::string> text;
};

// Runs the Python oracle over `docs`; returns one record per document.
std::vector<json> RunOracle(const json& docs) {
  k3test::TempDir dir;
  k3test::WriteFile(dir / "in.json", docs.dump());
  auto r = k3test::RunCmd(k3test::Python() + " " + k3test::ShellQuote(k3test::SourceFile("tests/manifest/pyjson_oracle.py")) +
                          " " + k3test::ShellQuote(dir / "in.json") + " " + k3test::ShellQuote(dir / "out.jsonl"));
  EXPECT_EQ(r.rc, 0) << r.out;
  std::vector<json> out;
  std::istringstream lines(k3test::ReadFile(dir / "out.jsonl"));
  std::string line;
  while (std::getline(lines, line)) out.push_back(json::parse(line));
  return out;
}

void ExpectMatchesOracle(const json& docs, const std::vector<bool>& repr_safe) {
  auto recs = RunOracle(docs);
  ASSERT_EQ(recs.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    const json& d = docs[i];
    const json& r = recs[i];
    SCOPED_TRACE("document " + std::to_string(i) + ": " + d.dump());
    EXPECT_EQ(PyJsonDumps(d, PyJsonStyle::kIndent2), r["indent2"].get<std::string>());
    EXPECT_EQ(PyJsonDumps(d, PyJsonStyle::kCanonical), r["canonical"].get<std::string>());
    EXPECT_EQ(PyJsonDumps(d, PyJsonStyle::kIndent2Ascii), r["indent2_ascii"].get<std::string>());
    EXPECT_EQ(PyJsonDumps(d, PyJsonStyle::kCanonicalAscii), r["canonical_ascii"].get<std::string>());
    EXPECT_EQ(PyJsonDumps(d, PyJsonStyle::kDefaultAscii), r["default_ascii"].get<std::string>());
    EXPECT_EQ(CanonicalSha256(d), r["canonical_sha256"].get<std::string>());
    if (repr_safe[i]) {
      EXPECT_EQ(PyReprJson(d), r["repr"].get<std::string>());
    }
  }
}

}  // namespace

TEST(PyJson, EdgeCasesMatchPython) {
  json docs = json::array();
  docs.push_back(json::object());
  docs.push_back(json::array());
  docs.push_back({{"a", json::array()}, {"b", json::object()}, {"c", {{"d", json::array({json::object()})}}}});
  docs.push_back("plain/slash and \"quotes\" and \\backslash\\");
  docs.push_back(std::string("ctl:\x01\x02\x08\t\n\x0b\x0c\r\x1b\x1f\x7f|") + std::string(1, '\0') + "nul");
  docs.push_back("non-ascii: caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 \xf0\x9d\x84\x9e \xe2\x80\xa8 \xef\xbf\xbf");
  docs.push_back(json::array({std::numeric_limits<uint64_t>::max(), std::numeric_limits<int64_t>::min(),
                              std::numeric_limits<int64_t>::max(), 0, -1, 985613049856ULL}));
  docs.push_back(json::array({true, false, nullptr}));
  docs.push_back(json::array({0.0, -0.0, 1.0, 0.1, 1e-05, 0.0001, 1.5e+20, 1e16, 1e15, 123456789.125, 1e-7,
                              5e-324, 1.7976931348623157e308, -2.5, 3.0e-310, 1234567890123456.0,
                              12345678901234567.0, 0.30000000000000004}));
  // Keys whose code point order differs from naive char (signed) order and
  // from UTF-16 order (astral vs U+FFxx).
  docs.push_back({{"b", 1}, {"a", 2}, {"B", 3}, {"\xc3\xa9", 4}, {"\xef\xbd\x81", 5}, {"\xf0\x9f\x98\x80", 6},
                  {"", 7}, {"a\x01", 8}, {"ab", 9}, {"\x7f", 10}});
  docs.push_back({{"tensors", json::array({{{"name", "blk.0.attn_q.weight"}, {"shape", {7168, 1536}},
                                            {"dtype", "Q4_K"}, {"dtype_id", 12}, {"nbytes", 6193152}}})},
                  {"nested", {{"x", {{"y", {{"z", json::array({1, json::array({2, json::array()})})}}}}}}}});
  std::vector<bool> repr_safe(docs.size(), true);
  repr_safe[4] = repr_safe[5] = repr_safe[9] = false;  // Python repr escapes non-printables (tested elsewhere)
  ExpectMatchesOracle(docs, repr_safe);
}

TEST(PyJson, RandomDocumentsMatchPython) {
  Gen g{std::mt19937_64(20261129)};
  json docs = json::array();
  std::vector<bool> repr_safe;
  for (int i = 0; i < 400; ++i) {
    g.repr_safe = true;
    docs.push_back(g.Value(3));
    repr_safe.push_back(g.repr_safe);
  }
  ExpectMatchesOracle(docs, repr_safe);
}

TEST(PyJson, NonFiniteFloatsAsPython) {
  // Python: json.dumps(float('nan')) == 'NaN', inf -> 'Infinity'; repr -> 'nan'/'inf'.
  json a = json::array({std::nan(""), std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()});
  EXPECT_EQ(PyJsonDumps(a, PyJsonStyle::kCanonical), "[NaN,Infinity,-Infinity]");
  EXPECT_EQ(PyReprJson(a), "[nan, inf, -inf]");
}

TEST(PyJson, FloatReprKnownValues) {
  EXPECT_EQ(PyFloatRepr(0.0), "0.0");
  EXPECT_EQ(PyFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PyFloatRepr(1e-05), "1e-05");
  EXPECT_EQ(PyFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PyFloatRepr(1.5e20), "1.5e+20");
  EXPECT_EQ(PyFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PyFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PyFloatRepr(4.64), "4.64");
}

TEST(PyJson, InvalidUtf8BecomesReplacementCharacter) {
  std::string bad = "a\xff" "b\xc3";
  EXPECT_FALSE(k3pack::manifest::IsValidUtf8(bad));
  EXPECT_TRUE(k3pack::manifest::IsValidUtf8("ok \xef\xbf\xbd \xf0\x9f\x98\x80"));
  EXPECT_EQ(PyJsonDumps(json(bad), PyJsonStyle::kCanonicalAscii), "\"a\\ufffdb\\ufffd\"");
}

TEST(PyJson, IndentLayout) {
  json v = {{"b", json::array({1, 2})}, {"a", json::object()}, {"c", {{"x", "y"}}}};
  EXPECT_EQ(PyJsonDumps(v, PyJsonStyle::kIndent2),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2\n  ],\n  \"c\": {\n    \"x\": \"y\"\n  }\n}");
  EXPECT_EQ(CanonicalSha256(v), k3pack::Sha256Hex(std::string(R"({"a":{},"b":[1,2],"c":{"x":"y"}})")));
}
