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
  EXPECT_NE(bad_size.message().find("--ep-size 3 does not divide the 896"), std::string::npos);
  const Status bad_rank = CheckRank({4, 4}, 896);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.message().find("--ep-rank 4 is out of range for --ep-size 4"), std::string::npos);
  EXPECT_FALSE(CheckRank({0, 0}, 896).ok());
  EXPECT_EQ(Describe({4, 2}, 896), "rank 2 of 4 (experts 448..671)");
}

}  // namespace
}  // namespace k3pack::ep
