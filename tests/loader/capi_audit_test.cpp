// Faults a C++ integrator's audit of include/k3pack/loader.h found
// (docs/RELIABILITY.md, "Faults from a C++ integrator's audit (session 15)").
#include <utility>
#include <vector>

#include "loader_fixture.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

// Big enough that each tensor's buffer spans whole pages.
std::vector<gguf::TensorSpec> PagesModel() {
  return {Typed("token_embd.weight", GgmlType::Q8_0, {4096, 8}, 1),
          Typed("output.weight", GgmlType::Q8_0, {4096, 8}, 4)};
}

// Using a stream after moving it (into a container, an optional, a member)
// dereferenced a null Impl: a crash instead of an error.
TEST(CppIntegratorAudit, AMovedFromStreamAnswersWithAnError) {
  TempDir dir("moved");
  const std::string manifest = WriteModel(dir.path, PagesModel(), {0, 0});
  auto s = NonExpertStream::Open(manifest);
  ASSERT_TRUE(s.ok()) << s.error().message();
  NonExpertStream moved = std::move(*s);
  auto next = s->Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().kind(), ErrorKind::kRuntime);
  EXPECT_NE(next.error().message().find("moved from"), std::string::npos) << next.error().message();
  EXPECT_FALSE(s->ForEach([](NamedTensor&&) { return Status::OK(); }).ok());
  EXPECT_EQ(s->stats().shards_total, 0u);
  EXPECT_EQ(s->manifest_path(), "");
  // The stream moved into carries on.
  EXPECT_EQ(moved.manifest_path(), manifest);
  std::optional<Error> err;
  EXPECT_EQ(Drain(moved, &err).size(), 4u);  // per Q8_0 tensor: its qweight and qweight_type
  EXPECT_FALSE(err) << err->message();
}

// ReleasePages said "the view stays valid (pages fault back in)", which
// holds only for views into a shard's mapping: on a copy-mode tensor's
// buffer MADV_DONTNEED dropped its bytes (its pages read back as zeros).
// ReleasePages(tensor) releases only what can fault back in.
TEST(CppIntegratorAudit, ReleasePagesOfATensorNeverLosesItsBytes) {
  TempDir dir("release");
  const std::string manifest = WriteModel(dir.path, PagesModel(), {0, 0});
  for (bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "copy mode" : "zero-copy");
    LoadOptions o;
    o.copy = copy;
    auto s = NonExpertStream::Open(manifest, o);
    ASSERT_TRUE(s.ok()) << s.error().message();
    std::optional<Error> err;
    size_t checked = 0;
    for (NamedTensor& t : Drain(*s, &err)) {
      if (t.data.size() < 3 * 4096) continue;
      const std::vector<uint8_t> before(t.data.begin(), t.data.end());
      ReleasePages(t);
      EXPECT_TRUE(std::equal(before.begin(), before.end(), t.data.begin())) << t.name;
      ++checked;
    }
    EXPECT_FALSE(err) << err->message();
    EXPECT_EQ(checked, 2u);
  }
}

}  // namespace
}  // namespace k3pack::loader
