// LoadOptions::copy: the same tensors as the zero-copy stream, each in a
// fresh, writable buffer of its own that was read with pread (no mapping).
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "loader_fixture.h"
#include "util/file.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

std::vector<float> Ramp(size_t n, float base, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

// Every kind of output once: plain, qweight (+ type scalar), BF16, A_log and
// the residual pair (a projection view and a computed norm of one source).
std::vector<gguf::TensorSpec> CopyModel() {
  std::vector<gguf::TensorSpec> t;
  t.push_back(Typed("token_embd.weight", GgmlType::Q8_0, {32, 8}, 1));
  t.push_back(F32Tensor("blk.0.attn_norm.weight", {32}, Ramp(32, 1.0f, 0.01f)));
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, Ramp(4, -2.0f, 0.25f)));
  t.push_back(F32Tensor("blk.0.attn_res_score.weight", {32}, Ramp(32, -0.5f, 0.03f)));
  t.push_back(Typed("blk.0.ffn_down.weight", GgmlType::BF16, {32, 8}, 5));
  t.push_back(Typed("blk.1.ffn_gate_exps.weight", GgmlType::Q2_K, {256, 4, 4}, 3));
  t.push_back(Typed("output.weight", GgmlType::Q8_0, {32, 8}, 4));
  return t;
}

std::vector<NamedTensor> DrainWith(const std::string& manifest, LoadOptions o, LoadStats* stats = nullptr) {
  auto s = NonExpertStream::Open(manifest, o);
  EXPECT_TRUE(s.ok());
  std::optional<Error> err;
  auto out = Drain(*s, &err);
  EXPECT_FALSE(err) << err->message();
  if (stats) *stats = s->stats();
  return out;
}

TEST(StreamCopy, SameTensorsInOwnWritableBuffers) {
  TempDir dir("copy");
  const std::string manifest = WriteModel(dir.path, CopyModel(), {0, 0, 0, 0, 1, 1, 1});
  for (bool compat : {false, true}) {
    SCOPED_TRACE(compat ? "sglang_compat" : "default");
    LoadOptions o;
    o.sglang_compat = compat;
    const auto views = DrainWith(manifest, o);
    o.copy = true;
    LoadStats stats;
    auto copies = DrainWith(manifest, o, &stats);
    ASSERT_EQ(views.size(), copies.size());
    uint64_t handed_from_file = 0;
    std::set<const uint8_t*> buffers;
    for (size_t i = 0; i < views.size(); ++i) {
      const NamedTensor& v = views[i];
      const NamedTensor& c = copies[i];
      SCOPED_TRACE(v.name);
      EXPECT_EQ(c.name, v.name);
      EXPECT_EQ(c.kind, v.kind);
      EXPECT_EQ(c.dtype, v.dtype);
      EXPECT_EQ(c.shape, v.shape);
      ASSERT_EQ(c.data.size(), v.data.size());
      EXPECT_EQ(0, std::memcmp(c.data.data(), v.data.data(), v.data.size()));
      EXPECT_FALSE(c.zero_copy);
      EXPECT_TRUE(c.writable);
      ASSERT_NE(c.owner, nullptr);
      EXPECT_TRUE(buffers.insert(c.data.data()).second) << "buffer shared with another tensor";
      if (v.zero_copy) handed_from_file += v.data.size();
    }
    // Every stored byte handed out was read into a buffer; the residual
    // projection and its computed norm share one read.
    EXPECT_GE(stats.copied_bytes, handed_from_file);
    EXPECT_EQ(stats.zero_copy_tensors, 0u);
    // A buffer is the caller's: writing into one changes no other tensor.
    for (auto& c : copies) std::memset(const_cast<uint8_t*>(c.data.data()), 0xEE, c.data.size());
    const auto again = DrainWith(manifest, o);
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(again[i].data.data(), views[i].data.data(), views[i].data.size())) << views[i].name;
    }
  }
}

TEST(StreamCopy, BuffersOutliveTheStream) {
  TempDir dir("copy-life");
  const std::string manifest = WriteModel(dir.path, CopyModel(), {0, 0, 0, 0, 1, 1, 1});
  LoadOptions o;
  o.copy = true;
  std::vector<NamedTensor> copies;
  {
    auto s = NonExpertStream::Open(manifest, o);
    ASSERT_TRUE(s.ok());
    copies = Drain(*s);
  }
  const auto views = DrainWith(manifest, {});
  ASSERT_EQ(copies.size(), views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(copies[i].data.data(), views[i].data.data(), views[i].data.size())) << views[i].name;
  }
}

