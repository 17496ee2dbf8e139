// Trace generator and file format.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../scratch_dir.h"
#include "k3pack/trace.h"
#include "store/simulate.h"
#include "util/file.h"

namespace k3pack::trace {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(testing_scratch::ProcessScratchDir("k3-trace-test")) / name).string();
}

GenOptions Small() {
  GenOptions o;
  o.layer_ids = {1, 2, 3};
  o.num_experts = 128;
  o.top_k = 8;
  o.requests = 2;
  o.prompt_tokens = 5;
  o.decode_tokens = 40;
  return o;
}

TEST(Trace, GenerateShapeAndDeterminism) {
  auto a = Generate(Small());
  auto b = Generate(Small());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ids, b->ids);
  EXPECT_EQ(a->records.size(), 2u * (5 + 40) * 3);
  for (const Record& r : a->records) {
    auto ids = a->RecordIds(r);
    std::vector<uint16_t> v(ids.begin(), ids.end());
    std::sort(v.begin(), v.end());
    EXPECT_EQ(std::unique(v.begin(), v.end()), v.end()) << "top-k ids of one token must be distinct";
    for (uint16_t e : v) EXPECT_LT(e, 128);
  }
  GenOptions o = Small();
  o.seed = 2;
  EXPECT_NE(Generate(o)->ids, a->ids);
}

TEST(Trace, PrefillChunksBecomeMultiRowRecords) {
  GenOptions o = Small();
  o.prefill_chunk = 4;
  auto t = Generate(o);
  ASSERT_TRUE(t.ok());
  // 5 prompt tokens -> chunks of 4 and 1, per layer, per request.
  EXPECT_EQ(t->records[0].rows, 4u);
  EXPECT_TRUE(t->records[0].is_prefill);
  EXPECT_EQ(t->records[3].rows, 1u);
  EXPECT_FALSE(t->records.back().is_prefill);
}

TEST(Trace, ReuseKnobIsWhatTheTraceShows) {
  GenOptions o = Small();
  o.num_experts = 896;
  o.top_k = 16;
  o.request_skew = 0;
  o.decode_tokens = 300;
  for (double reuse : {0.0, 0.3, 0.7}) {
    o.reuse = reuse;
    auto t = Generate(o);
    ASSERT_TRUE(t.ok());
    // Flat fresh draws add ~16/896 of chance overlap.
    EXPECT_NEAR(MeasuredReuse(*t).value_or(-1), reuse, 0.05) << reuse;
  }
}

TEST(Trace, FileRoundTrip) {
  auto t = Generate(Small());
  ASSERT_TRUE(t.ok());
  std::string path = TempPath("a.k3trace");
  ASSERT_TRUE(WriteTrace(path, *t).ok());
  auto back = ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->ids, t->ids);
  EXPECT_EQ(back->layer_ids, t->layer_ids);
  ASSERT_EQ(back->records.size(), t->records.size());
  for (size_t i = 0; i < t->records.size(); ++i) {
    EXPECT_EQ(back->records[i].layer, t->records[i].layer);
    EXPECT_EQ(back->records[i].rows, t->records[i].rows);
    EXPECT_EQ(back->records[i].request, t->records[i].request);
    EXPECT_EQ(back->records[i].is_prefill, t->records[i].is_prefill);
  }
}

TEST(Trace, CorruptFilesAreRejected) {
  auto t = Generate(Small());
  std::string path = TempPath("b.k3trace");
  ASSERT_TRUE(WriteTrace(path, *t).ok());
  std::string bytes = *ReadFileToString(path);
  ASSERT_TRUE(WriteFileAtomic(path, bytes.substr(0, bytes.size() - 3)).ok());
  auto r = ReadTrace(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("truncated"), std::string::npos) << r.error().message();
  ASSERT_TRUE(WriteFileAtomic(path, "K3TRACEX" + bytes.substr(8)).ok());
  EXPECT_FALSE(ReadTrace(path).ok());
}

