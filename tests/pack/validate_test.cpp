// §6.2 validator: every error provoked on a crafted copy of a good pack;
// full verification finds any single flipped payload byte.
#include <fcntl.h>
#include <unistd.h>

#include "pack/format.h"
#include "pack_fixture.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::Model;
using testing::ReadAll;
using testing::WriteAll;

class PackValidate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(testing::TempDir("validate"));
    model_ = new Model(testing::MakeModel(*root_ + "/model", 11));
    good_path_ = new std::string(*root_ + "/good.pack");
    BuildOptions o;
    o.out_path = *good_path_;
    o.safety_margin_gib = 0;
    auto r = BuildPack(model_->experts, o);
    ASSERT_TRUE(r.ok()) << r.error().message();
    good_ = new std::string(ReadAll(*good_path_));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete model_;
    delete good_;
    delete good_path_;
    delete root_;
  }
  // Validates `bytes` written to a scratch file; returns the error text or "OK".
  std::string Check(const std::string& bytes, int64_t samples = 6) {
    const std::string p = *root_ + "/bad.pack";
    WriteAll(p, bytes);
    ValidateOptions o;
    o.payload_samples = samples;
    auto r = ValidatePack(p, model_->experts, o);
    return r.ok() ? "OK" : r.error().message();
  }
  static void PutU64(std::string& b, uint64_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
  }
  static void PutU32(std::string& b, uint64_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
  }
  static uint64_t GetU64(const std::string& b, uint64_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
    return v;
  }
  static uint64_t Entry(uint64_t i) { return 40 + i * 152; }
  uint64_t N() const { return GetU64(*good_, 24); }

  static std::string* root_;
  static Model* model_;
  static std::string* good_;
  static std::string* good_path_;
};
std::string* PackValidate::root_;
Model* PackValidate::model_;
std::string* PackValidate::good_;
std::string* PackValidate::good_path_;

TEST_F(PackValidate, GoodPackPasses) { EXPECT_EQ(Check(*good_), "OK"); }

TEST_F(PackValidate, MissingFile) {
  auto r = ValidatePack(*root_ + "/nope.pack", model_->experts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kFileNotFound);
}

TEST_F(PackValidate, HeaderErrors) {
  EXPECT_EQ(Check(good_->substr(0, 39)), "GGML expert-pack header is truncated");
  std::string b = *good_;
  b[3] = 'X';
  // SGLang's words, then which file it was and what it is (session 44).
  // A pack's name: its first bytes are taken for damage, which the repair mends.
  EXPECT_EQ(Check(b), "GGML expert-pack magic or version does not match\nhint: " + *root_ +
                          "/bad.pack does not start as an Expert Pack (it starts as a file that starts with "
                          "\"GGMXMOEPACKv1\\x00\\x00\\x00\"): a damaged header is rewritten from the shards' layout "
                          "by `k3pack build --restart` (or `k3pack pack --repair-damaged`); if it is no pack, pass the "
                          "pack file `k3pack build` writes (<prefix>.expert-major.pack beside the shards, or its --pack)");
  b = *good_;
  PutU32(b, 16, 2);
  EXPECT_EQ(Check(b), "GGML expert-pack magic or version does not match");
  b = *good_;
  PutU32(b, 20, 41);
  EXPECT_EQ(Check(b), "GGML expert-pack header size does not match");
  b = *good_;
  PutU64(b, 24, N() + 1);
  EXPECT_EQ(Check(b), "GGML expert-pack has " + std::to_string(N() + 1) + " entries; expected " + std::to_string(N()));
  b = *good_;
  PutU64(b, 32, GetU64(b, 32) + 8);
  EXPECT_EQ(Check(b), "GGML expert-pack data_start is invalid or unaligned");
  b = *good_;
  PutU64(b, 32, 0);
  EXPECT_EQ(Check(b), "GGML expert-pack data_start is invalid or unaligned");
  // Cut inside the index: SGLang's entry checks run first, and entry 0's
  // payload (at data_start, past the end) is out of range; "truncated" is in
  // the hint. Only a file cut inside entry 0 gets the truncation text.
  for (uint64_t cut : {40 + N() * 152 - 1, uint64_t{40 + 152}}) {
    const std::string e = Check(good_->substr(0, cut));
    EXPECT_EQ(e.substr(0, e.find('\n')), "expert-pack entry 0 overlaps or is out of range") << cut;
    EXPECT_NE(e.find("hint: the pack is truncated inside its index: the file is " + std::to_string(cut) + " bytes"),
              std::string::npos)
        << e;
  }
  std::string cut_entry = good_->substr(0, 40 + 152 * 3);
  cut_entry[Entry(0) + 1] = 'X';  // entry 0's other checks still come before its range check
  const std::string named = Check(cut_entry);
  EXPECT_EQ(named.substr(0, named.find('\n')), "invalid expert tensor name: 'bXk.1.ffn_up_exps.weight'");
  const std::string e = Check(good_->substr(0, 40 + 100));
  EXPECT_EQ(e.substr(0, e.find('\n')), "GGML expert-pack index is truncated");
}

