// A kimi-k3 rank pack's manifest carries the k3pack extension (for its ep
// record) without being a scaled-profile manifest.
#include <gtest/gtest.h>

#include "k3pack/manifest.h"

namespace k3pack::manifest {
namespace {

TEST(ManifestProfile, KimiRankPackExtensionIsNotTheScaledProfile) {
  Manifest m;
  EXPECT_EQ(m.profile(), kimi::Profile::kKimiK3);
  K3packExtension ext;
  ext.profile = std::string(kKimiProfileName);
  ext.ep = EpRecord{4, 2, 448, 672};
  m.k3pack = ext;
  EXPECT_EQ(m.profile(), kimi::Profile::kKimiK3);
  m.k3pack->profile = std::string(kScaledProfileName);
  EXPECT_EQ(m.profile(), kimi::Profile::kScaled);
}

}  // namespace
}  // namespace k3pack::manifest
