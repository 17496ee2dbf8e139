// GGUF strings are bytes: a key, a value, a vocabulary token or a tensor name
// that is not UTF-8 must never abort `inspect` (any mode) or `doctor --json`
// (nlohmann::json::dump throws type_error 316 on such bytes). They are shown
// escaped (\xNN, Python's "backslashreplace") and marked "not_utf8".
#include <nlohmann/json.hpp>

#include "doctor_test_util.h"
#include "util/utf8.h"

namespace dtest {
namespace {

using nlohmann::json;

TEST(NotUtf8, EscapingRuleIsPythonsBackslashReplace) {
  EXPECT_EQ(EscapeInvalidUtf8("plain caf\xc3\xa9"), "plain caf\xc3\xa9");
  EXPECT_EQ(EscapeInvalidUtf8("bad\xffname"), "bad\\xffname");
  EXPECT_EQ(EscapeInvalidUtf8("\xc3("), "\\xc3(");                    // truncated sequence
  EXPECT_EQ(EscapeInvalidUtf8("\xed\xa0\x80"), "\\xed\\xa0\\x80");    // a surrogate
  EXPECT_EQ(EscapeInvalidUtf8("\xc0\xaf"), "\\xc0\\xaf");              // overlong
  EXPECT_EQ(EscapeInvalidUtf8("\xf0\x9f\x98\x80\xf0"), "\xf0\x9f\x98\x80\\xf0");
  json j = {{"ok", "x"}, {"bad\xfekey", {"v\xff", 1}}};
  EXPECT_EQ(EscapeInvalidUtf8Members(j), std::vector<std::string>{"bad\\xfekey"});
  EXPECT_EQ(j.dump(), R"({"bad\\xfekey":["v\\xff",1],"ok":"x"})");
}

// The strict decoder's error texts, as CPython 3.11 prints them for the same
// bytes (`bytes.decode("utf-8")`): the escaping above and these texts share
// one sequence scanner, so both follow CPython's ranges.
TEST(NotUtf8, DecodeErrorTextIsCPythons) {
  const auto text = [](std::string_view s) { return PythonUtf8DecodeError(s); };
  EXPECT_EQ(text("plain caf\xc3\xa9"), "");
  EXPECT_EQ(text("\xe2(\xa1"), "'utf-8' codec can't decode byte 0xe2 in position 0: invalid continuation byte");
  EXPECT_EQ(text("ab\xff"), "'utf-8' codec can't decode byte 0xff in position 2: invalid start byte");
  EXPECT_EQ(text("\xf0\x9f\x98"), "'utf-8' codec can't decode bytes in position 0-2: unexpected end of data");
  EXPECT_EQ(text("\xe2\x82"), "'utf-8' codec can't decode bytes in position 0-1: unexpected end of data");
  EXPECT_EQ(text("\xed\xa0\x80"), "'utf-8' codec can't decode byte 0xed in position 0: invalid continuation byte");
  EXPECT_EQ(text("\xc0\xaf"), "'utf-8' codec can't decode byte 0xc0 in position 0: invalid start byte");
  EXPECT_EQ(text("x\xf4\x90\x80\x80"), "'utf-8' codec can't decode byte 0xf4 in position 1: invalid continuation byte");
  EXPECT_EQ(text("\xe0\x80\x80"), "'utf-8' codec can't decode byte 0xe0 in position 0: invalid continuation byte");
  EXPECT_EQ(text("caf\xc3\xa9\xc3"), "'utf-8' codec can't decode byte 0xc3 in position 5: unexpected end of data");
}

// One GGUF file holding every kind of string that is not UTF-8.
fs::path WriteNotUtf8Gguf(const fs::path& dir) {
  gguf::MetadataBuilder meta;
  std::vector<std::string> tokens;
  for (int i = 0; i < 11; ++i) tokens.push_back("tok" + std::to_string(i));
  tokens.push_back("\xed\xa0\x80");  // past the 8-item preview: counted, not shown
  meta.Str("general.architecture", "kimi-k3")
      .Str("general.name", "bad\xffname")
      .Str("general.bad\xfekey", "x")
      .StrArray("tokenizer.ggml.tokens", tokens);
  std::vector<gguf::TensorSpec> tensors = {
      {"blk.0.bad\xc3(name.weight", GgmlType::F32, {4}, nullptr},
      {"output_norm.weight", GgmlType::F32, {4}, nullptr},
  };
  const fs::path path = dir / "notutf8.gguf";
  Status st = gguf::WriteGguf(path.string(), meta, tensors);
  EXPECT_TRUE(st.ok()) << st.message();
  return path;
}

TEST(NotUtf8, InspectEveryModeAndDoctorJsonNeverAbort) {
  const fs::path dir = TempDir("not-utf8");
  const std::string path = WriteNotUtf8Gguf(dir).string();

  for (const std::string mode : {"--json", "--json --file-only", "--json --summary", "--json --stats"}) {
    SCOPED_TRACE(mode);
    CliResult r = RunCli("inspect " + mode + " " + path);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    const json& name = j["metadata"]["general.name"];
    EXPECT_EQ(name["value"], "bad\\xffname");
    EXPECT_EQ(name["not_utf8"], json::array({"value"}));
    ASSERT_TRUE(j["metadata"].contains("general.bad\\xfekey")) << j["metadata"].dump();
    EXPECT_EQ(j["metadata"]["general.bad\\xfekey"]["not_utf8"], json::array({"key"}));
    const json& tok = j["metadata"]["tokenizer.ggml.tokens"];
    EXPECT_EQ(tok["not_utf8"], json::array({"elements"}));
    EXPECT_EQ(tok["not_utf8_elements"], 1);
    if (j.contains("tensors")) {
      EXPECT_EQ(j["tensors"][0]["name"], "blk.0.bad\\xc3(name.weight");
      EXPECT_EQ(j["tensors"][0]["not_utf8"], json::array({"name"}));
    }
  }
  for (const std::string mode : {"", "--file-only", "--summary", "--stats"}) {
    SCOPED_TRACE("text " + mode);
    CliResult r = RunCli("inspect " + mode + " " + path);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("\"bad\\\\xffname\" (not UTF-8: value"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("general.bad\\xfekey"), std::string::npos) << r.out;
    if (mode != "--summary") {
      EXPECT_NE(r.out.find("blk.0.bad\\xc3(name.weight (not UTF-8)"), std::string::npos) << r.out;
    }
  }

  CliResult d = RunCli("doctor --json --profile scaled " + path);
  EXPECT_TRUE(d.exit_code == 1 || d.exit_code == 2) << d.exit_code << "\n" << d.out;
  json j = json::parse(d.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << d.out;
  EXPECT_EQ(j["schema"], "k3pack-doctor-v1");
  // The escaped name appears only escaped, in findings marked not_utf8.
  bool marked = false;
  for (const auto& f : j["findings"]) {
    if (f.dump().find("bad\\\\xc3(name") != std::string::npos) {
      EXPECT_TRUE(f.contains("not_utf8")) << f.dump();
      marked = true;
    }
  }
  EXPECT_TRUE(marked) << "no finding names the tensor whose name is not UTF-8:\n" << d.out;
  // Before, a key that is not UTF-8 was no finding at all ("healthy" where it
  // was alone): gguf-py decodes keys and tensor names strictly.
  std::map<std::string, std::string> not_utf8;  // object -> SGLang's text
  for (const auto& f : j["findings"]) {
    if (f["code"] == "gguf-not-utf8") not_utf8[f["object"].get<std::string>()] = f["sglang_error"].get<std::string>();
  }
  EXPECT_EQ(not_utf8["general.bad\\xfekey"], "'utf-8' codec can't decode byte 0xfe in position 11: invalid start byte")
      << d.out;
  EXPECT_EQ(not_utf8["blk.0.bad\\xc3(name.weight"],
            "'utf-8' codec can't decode byte 0xc3 in position 9: invalid continuation byte") << d.out;
  EXPECT_EQ(not_utf8.size(), 2u) << d.out;
  CliResult t = RunCli("doctor --profile scaled " + path);
  EXPECT_TRUE(t.exit_code == 1 || t.exit_code == 2) << t.out;
  EXPECT_NE(t.out.find("bad\\xc3(name.weight"), std::string::npos) << t.out;
}

TEST(NotUtf8, DoctorReportToJsonDumpsInProcess) {
  const fs::path dir = TempDir("not-utf8-inproc");
  const std::string path = WriteNotUtf8Gguf(dir).string();
  doctor::DiagnoseOptions o;
  o.profile = kimi::Profile::kScaled;
  const doctor::Report report = doctor::Diagnose({path}, o);
  std::string text;
  EXPECT_NO_THROW(text = report.ToJson().dump(2));
  EXPECT_FALSE(json::parse(text, nullptr, false).is_discarded());
}

}  // namespace
}  // namespace dtest