TEST_F(PackValidate, EntryErrors) {
  std::string b = *good_;
  PutU32(b, Entry(5) + 132, 1);
  EXPECT_EQ(Check(b), "GGML expert-pack reserved entry field must be zero");
  b = *good_;
  b[Entry(4) + 1] = static_cast<char>(0xFF);
  EXPECT_EQ(Check(b), "expert-pack tensor name is not valid UTF-8");
  b = *good_;
  std::memcpy(&b[Entry(3)], "blk.1.ffn_xx", 12);  // entry 3 is blk.1.ffn_up_exps.weight
  EXPECT_EQ(Check(b), "invalid expert tensor name: 'blk.1.ffn_xx_exps.weight'");
  const uint32_t l0 = model_->experts.layers[0];
  b = *good_;
  std::swap_ranges(&b[Entry(0)], &b[Entry(0)] + 128, &b[Entry(1)]);
  EXPECT_EQ(Check(b), "GGML expert-pack is not complete expert-major up/gate/down layout at index 0: expected=(" +
                          std::to_string(l0) + ", 'up', 0), actual=(" + std::to_string(l0) + ", 'gate', 0)");
  // A layer past 32 bits is shown as Python's int shows it, not cut.
  b = *good_;
  const std::string far = "blk.4294967297.ffn_up_exps.weight";
  std::memset(&b[Entry(0)], 0, 128);
  std::memcpy(&b[Entry(0)], far.data(), far.size());
  EXPECT_EQ(Check(b), "GGML expert-pack is not complete expert-major up/gate/down layout at index 0: expected=(" +
                          std::to_string(l0) + ", 'up', 0), actual=(4294967297, 'up', 0)");
  // So is one past 64 bits: SGLang's regex matches it and int() holds it
  // (here it was "invalid expert tensor name", the name taken as no match).
  for (const std::string huge : {"18446744073709551615", "018446744073709551616", "99999999999999999999999"}) {
    b = *good_;
    const std::string name = "blk." + huge + ".ffn_up_exps.weight";
    std::memset(&b[Entry(0)], 0, 128);
    std::memcpy(&b[Entry(0)], name.data(), name.size());
    EXPECT_EQ(Check(b), "GGML expert-pack is not complete expert-major up/gate/down layout at index 0: expected=(" +
                            std::to_string(l0) + ", 'up', 0), actual=(" + huge.substr(huge[0] == '0') + ", 'up', 0)");
  }
  b = *good_;
  PutU32(b, Entry(3) + 128, 5);
  EXPECT_EQ(Check(b), "GGML expert-pack is not complete expert-major up/gate/down layout at index 3: expected=(" +
                          std::to_string(l0) + ", 'up', 1), actual=(" + std::to_string(l0) + ", 'up', 5)");
  b = *good_;
  const uint64_t nb2 = GetU64(b, Entry(2) + 144);
  PutU64(b, Entry(2) + 144, nb2 + 1);
  EXPECT_EQ(Check(b), "expert-pack byte size mismatch for index 2: " + std::to_string(nb2 + 1) + " != " +
                          std::to_string(nb2));
  b = *good_;
  PutU64(b, Entry(3) + 136, GetU64(b, Entry(3) + 136) + 16);
  EXPECT_EQ(Check(b), "expert-pack entry 3 is not 4 KiB aligned");
  b = *good_;
  PutU64(b, Entry(3) + 136, GetU64(b, Entry(2) + 136));
  EXPECT_EQ(Check(b), "expert-pack entry 3 overlaps or is out of range");
  b = *good_;
  PutU64(b, Entry(N() - 1) + 136, (b.size() + 4096) / 4096 * 4096);
  EXPECT_EQ(Check(b), "expert-pack entry " + std::to_string(N() - 1) + " overlaps or is out of range");
}

TEST_F(PackValidate, LayoutErrors) {
  EXPECT_EQ(Check(*good_ + std::string(5, '\0')), "expert-pack has unexplained trailing bytes: 5");
  // Move the last object's down payload one page further: spans differ.
  std::string b = *good_;
  const uint64_t last = Entry(N() - 1);
  PutU64(b, last + 136, GetU64(b, last + 136) + 4096);
  b.resize(b.size() + 4096, '\0');
  EXPECT_EQ(Check(b, 0), "expert-pack object spans are not fixed size");
}

TEST_F(PackValidate, SampledPayloadMismatch) {
  std::string b = *good_;
  const uint64_t off = GetU64(b, Entry(0) + 136);
  b[off + 77] ^= 1;
  const auto& t = model_->experts.by_layer[0][0].tensor;
  EXPECT_EQ(Check(b), "expert-pack payload does not match GGUF source for " + t.name + " expert 0");
  EXPECT_EQ(Check(b, 0), "OK");  // structure alone cannot see it
}

