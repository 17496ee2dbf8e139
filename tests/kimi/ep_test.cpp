#include "k3pack/ep.h"

#include <gtest/gtest.h>

namespace k3pack::ep {
namespace {

TEST(ExpertParallel, RanksTileTheExpertsInOrder) {
  for (uint32_t size : {1u, 2u, 4u, 7u, 8u, 14u, 16u}) {
    uint32_t next = 0;
    for (uint32_t r = 0; r < size; ++r) {
      ASSERT_TRUE(CheckRank({size, r}, 896).ok());
      const ExpertRange owned = OwnedExperts({size, r}, 896);
      EXPECT_EQ(owned.first, next);
      EXPECT_EQ(owned.count(), 896 / size);
      for (uint32_t e = owned.first; e < owned.end; ++e) EXPECT_EQ(OwnerOf(e, 896, size), r);
      next = owned.end;
    }
    EXPECT_EQ(next, 896u);
  }
}

TEST(ExpertParallel, RefusesSizesThatDoNotDivideAndRanksOutOfRange) {
  const Status bad_size = CheckRank({3, 0}, 896);
  ASSERT_FALSE(bad_size.ok());
  EXPECT_EQ(bad_size.message().rfind("EP size 3 does not divide the 896", 0), 0u) << bad_size.message();
  const Status bad_rank = CheckRank({4, 4}, 896);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.message(), "EP rank 4 is out of range for EP size 4 (ranks are 0..3)");
  EXPECT_FALSE(CheckRank({0, 0}, 896).ok());
  EXPECT_EQ(Describe({4, 2}, 896), "rank 2 of 4 (experts 448..671)");
}

// Each surface names its own argument: the CLI its flags, the Python module
// its keywords; the rule and the numbers are the same.
TEST(ExpertParallel, ErrorsNameTheCallersArguments) {
  EXPECT_EQ(CheckRank({3, 0}, 896, kCliNames).message().rfind("--ep-size 3 does not divide the 896", 0), 0u);
  EXPECT_EQ(CheckRank({4, 4}, 896, kCliNames).message(),
            "--ep-rank 4 is out of range for --ep-size 4 (ranks are 0..3)");
  EXPECT_EQ(CheckRank({0, 0}, 896, kCliNames).message(), "--ep-size must be at least 1, got 0");
  const RankNames py{"ep_size", "ep_rank"};
  EXPECT_EQ(CheckRank({3, 0}, 896, py).message().rfind("ep_size 3 does not divide the 896 routed experts", 0), 0u);
  EXPECT_EQ(CheckRank({4, 4}, 896, py).message(), "ep_rank 4 is out of range for ep_size 4 (ranks are 0..3)");
  for (const RankNames& names : {RankNames{}, py})
    for (const Rank& r : {Rank{3, 0}, Rank{4, 4}, Rank{0, 0}})
      EXPECT_EQ(CheckRank(r, 896, names).message().find("--ep-"), std::string::npos)
          << CheckRank(r, 896, names).message();
}

}  // namespace
}  // namespace k3pack::ep
