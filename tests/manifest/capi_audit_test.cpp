// Faults a C++ integrator's audit of include/k3pack/manifest.h found
// (docs/RELIABILITY.md, "Faults from a C++ integrator's audit (session 15)").
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"

namespace k3pack::manifest {
namespace {

// ManifestSummary called json::value("format", ...), which throws
// nlohmann::json::type_error out of the library for a document that is not
// an object or whose format is not a string.
TEST(CppIntegratorAudit, ManifestSummaryOfAnyJsonNeverThrows) {
  using nlohmann::json;
  for (const json& doc : {json(), json(5), json::array({1, 2}), json("s"), json::object(), json{{"format", 7}},
                          json{{"format", "F"}, {"expert_pack", {{"top_k", 16}}}}}) {
    SCOPED_TRACE(doc.dump());
    json summary;
    ASSERT_NO_THROW(summary = ManifestSummary("m.json", doc));
    EXPECT_EQ(summary["manifest"], "m.json");
    const bool has_format = doc.is_object() && doc.contains("format");
    EXPECT_EQ(summary["format"], has_format ? doc["format"] : json(""));
    EXPECT_EQ(summary["top_k"], doc.is_object() && doc.contains("expert_pack") ? json(16) : json(nullptr));
  }
}

}  // namespace
}  // namespace k3pack::manifest
