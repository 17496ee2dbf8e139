// `k3pack verify` checks every digest and input the manifest records against
// the files, and says which one changed: the whole-pack SHA-256 (--full, when
// written with --full-pack-hash: covers padding and the zero fill before
// data_start), source.inventory_sha256 recomputed from the shards, each
// source.tensors record, model.config_sha256 and the model dimensions against
// the config, tokenizer.files[] and tokenizer.inventory_sha256. The loader's
// verify_metadata recomputes the source inventory the same way.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;
using k3test::Bin;
using k3test::RunCmd;
using k3test::ShellQuote;
using nlohmann::json;

namespace {


std::string MessageOnFirstLine(const std::string& s) {
  // Skip the "k3pack verify: error: " prefix the CLI puts before the message.
  std::string line = s.substr(0, s.find('\n'));
  const std::string tag = "error: ";
  const size_t at = line.find(tag);
  return at == std::string::npos ? line : line.substr(at + tag.size());
}

uint64_t Le(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

void FlipByte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

class VerifyInputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new k3test::TempDir("k3verify-inputs");
    const std::string model = *root_ / "model";
    auto r = RunCmd(Bin() + " synth --preset tiny --out " + ShellQuote(model));
    ASSERT_EQ(r.rc, 0) << r.out;
    r = RunCmd(Bin() + " build --profile scaled --progress none --json --full-pack-hash --safety-margin-gib 0" +
               " --gguf-dir " + ShellQuote(model) + " --model-config " + ShellQuote(model + "/config.json") +
               " --tokenizer-dir " + ShellQuote(model + "/tokenizer") + " --out " + ShellQuote(*root_ / "x.pack") +
               " --manifest " + ShellQuote(*root_ / "m.json"));
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static std::string Manifest() { return *root_ / "m.json"; }
  static json Doc() { return json::parse(k3test::ReadFile(Manifest())); }
  static k3test::CmdResult Verify(const std::string& manifest, const std::string& extra = "") {
    return RunCmd(Bin() + " verify --progress none --manifest " + ShellQuote(manifest) + " " + extra);
  }
  // Writes `doc` as a manifest beside the original and returns its path.
  static std::string Edited(const json& doc) {
    const std::string p = *root_ / "edited.json";
    k3test::WriteFile(p, doc.dump(2));
    return p;
  }
  static k3test::TempDir* root_;
};
k3test::TempDir* VerifyInputs::root_ = nullptr;

TEST_F(VerifyInputs, UnchangedInputsVerify) {
  auto r = Verify(Manifest(), "--full --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["pack_sha256_checked"], true);
  EXPECT_EQ(Verify(Manifest()).rc, 0);
  auto l = RunCmd(Bin() + " load --summary --verify-metadata --manifest " + ShellQuote(Manifest()));
  EXPECT_EQ(l.rc, 0) << l.out;
}

// Bytes no per-entry check reads: the zero fill between the index and
// data_start (first, middle, last byte), and the padding after a payload
// where the layout has any. Only the whole-pack digest sees them.
TEST_F(VerifyInputs, FullChecksWholePackDigestOverPaddingAndZeroFill) {
  const std::string pack = *root_ / "x.pack";
  const std::string bytes = k3test::ReadFile(pack);
  const uint64_t count = Le(bytes, 24, 8), data_start = Le(bytes, 32, 8);
  const uint64_t index_end = 40 + count * 152;
  ASSERT_LT(index_end, data_start) << "the tiny pack has no zero fill before data_start";
  uint64_t gap = 0;  // first padding byte after a payload
  for (uint64_t i = 0; i + 1 < count && gap == 0; ++i) {
    const uint64_t end = Le(bytes, 40 + i * 152 + 136, 8) + Le(bytes, 40 + i * 152 + 144, 8);
    if (end < Le(bytes, 40 + (i + 1) * 152 + 136, 8)) gap = end;
  }
  // The tiny model's role sizes are multiples of 4096, so its pack may have no
  // padding between payloads; the zero fill before data_start is always there.
  std::vector<uint64_t> where = {index_end, index_end + (data_start - index_end) / 2, data_start - 1};
  if (gap > 0) where.push_back(gap);
  for (const uint64_t at : where) {
    SCOPED_TRACE("byte " + std::to_string(at));
    FlipByte(pack, at);
    auto r = Verify(Manifest(), "--full");
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(MessageOnFirstLine(r.out), "Kimi expert-pack SHA-256 does not match manifest") << r.out;
    EXPECT_NE(r.out.find("padding"), std::string::npos) << r.out;
    FlipByte(pack, at);
    EXPECT_EQ(Verify(Manifest(), "--full").rc, 0);
  }
}

TEST_F(VerifyInputs, EditedManifestDigestsAndRecordsAreNamed) {
  const json doc = Doc();
  const std::string shard0 = doc["source"]["shards"][0]["path"];
  const std::string config = doc["model"]["config_path"];
  const std::string tok_dir = doc["tokenizer"]["path"];
  const std::string tok0 = doc["tokenizer"]["files"][0]["name"];
  std::string tensor;  // a non-routed tensor record
  size_t tensor_at = 0;
  for (size_t i = 0; i < doc["source"]["tensors"].size(); ++i) {
    const std::string n = doc["source"]["tensors"][i]["name"];
    if (n.find("_exps") == std::string::npos) {
      tensor = n;
      tensor_at = i;
      break;
    }
  }
  ASSERT_FALSE(tensor.empty());
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::string first_line;
  };
  const Case cases[] = {
      {"source.inventory_sha256", [](json& d) { d["source"]["inventory_sha256"] = std::string(64, '0'); },
       "manifest source.inventory_sha256 does not match the GGUF shards: inventory_sha256 "},
      {"a tensor record's data_offset",
       [&](json& d) {
         d["source"]["tensors"][tensor_at]["data_offset"] = d["source"]["tensors"][tensor_at]["data_offset"].get<uint64_t>() + 32;
       },
       "GGUF tensor " + tensor + " in " + shard0 + " does not match the manifest's source.tensors record: data_offset "},
      {"a tensor record dropped",
       [&](json& d) { d["source"]["tensors"].erase(d["source"]["tensors"].begin() + static_cast<long>(tensor_at)); },
       "GGUF shard " + shard0 + " changed since the manifest was written: tensor " + tensor +
           " is in the shard but not in the manifest's source.tensors"},
      {"source.summary.total_bytes", [](json& d) { d["source"]["summary"]["total_bytes"] = 1; },
       "manifest source.summary does not match the GGUF shards: total_bytes "},
      {"model.config_sha256", [](json& d) { d["model"]["config_sha256"] = std::string(64, 'a'); },
       "model config " + config + " changed since the manifest was written: config_sha256 "},
      {"model.hidden_size", [](json& d) { d["model"]["hidden_size"] = d["model"]["hidden_size"].get<uint64_t>() + 64; },
       "manifest model.hidden_size does not match the model config " + config + ": hidden_size "},
      {"tokenizer.files[0].sha256", [](json& d) { d["tokenizer"]["files"][0]["sha256"] = std::string(64, 'b'); },
       "tokenizer file " + tok_dir + "/" + tok0 + " changed since the manifest was written: sha256 "},
      {"tokenizer.inventory_sha256", [](json& d) { d["tokenizer"]["inventory_sha256"] = std::string(64, 'c'); },
       "manifest tokenizer.inventory_sha256 does not match the tokenizer files: inventory_sha256 recomputed from " +
           tok_dir},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json d = doc;
    c.edit(d);
    const std::string edited = Edited(d);
    auto r = Verify(edited);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(MessageOnFirstLine(r.out).rfind(c.first_line, 0), 0u) << "expected: " << c.first_line << "\n" << r.out;
  }
  // The loader's verify_metadata recomputes the inventory too.
  json d = doc;
  d["source"]["inventory_sha256"] = std::string(64, '0');
  auto l = RunCmd(Bin() + " load --summary --verify-metadata --manifest " + ShellQuote(Edited(d)));
  EXPECT_NE(l.rc, 0) << l.out;
  EXPECT_NE(l.out.find("manifest source.inventory_sha256 does not match the GGUF shards"), std::string::npos) << l.out;
  d = doc;
  d["source"]["tensors"][tensor_at]["nbytes"] = d["source"]["tensors"][tensor_at]["nbytes"].get<uint64_t>() + 4;
  l = RunCmd(Bin() + " load --summary --verify-metadata --manifest " + ShellQuote(Edited(d)));
  EXPECT_NE(l.rc, 0) << l.out;
  EXPECT_NE(l.out.find("Kimi-K3 GGUF tensor layout changed: " + tensor), std::string::npos) << l.out;
}

TEST_F(VerifyInputs, ChangedConfigAndTokenizerFilesAreNamed) {
  const json doc = Doc();
  const std::string config = doc["model"]["config_path"];
  const std::string tok_dir = doc["tokenizer"]["path"];
  const std::string tok0 = tok_dir + "/" + doc["tokenizer"]["files"][0]["name"].get<std::string>();

  const std::string cfg = k3test::ReadFile(config);
  k3test::WriteFile(config, cfg + "\n");
  auto r = Verify(Manifest());
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(MessageOnFirstLine(r.out).rfind(
                "model config " + config + " changed since the manifest was written: config_sha256 ", 0),
            0u)
      << r.out;
  k3test::WriteFile(config, cfg);

  const std::string tok = k3test::ReadFile(tok0);
  ASSERT_FALSE(tok.empty());
  std::string changed = tok;
  changed[0] = static_cast<char>(changed[0] ^ 1);  // same size
  k3test::WriteFile(tok0, changed);
  r = Verify(Manifest());
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(MessageOnFirstLine(r.out).rfind(
                "tokenizer file " + tok0 + " changed since the manifest was written: sha256 ", 0),
            0u)
      << r.out;
  k3test::WriteFile(tok0, tok);

  k3test::WriteFile(tok_dir + "/added.txt", "x");
  r = Verify(Manifest());
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(MessageOnFirstLine(r.out),
            "tokenizer directory " + tok_dir + " has a file the manifest does not record: added.txt")
      << r.out;
  fs::remove(tok_dir + "/added.txt");
  EXPECT_EQ(Verify(Manifest()).rc, 0);
}

}  // namespace
