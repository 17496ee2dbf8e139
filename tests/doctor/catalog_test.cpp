// The catalog and the documentation list the same diagnoses.
#include <fstream>
#include <set>

#include "doctor_test_util.h"

namespace dtest {
namespace {

TEST(Catalog, CodesAreUniqueCompleteAndDocumented) {
  const std::string doc = ReadAll(fs::path(K3PACK_SOURCE_DIR) / "docs/doctor.md");
  ASSERT_FALSE(doc.empty());
  std::set<std::string> codes;
  for (const doctor::Diagnosis& d : doctor::Catalog()) {
    EXPECT_TRUE(codes.insert(d.code).second) << "duplicate " << d.code;
    EXPECT_NE(doc.find(std::string("| `") + d.code + "` |"), std::string::npos) << d.code << " not in docs/doctor.md";
    EXPECT_GT(std::string(d.meaning).size(), 20u) << d.code;
    EXPECT_GT(std::string(d.fix).size(), 10u) << d.code;
    EXPECT_EQ(doctor::FindDiagnosis(d.code), &d);
  }
  EXPECT_EQ(doctor::FindDiagnosis("no-such-code"), nullptr);
}

}  // namespace
}  // namespace dtest
