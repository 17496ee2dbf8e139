// `verify --full` on a sparse pack (a synthetic full-scale structure, or any
// expert-parallel rank pack's unwritten areas): holes are checked without a
// read, and the figures must say so. The k3-structure pack (918 GiB of holes)
// verified "in 5.2s (189138.4 MB/s)", a read speed no disk has.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "../cli_run.h"

namespace k3pack::pack {
namespace {

using testing_cli::Cli;

TEST(VerifyHoles, SparsePayloadsAreCheckedButNotCountedAsRead) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "k3-verify-holes-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl + "/m";
  // k3-structure writes tensors above 256 KiB as holes: every expert stack here.
  auto s = Cli("synth --preset k3-structure --layers 3 --experts 8 --top-k 2 --hidden 512 --latent 512 "
               "--moe-intermediate 1024 --heads 4 --head-dim 64 --vocab 512 --shards 2 --out " + dir);
  ASSERT_EQ(s.code, 0) << s.out;
  auto b = Cli("build " + dir + " --progress none");
  ASSERT_EQ(b.code, 0) << b.out;
  const std::string m = dir + "/kimi-k3-expert-pack.manifest.json";
  for (const char* mode : {"--full", "--full --against-source"}) {
    auto j = Cli(std::string("verify ") + mode + " --json --progress none " + m);
    ASSERT_EQ(j.code, 0) << j.out;
    auto r = nlohmann::json::parse(j.out.substr(j.out.find('{')));
    EXPECT_EQ(r["entries_checked"], 48) << mode;
    EXPECT_GT(r["bytes_checked"].get<uint64_t>(), 0u) << mode;
    ASSERT_TRUE(r.contains("bytes_read")) << j.out;
    // Every payload is a hole but for the block(s) it shares with the index.
    EXPECT_LT(r["bytes_read"].get<uint64_t>(), r["bytes_checked"].get<uint64_t>() / 100) << mode;
    // The rate is of the bytes read, not of the holes checked.
    const double secs = r["seconds"].get<double>();
    if (secs > 0) {
      EXPECT_DOUBLE_EQ(r["mb_per_s"].get<double>(), r["bytes_read"].get<uint64_t>() / 1e6 / secs) << mode;
    }
  }
  auto t = Cli("verify --full --progress none " + m);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("8.69 MiB (8.00 KiB read, 8.68 MiB sparse holes)"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find(" MB/s read)"), std::string::npos) << t.out;
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace k3pack::pack