// Found by trace_fuzz (input fuzz/corpus/trace/regression-expert-id-out-of-range):
// an expert id >= num_experts was accepted, and every consumer indexes
// per-expert tables with it.
TEST(Trace, ExpertIdOutOfRangeIsRejected) {
  const std::string regression =
      std::string(K3PACK_SOURCE_DIR) + "/fuzz/corpus/trace/regression-expert-id-out-of-range";
  auto r = ReadTrace(regression);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("expert id 65535 at record "), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("is not below 16 experts"), std::string::npos) << r.error().message();

  auto t = Generate(Small());
  ASSERT_TRUE(t.ok());
  t->ids[t->ids.size() / 2] = static_cast<uint16_t>(t->num_experts);  // the first id out of range
  std::string path = TempPath("c.k3trace");
  ASSERT_TRUE(WriteTrace(path, *t).ok());
  auto s = ReadTrace(path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("expert id 128 at record "), std::string::npos) << s.error().message();
}

// A v1 file written byte by byte, as a script outside k3pack would write one.
struct HandTrace {
  std::string bytes;
  template <typename T>
  HandTrace& Put(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  HandTrace(uint32_t experts, uint32_t top_k, std::vector<uint32_t> layers, uint64_t records) {
    bytes = std::string("K3TRACE\0", 8);
    Put<uint32_t>(1).Put(experts).Put(top_k).Put<uint32_t>(static_cast<uint32_t>(layers.size())).Put(records);
    for (uint32_t l : layers) Put(l);
  }
  HandTrace& Record(uint32_t layer, uint32_t rows, std::vector<uint16_t> ids) {
    Put(layer).Put(rows).Put<uint32_t>(0).Put<uint32_t>(0);
    for (uint16_t e : ids) Put(e);
    return *this;
  }
};

// The error's first line (a hint may follow).
std::string ParseError(const HandTrace& h) {
  auto r = ParseTrace(h.bytes, "hand.k3trace");
  return r.ok() ? std::string("(accepted)") : r.error().headline();
}

// Session 14's trace audit: hand-written files that break a rule got a
// crash (std::length_error: rows x top_k x 2 wrapped past the size check
// when top_k exceeded num_experts), the wrong rule ("truncated ids" for a
// record of 0 rows) or no file name (a record's layer outside the header's
// list was only caught later, as "trace record 0: layer 7 ...").
TEST(Trace, HandWrittenFilesAreRejectedByRule) {
  // rows x top_k = 2^63 + 2: the byte count, times 2, wraps to 4.
  HandTrace wrap(16, 2147549185u, {1}, 1);
  wrap.Put<uint32_t>(1).Put<uint32_t>(4294836226u).Put<uint32_t>(0).Put<uint32_t>(0).bytes += std::string(4, '\0');
  EXPECT_EQ(ParseError(wrap), "hand.k3trace: not a k3pack trace: top_k 2147549185 exceeds 16 experts");
  EXPECT_EQ(ParseError(HandTrace(16, 17, {1}, 0)), "hand.k3trace: not a k3pack trace: top_k 17 exceeds 16 experts");
  EXPECT_EQ(ParseError(HandTrace(16, 2, {1}, 1).Record(1, 0, {})),
            "hand.k3trace: not a k3pack trace: 0 rows at record 0 (a call routes at least one token)");
  EXPECT_EQ(ParseError(HandTrace(16, 2, {1, 2}, 2).Record(1, 1, {0, 1}).Record(7, 1, {0, 1})),
            "hand.k3trace: not a k3pack trace: layer 7 at record 1 is not in the header's layer list");
  EXPECT_EQ(ParseError(HandTrace(16, 2, {}, 1).Record(1, 1, {0, 1})),
            "hand.k3trace: not a k3pack trace: layer 1 at record 0 is not in the header's layer list");
  EXPECT_EQ(ParseError(HandTrace(16, 2, {1}, 1).Record(1, 2, {0, 1, 2})),
            "hand.k3trace: not a k3pack trace: truncated ids at record 0: 8 bytes from offset 52, the file holds 58 "
            "(the header declares 1 records)");
  // Session 36: a repeated expert in a row (a padded or damaged top-k) was
  // read, and every consumer counted it as one route.
  EXPECT_EQ(ParseError(HandTrace(16, 2, {1}, 1).Record(1, 2, {0, 1, 3, 3})),
            "hand.k3trace: not a k3pack trace: expert id 3 at record 0 appears twice in row 1 (a row names 2 "
            "distinct experts)");
  // The same rules leave a well-formed file (and an empty one) readable; an
  // expert routed by two rows of one call is two routes, not a repeat.
  EXPECT_EQ(ParseError(HandTrace(16, 2, {1, 2}, 2).Record(1, 1, {0, 1}).Record(2, 2, {3, 4, 5, 15})), "(accepted)");
  EXPECT_EQ(ParseError(HandTrace(16, 2, {1}, 1).Record(1, 2, {0, 1, 1, 0})), "(accepted)");
  EXPECT_EQ(ParseError(HandTrace(16, 16, {1}, 0)), "(accepted)");
}

// Records carry no length: one id too many in record 0 makes record 1's
// layer field the stray id and the next. Session 38: the error blamed
// record 1 alone; its hint now says where record 1 was read from and why
// record 0 may be the one at fault.
TEST(Trace, ARecordShiftedByTheOneBeforeSaysSo) {
  HandTrace shifted(16, 2, {1}, 2);
  shifted.Record(1, 1, {0, 1, 5}).Record(1, 1, {0, 1});
  auto r = ParseTrace(shifted.bytes, "hand.k3trace");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().headline(),
            "hand.k3trace: not a k3pack trace: layer 65541 at record 1 is not in the header's layer list");
  EXPECT_EQ(r.error().hint(),
            "record 1 is read from byte 56, where record 0's ids end by its row count, top_k 2 and predict_k 0: a "
            "writer that put more or fewer ids in record 0 (a prediction list longer than predict_k) shifts every "
            "record after it");
  // Record 0 has no record before it to blame.
  EXPECT_EQ(ParseTrace(HandTrace(16, 2, {1}, 1).Record(1, 0, {}).bytes, "h").error().hint(), "");
}

