// ParseJsonText's nesting limit (docs/RELIABILITY.md, "session 44"): a
// 140 KB manifest of nested arrays crashed `k3pack.read_manifest` (the
// stack overflowed in a recursive walk of the parsed tree).
#include "util/json_text.h"

#include <gtest/gtest.h>

#include <string>

namespace k3pack {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(JsonText, DocumentsUpToTheLimitParseAsNlohmannParsesThem) {
  const std::string doc = R"({"format": "x", "shards": [{"path": "a.gguf", "size": 18446744073709551615}], "f": 1.5})";
  auto j = ParseJsonText(doc);
  ASSERT_TRUE(j.ok()) << j.error().message();
  EXPECT_EQ(*j, nlohmann::json::parse(doc));
  auto deep = ParseJsonText(Nested(kMaxJsonDepth));
  ASSERT_TRUE(deep.ok()) << deep.error().message();
  EXPECT_EQ(*deep, nlohmann::json::parse(Nested(kMaxJsonDepth)));
}

TEST(JsonText, DeeperDocumentsAreRefusedBeforeTheyGrow) {
  for (const int depth : {kMaxJsonDepth + 2, 70000}) {
    auto j = ParseJsonText(Nested(depth));
    ASSERT_FALSE(j.ok()) << depth;
    EXPECT_EQ(j.error().message(), "JSON nested more than 512 levels deep");
    EXPECT_TRUE(ParseJsonOrDiscarded(Nested(depth)).is_discarded());
  }
  std::string objects;
  for (int i = 0; i < 70000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(70000, '}');
  EXPECT_FALSE(ParseJsonText(objects).ok());
}

TEST(JsonText, TextThatIsNotJsonKeepsTheParsersPosition) {
  auto j = ParseJsonText("{\"a\": }");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.error().message().find("line 1, column 7"), std::string::npos) << j.error().message();
  EXPECT_TRUE(ParseJsonOrDiscarded("{\"a\": }").is_discarded());
}

}  // namespace
}  // namespace k3pack