// --full: any single flipped byte, including in entries no sample touches.
TEST_F(PackValidate, FullVerifyFindsEveryFlippedByte) {
  const std::string p = *root_ + "/flip.pack";
  std::filesystem::copy_file(DigestsPathFor(*good_path_), DigestsPathFor(p),
                             std::filesystem::copy_options::overwrite_existing);
  const auto samples = SampleIndices(N(), 6);
  uint64_t victim = 1;
  while (std::find(samples.begin(), samples.end(), victim) != samples.end()) ++victim;
  for (uint64_t entry : {victim, N() / 2 + 1, N() - 2}) {
    std::string b = *good_;
    const uint64_t off = GetU64(b, Entry(entry) + 136), nb = GetU64(b, Entry(entry) + 144);
    b[off + (entry * 7919) % nb] ^= 0x10;
    WriteAll(p, b);
    if (std::find(samples.begin(), samples.end(), entry) == samples.end()) {
      EXPECT_TRUE(ValidatePack(p, model_->experts).ok()) << "sampled validation cannot see entry " << entry;
    }
    VerifyOptions vo;
    auto r = VerifyPayloads(p, model_->experts, vo);
    ASSERT_FALSE(r.ok()) << entry;
    EXPECT_NE(r.error().message().find("does not match digest sidecar"), std::string::npos);
    EXPECT_NE(r.error().message().find("(entry " + std::to_string(entry) + ","), std::string::npos)
        << r.error().message();
    vo.against_digests = false;
    vo.against_source = true;
    auto s = VerifyPayloads(p, model_->experts, vo);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message().find("does not match GGUF source"), std::string::npos);
  }
  VerifyOptions both;
  both.against_source = true;
  auto ok = VerifyPayloads(*good_path_, model_->experts, both);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ok->entries_checked, N());
  EXPECT_GT(ok->MBps(), 0);
}

TEST_F(PackValidate, DigestSidecarDamageDetected) {
  const std::string p = *root_ + "/dig.pack";
  WriteAll(p, *good_);
  std::string d = ReadAll(DigestsPathFor(*good_path_));
  d[200] ^= 1;
  WriteAll(DigestsPathFor(p), d);
  auto r = VerifyPayloads(p, model_->experts, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("records checksum mismatch"), std::string::npos) << r.error().message();
}

// A source shard that ends inside a payload the compare reads (cut after the
// shard set was read): verify names the shard and where it ended; validate
// keeps SGLang's text, whose condition is "compare fails or is short", and
// says the same in its hint. Before, both read as a payload that differs.
TEST(PackSourceShortRead, IsNamedNotReportedAsADifferentPayload) {
  const std::string root = testing::TempDir("short-source");
  Model m = testing::MakeModel(root + "/model", 5);
  BuildOptions bo;
  bo.out_path = root + "/m.pack";
  bo.safety_margin_gib = 0;
  auto built = BuildPack(m.experts, bo);
  ASSERT_TRUE(built.ok()) << built.error().message();
  // The expert tensor whose bytes come last in the last shard: its last expert is cut in half.
  const ExpertTensor* last = nullptr;
  for (const auto& row : m.experts.by_layer)
    for (const ExpertTensor& t : row)
      if (!last || std::pair(t.tensor.shard_index, t.tensor.data_offset) >
                       std::pair(last->tensor.shard_index, last->tensor.data_offset))
        last = &t;
  ASSERT_NE(last, nullptr);
  const uint32_t expert = m.experts.num_experts - 1;
  const uint64_t start = last->tensor.data_offset + expert * last->expert_bytes;
  const uint64_t cut = start + last->expert_bytes / 2;
  std::filesystem::resize_file(last->shard_path, cut);
  const std::string where = "short read of " + last->shard_path + " at offset " + std::to_string(cut) + "; " +
                            std::to_string(last->expert_bytes - last->expert_bytes / 2) + " bytes remain";
  const std::string what = last->tensor.name + " expert " + std::to_string(expert);

  VerifyOptions vo;
  vo.against_digests = false;
  vo.against_source = true;
  auto v = VerifyPayloads(bo.out_path, m.experts, vo);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().kind(), ErrorKind::kEOF);
  EXPECT_EQ(v.error().message(), "comparing " + what + " with its GGUF source: " + where);

  ValidateOptions o;
  o.payload_samples = 1 << 20;  // every entry
  auto r = ValidatePack(bo.out_path, m.experts, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kValue);
  EXPECT_EQ(r.error().headline(), "expert-pack payload does not match GGUF source for " + what);
  EXPECT_EQ(r.error().hint(), where);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace k3pack::pack
