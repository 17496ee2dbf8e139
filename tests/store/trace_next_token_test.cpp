// `trace gen --predict-next-token`: predicted ids of the same layer at each
// row's next token (trace format v2, flag bit 3), with the generator's
// accuracy model; and the CLI around them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "../scratch_dir.h"
#include "small_family.h"
#include "k3pack/trace.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing_cli::Cli;
using testing_cli::CliRun;

using testing_traces::kSmallFamilyArgs;
using testing_traces::SmallFamily;

TEST(TraceNextToken, PredictsTheSameLayerAtTheRequestsNextToken) {
  for (const char* f : {"kimi", "interleaved", "batched", "prefill-burst"}) {
    trace::GenOptions o = SmallFamily(f);
    o.predict = true;
    o.predict_accuracy = 0.8;
    auto plain = trace::Generate(o);
    o.predict_next_token = true;
    auto t = trace::Generate(o);
    ASSERT_TRUE(plain.ok() && t.ok()) << f;
    // Their own random stream: routes and next-layer predictions unchanged.
    EXPECT_EQ(t->ids, plain->ids) << f;
    EXPECT_EQ(t->predictions, plain->predictions) << f;
    EXPECT_EQ(t->row_requests, plain->row_requests) << f;
    EXPECT_TRUE(plain->token_predictions.empty()) << f;
    ASSERT_EQ(t->version(), 2u);
    // Walk rows in call order; a row's predictions are judged against the
    // next row of the same request at the same layer.
    std::map<std::pair<uint32_t, uint32_t>, std::pair<size_t, uint32_t>> last;  // (request, layer) -> (record, row)
    uint64_t right = 0, total = 0;
    for (size_t i = 0; i < t->records.size(); ++i) {
      const auto& r = t->records[i];
      ASSERT_TRUE(r.has_token_predictions) << f << " record " << i;
      auto ids = t->RecordIds(r);
      for (uint32_t row = 0; row < r.rows; ++row) {
        auto key = std::make_pair(t->RowRequest(r, row), r.layer);
        if (auto it = last.find(key); it != last.end()) {
          auto guess = t->RecordTokenPredictions(t->records[it->second.first]).subspan(it->second.second * 4, 4);
          for (uint32_t j = 0; j < 4; ++j) {
            right += std::find(guess.begin(), guess.end(), ids[row * 4 + j]) != guess.end();
            ++total;
          }
        }
        last[key] = {i, row};
      }
    }
    EXPECT_NEAR(double(right) / double(total), 0.8, 0.03) << f;
    for (uint16_t e : t->token_predictions) EXPECT_LT(e, 64u);
  }
}

TEST(TraceNextToken, WithoutNextLayerPredictionsAndFileRoundTrip) {
  trace::GenOptions o = SmallFamily("kimi");
  o.predict_next_token = true;
  auto t = trace::Generate(o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->predict_k, 4u);
  EXPECT_TRUE(t->predictions.empty());
  std::string path = (std::filesystem::path(testing_scratch::ProcessScratchDir("k3-next-token")) / "t.k3trace").string();
  ASSERT_TRUE(trace::WriteTrace(path, *t).ok());
  auto back = trace::ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->token_predictions, t->token_predictions);
  EXPECT_EQ(back->ids, t->ids);
  for (size_t i = 0; i < t->records.size(); ++i) {
    EXPECT_TRUE(back->records[i].has_token_predictions);
    EXPECT_FALSE(back->records[i].has_predictions);
  }
  // A trace using no v2 field is still written as v1.
  o.predict_next_token = false;
  EXPECT_EQ(trace::Generate(o)->version(), 1u);
}