// Copy mode zero-fills the holes of a sparse shard instead of reading them:
// the bytes must be exactly what a read (or the mapping) gives, zeros in the
// holes and the file's bytes around them, for holes inside, at the start
// and at the end of a tensor.
TEST(StreamCopy, HolesOfASparseShardReadAsZeros) {
  TempDir dir("copy-holes");
  std::vector<gguf::TensorSpec> t;
  t.push_back(Typed("token_embd.weight", GgmlType::Q8_0, {4096, 96}, 9));  // 417,792 bytes
  t.push_back(F32Tensor("blk.0.attn_norm.weight", {32}, Ramp(32, 1.0f, 0.01f)));
  json m;
  std::vector<std::string> shards;
  const std::string manifest = WriteModel(dir.path, t, {0, 0}, &m, &shards);
  uint64_t off = 0, n = 0;
  for (const auto& r : m["source"]["tensors"]) {
    if (r["name"] == "token_embd.weight") {
      off = r["data_offset"];  // absolute in the shard file
      n = r["nbytes"];
    }
  }
  const uint64_t block = 4096, first = (off + block - 1) / block * block;
  LoadOptions o;
  o.copy = true;
  LoadStats dense;
  (void)DrainWith(manifest, o, &dense);
  int fd = ::open(shards[0].c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  // Three holes: the tensor's first whole block, two blocks in the middle,
  // and its last whole block.
  const std::vector<std::pair<uint64_t, uint64_t>> holes = {
      {first, block}, {first + 20 * block, 2 * block}, {(off + n) / block * block - block, block}};
  for (auto [a, len] : holes) {
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(a), static_cast<off_t>(len)) != 0) {
      ::close(fd);
      GTEST_SKIP() << "this filesystem cannot punch holes";
    }
  }
  const bool has_hole = [&] {
    for (const Segment& s : MapRange(fd, off, n)) {
      if (s.hole) return true;
    }
    return false;
  }();
  ::close(fd);
  if (!has_hole) GTEST_SKIP() << "this filesystem does not report holes (SEEK_HOLE)";

  const auto views = DrainWith(manifest, {});
  LoadStats stats;
  const auto copies = DrainWith(manifest, o, &stats);
  ASSERT_EQ(views.size(), copies.size());
  // "read with pread" counts what was read: the holes' 4 blocks were not.
  EXPECT_EQ(stats.copied_bytes, dense.copied_bytes - 4 * block);
  bool saw_zero_block = false;
  for (size_t i = 0; i < views.size(); ++i) {
    ASSERT_EQ(copies[i].data.size(), views[i].data.size());
    EXPECT_EQ(0, std::memcmp(copies[i].data.data(), views[i].data.data(), views[i].data.size())) << views[i].name;
    if (views[i].data.size() == n) {
      const uint8_t* p = copies[i].data.data() + (first + 20 * block - off);
      saw_zero_block = std::all_of(p, p + 2 * block, [](uint8_t b) { return b == 0; }) &&
                       !std::all_of(p - block, p, [](uint8_t b) { return b == 0; });
    }
  }
  EXPECT_TRUE(saw_zero_block) << "the middle hole should read as zeros between data";

}

// populate only changes how pages come in (MADV_POPULATE_READ): the same
// zero-copy views as the default stream.
TEST(StreamPopulate, SameViewsAsDefault) {
  TempDir dir("populate");
  const std::string manifest = WriteModel(dir.path, CopyModel(), {0, 0, 0, 0, 1, 1, 1});
  LoadOptions o;
  o.populate = true;
  const auto got = DrainWith(manifest, o);
  const auto want = DrainWith(manifest, {});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].zero_copy, want[i].zero_copy) << want[i].name;
    ASSERT_EQ(got[i].data.size(), want[i].data.size());
    EXPECT_EQ(0, std::memcmp(got[i].data.data(), want[i].data.data(), want[i].data.size())) << want[i].name;
  }
}

}  // namespace
}  // namespace k3pack::loader
