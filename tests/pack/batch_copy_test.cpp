// The staged batch copy (src/pack/batch_copy.cpp): batches gathered in pack
// order and written with whole-block writes, O_DIRECT or through the page
// cache, give the spec's bytes, and a pack block is allocated exactly when
// source data lands in it (source holes stay holes, no zero block written).
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/format.h"
#include "pack_fixture.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ExpectedPack;
using testing::MakeModel;
using testing::Model;
using testing::ReadAll;
using testing::TempDir;

// Sets an environment variable for the scope (the builder reads its seams per build).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void PunchHole(const std::string& path, uint64_t off, uint64_t len) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
                        static_cast<off_t>(len)),
            0);
  ::close(fd);
}

// Pack blocks (index of 4096-byte block) that some source data byte lands in.
std::set<uint64_t> BlocksWithSourceData(const ExpertSet& ex, const PackLayout& layout) {
  std::set<uint64_t> blocks;
  for (uint32_t li = 0; li < ex.layers.size(); ++li) {
    for (uint32_t e = 0; e < ex.num_experts; ++e) {
      for (Role r : kRoleOrder) {
        const ExpertTensor& t = ex.by_layer[li][static_cast<uint32_t>(r)];
        auto fd = OpenReadOnly(ex.shard_paths[t.tensor.shard_index]);
        EXPECT_TRUE(fd.ok());
        const uint64_t src = t.tensor.data_offset + e * t.expert_bytes;
        const uint64_t dst = layout.Slot(li, e, r).offset;
        for (const Segment& s : MapRange(fd->get(), src, t.expert_bytes)) {
          if (s.hole) continue;
          const uint64_t a = dst + (s.offset - src), z = a + s.length;
          for (uint64_t b = a / 4096; b * 4096 < z; ++b) blocks.insert(b);
        }
      }
    }
  }
  return blocks;
}

std::set<uint64_t> AllocatedBlocks(const std::string& path, uint64_t from) {
  std::set<uint64_t> blocks;
  auto fd = OpenReadOnly(path);
  EXPECT_TRUE(fd.ok());
  const uint64_t size = std::filesystem::file_size(path);
  for (const Segment& s : MapRange(fd->get(), from, size - from)) {
    if (s.hole) continue;
    for (uint64_t b = s.offset / 4096; b * 4096 < s.offset + s.length; ++b) blocks.insert(b);
  }
  return blocks;
}

TEST(PackBatchCopy, SparseSourcesGiveSpecBytesAndKeepTheirHolesDirectAndBuffered) {
  const std::string root = TempDir("batch");
  Model m = MakeModel(root + "/model", 11);
  // Holes at block boundaries of the shard, which are not block boundaries
  // of the pack (the tensors start 32-byte aligned): part of a slice, two
  // whole slices with ragged edges, and a whole role of a layer.
  const ExpertTensor& up1 = m.experts.by_layer[0][0];
  const ExpertTensor& gate1 = m.experts.by_layer[0][1];
  const ExpertTensor& down2 = m.experts.by_layer[1][2];
  PunchHole(m.experts.shard_paths[up1.tensor.shard_index], up1.tensor.data_offset + 2 * up1.expert_bytes - 5000,
            2 * up1.expert_bytes + 12000);
  PunchHole(m.experts.shard_paths[gate1.tensor.shard_index], gate1.tensor.data_offset + 5 * gate1.expert_bytes + 9000,
            20000);
  PunchHole(m.experts.shard_paths[down2.tensor.shard_index], down2.tensor.data_offset / 4096 * 4096,
            down2.tensor.nbytes + 8192);
  auto shards = gguf::ShardSet::Open(m.dir);
  ASSERT_TRUE(shards.ok());
  auto ex = CollectExperts(*shards, m.spec);
  ASSERT_TRUE(ex.ok());
  const std::string expected = ExpectedPack(*ex);
  auto layout = LayoutOf(*ex);
  ASSERT_TRUE(layout.ok());
  const std::set<uint64_t> want_blocks = BlocksWithSourceData(*ex, *layout);
  ASSERT_LT(want_blocks.size(), (layout->final_size() - layout->data_start()) / 4096) << "the holes were not punched";

  for (const char* direct : {"1", "0"}) {
    for (const char* batch : {"1", "16777216"}) {
      SCOPED_TRACE(std::string("K3PACK_DIRECT_WRITE=") + direct + " K3PACK_BATCH_BYTES=" + batch);
      ScopedEnv d("K3PACK_DIRECT_WRITE", direct), b("K3PACK_BATCH_BYTES", batch);
      BuildOptions o;
      o.out_path = root + "/p" + direct + "-" + batch + ".pack";
      o.safety_margin_gib = 0;
      o.threads = 3;
      auto r = BuildPack(*ex, o);
      ASSERT_TRUE(r.ok()) << r.error().message();
      EXPECT_GT(r->hole_bytes, 0u);
      EXPECT_TRUE(ReadAll(o.out_path) == expected);
      EXPECT_TRUE(ReadPackDigests(DigestsPathFor(o.out_path)).ok());
      EXPECT_EQ(AllocatedBlocks(o.out_path, layout->data_start()), want_blocks);
    }
  }
  std::filesystem::remove_all(root);
}

// OutputFile with an O_DIRECT view: whole blocks go direct, a ragged tail
// through the page cache, and the file is not extended past the write.
TEST(PackBatchCopy, DirectOutputWritesRaggedTailAndChargesCountedBytes) {
  const std::string root = TempDir("outfile");
  const std::string path = root + "/out.bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const int dfd = ::open(path.c_str(), O_WRONLY | O_DIRECT);
  ASSERT_GE(dfd, 0) << "no O_DIRECT on " << root;
  const uint64_t size = 3 * 4096 + 100;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
  auto allocated = IoBuffer::Allocate(4 * 4096);
  ASSERT_TRUE(allocated.ok());
  IoBuffer& buf = *allocated;
  for (size_t i = 0; i < buf.size(); ++i) buf.data()[i] = static_cast<uint8_t>(i * 7 + 1);
  WriteBudget budget;
  budget.limit = 1000;
  OutputFile out(fd, path, &budget, dfd);
  EXPECT_TRUE(out.direct());
  // Charged 500 of its 8292 bytes: within the budget.
  Status st = out.Write(buf.data(), 2 * 4096 + 100, 4096, 500);
  ASSERT_TRUE(st.ok()) << st.error().message();
  EXPECT_EQ(std::filesystem::file_size(path), size);
  const std::string got = ReadAll(path);
  EXPECT_EQ(got.substr(0, 4096), std::string(4096, '\0'));
  EXPECT_EQ(got.substr(4096), std::string(reinterpret_cast<const char*>(buf.data()), 2 * 4096 + 100));
  // The next charge crosses the limit: a partial write and ENOSPC naming the file.
  st = out.Write(buf.data(), 4096, 0, 600);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sys_errno(), ENOSPC);
  EXPECT_NE(st.error().message().find("cannot write " + path + " at offset 500"), std::string::npos)
      << st.error().message();
  EXPECT_EQ(ReadAll(path).substr(0, 500), std::string(reinterpret_cast<const char*>(buf.data()), 500));
  ::close(dfd);
  ::close(fd);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace k3pack::pack