// Session 14: a trace of layer 2 only (run-experts --layer 2 --trace-out)
// swept with a manifest of layers 1-3 counted 0 tokens, so every per-token
// figure read 0.
TEST(Trace, CallSeqCountsTokensAtTheTracesLowestLayer) {
  Trace t;
  t.num_experts = 8;
  t.top_k = 2;
  t.layer_ids = {1, 2, 3};
  const auto space = store::SpaceForTrace(t, 4096);  // the manifest's layers
  t.layer_ids = {2, 3};
  std::vector<uint16_t> one = {1, 2}, two = {1, 2, 3, 4};
  t.Append(2, 1, 0, false, one);
  t.Append(3, 1, 0, false, one);
  t.Append(2, 2, 0, true, two);
  t.Append(3, 2, 0, true, two);
  auto seq = store::BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok()) << seq.error().message();
  EXPECT_EQ(seq->tokens, 3u);
}

TEST(Trace, CallSeqAppliesSGLangRouteChecks) {
  Trace t;
  t.num_experts = 8;
  t.top_k = 2;
  t.layer_ids = {1, 2};
  std::vector<uint16_t> ok = {1, 1}, bad = {1, 9};
  t.Append(1, 1, 0, false, ok);
  auto space = store::SpaceForTrace(t, 4096);
  auto seq = store::BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(seq->keys.size(), 1u);  // duplicates count once
  EXPECT_EQ(seq->routes, 2u);
  t.Append(2, 1, 0, false, bad);
  auto r = store::BuildCallSeq(t, space);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("route contains an out-of-range expert id"), std::string::npos);
  Trace u = t;
  u.records.pop_back();
  u.records[0].layer = 3;
  r = store::BuildCallSeq(u, space);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("layer 3 is not an active routed MoE layer"), std::string::npos);
}

}  // namespace
}  // namespace k3pack::trace