TEST(TraceNextTokenCli, GenSweepAndErrors) {
  std::string dir = testing::TinyPack::TempDir("next-token");
  const std::string plain = dir + "/p.k3trace", next = dir + "/n.k3trace";
  CliRun g = Cli("trace gen --predict --json --trace " + plain + kSmallFamilyArgs);
  ASSERT_EQ(g.code, 0) << g.out;
  // Same routes, new predictions: not "the same trace already there" (it was, before SameTrace compared them).
  CliRun again = Cli("trace gen --predict --predict-next-token --trace " + plain + kSmallFamilyArgs);
  EXPECT_NE(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("it is not this trace"), std::string::npos) << again.out;
  CliRun n = Cli("trace gen --predict --predict-next-token --json --trace " + next + kSmallFamilyArgs);
  ASSERT_EQ(n.code, 0) << n.out;
  EXPECT_EQ(nlohmann::json::parse(n.out)["version"], 2);

  CliRun s = Cli("trace sweep --timing --horizon token --json --policies lru --sizes 64 --trace " + next +
                 " --object-bytes 1000000");
  ASSERT_EQ(s.code, 0) << s.out;
  auto j = nlohmann::json::parse(s.out);
  EXPECT_EQ(j["horizon"], "token");
  ASSERT_EQ(j["timing"].size(), 3u);
  EXPECT_GT(j["timing"][1]["prefetch_useful_bytes"].get<double>(), 0);
  // --keep-predicted: a keep row per policy, the prefetch row steered too.
  CliRun k = Cli("trace sweep --timing --horizon token --keep-predicted --json --policies lru --sizes 64 --trace " +
                 next + " --object-bytes 1000000");
  ASSERT_EQ(k.code, 0) << k.out;
  auto kj = nlohmann::json::parse(k.out);
  EXPECT_EQ(kj["keep_predicted"], true);
  ASSERT_EQ(kj["timing"].size(), 4u);
  std::vector<std::pair<bool, bool>> prefetch_keep;
  for (const auto& row : kj["timing"]) prefetch_keep.push_back({row["prefetch"], row["keep_predicted"]});
  EXPECT_EQ(prefetch_keep, (std::vector<std::pair<bool, bool>>{{false, false}, {false, true}, {true, true},
                                                               {true, false}}));  // no, keep, yes+keep, belady
  EXPECT_EQ(kj["timing"][1]["prefetch_bytes"], 0);
  CliRun kt = Cli("trace sweep --timing --horizon token --keep-predicted --policies lru --sizes 64 --trace " + next +
                  " --object-bytes 1000000");
  ASSERT_EQ(kt.code, 0) << kt.out;
  EXPECT_NE(kt.out.find(" keep "), std::string::npos) << kt.out;
  EXPECT_NE(kt.out.find("yes+keep"), std::string::npos) << kt.out;
  EXPECT_NE(kt.out.find("predictions steer eviction"), std::string::npos) << kt.out;
  CliRun gen = Cli("trace sweep --timing --horizon token --family kimi --policies lru --sizes 64" + kSmallFamilyArgs);
  ASSERT_EQ(gen.code, 0) << gen.out;
  EXPECT_NE(gen.out.find("prefetch horizon: next token"), std::string::npos) << gen.out;

  CliRun none = Cli("trace sweep --timing --horizon token --policies lru --sizes 64 --trace " + plain);
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find(plain + ": the trace has no next-token predictions"), std::string::npos) << none.out;
  CliRun bad = Cli("trace sweep --timing --horizon step --trace " + next);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--horizon must be layer, token or both, got 'step'"), std::string::npos) << bad.out;
  // both: reads one layer ahead, hints from the next token; it needs the
  // hints (without them it would be the layer replay under another name)
  // and the next-token predictions.
  CliRun both = Cli("trace sweep --timing --horizon both --keep-predicted --json --policies lru --sizes 64 --trace " +
                    next + " --object-bytes 1000000");
  ASSERT_EQ(both.code, 0) << both.out;
  auto bj = nlohmann::json::parse(both.out);
  EXPECT_EQ(bj["horizon"], "both");
  ASSERT_EQ(bj["timing"].size(), 4u);
  EXPECT_GT(bj["timing"][2]["prefetch_bytes"].get<double>(), 0);
  CliRun bare = Cli("trace sweep --timing --horizon both --policies lru --sizes 64 --trace " + next);
  EXPECT_EQ(bare.code, 2) << bare.out;
  EXPECT_NE(bare.out.find("--horizon both needs --keep-predicted"), std::string::npos) << bare.out;
  CliRun plain_both = Cli("trace sweep --timing --horizon both --keep-predicted --policies lru --sizes 64 --trace " +
                          plain);
  EXPECT_EQ(plain_both.code, 1) << plain_both.out;
  EXPECT_NE(plain_both.out.find("which --horizon both replays"), std::string::npos) << plain_both.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::store
