// `k3pack load`: JSON summary, --dump (.npy files numpy can read), errors
// and usage exit codes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <cstdio>

#include "loader/npy.h"
#include "loader_fixture.h"
#include "util/file.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

struct ShResult {
  int code = -1;
  std::string out;
};

ShResult Sh(const std::string& cmd) {
  ShResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string Bin() { return K3PACK_BIN; }

std::string SmallModel(const std::string& dir) {
  std::vector<gguf::TensorSpec> t;
  t.push_back(Typed("token_embd.weight", GgmlType::Q8_0, {32, 4}));
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, {-1.0f, -2.0f, -0.5f, -4.0f}));
  t.push_back(F32Tensor("blk.0.attn_res_score.weight", {8}, {1, 2, 3, 4, 5, 6, 7, 8}));
  t.push_back(Typed("blk.1.ffn_down_exps.weight", GgmlType::Q3_K, {256, 4, 2}));
  return WriteModel(dir, t, {0, 0, 1, 1});
}

TEST(LoadCli, JsonSummary) {
  TempDir dir("cli");
  const std::string m = SmallModel(dir.path);
  ShResult r = Sh(Bin() + " load --manifest " + m + " --json --list --quiet");
  ASSERT_EQ(r.code, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["shards"], 2);
  EXPECT_EQ(j["source_tensors"], 4);
  EXPECT_EQ(j["routed_skipped"], 1);
  EXPECT_EQ(j["emitted"], 5);
  EXPECT_EQ(j["by_kind"]["a_log"], 1);
  EXPECT_EQ(j["by_kind"]["qweight_type"], 1);
  ASSERT_EQ(j["tensors"].size(), 5u);
  EXPECT_EQ(j["tensors"][3]["name"], "model.layers.0.self_attention_res_proj.weight");
  EXPECT_EQ(j["tensors"][3]["shape"], json::array({1, 8}));
  EXPECT_EQ(j["tensors"][3]["zero_copy"], true);
  EXPECT_TRUE(j.contains("checksum"));

  ShResult text = Sh(Bin() + " load --manifest " + m + " --quiet");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("1 routed aggregates skipped"), std::string::npos) << text.out;
}

TEST(LoadCli, DumpWritesNpy) {
  TempDir dir("dump");
  const std::string m = SmallModel(dir.path);
  const std::string out = dir.path + "/dump";
  ShResult r = Sh(Bin() + " load --manifest " + m + " --dump " + out + " --quiet");
  ASSERT_EQ(r.code, 0) << r.out;
  auto alog = ReadFileToString(out + "/model.layers.0.self_attn.A_log.npy");
  ASSERT_TRUE(alog.ok());
  ASSERT_GT(alog->size(), 10u);
  const size_t data_at = 10 + (static_cast<uint8_t>((*alog)[8]) | (static_cast<uint8_t>((*alog)[9]) << 8));
  EXPECT_EQ(data_at % 64, 0u);
  ASSERT_EQ(alog->size(), data_at + 16u);
  EXPECT_EQ(alog->substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_NE(alog->find("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"), std::string::npos);
  float v[4];
  std::memcpy(v, alog->data() + data_at, 16);
  EXPECT_FLOAT_EQ(v[1], std::log(2.0f));
  auto scalar = ReadFileToString(out + "/model.embed_tokens.qweight_type.npy");
  ASSERT_TRUE(scalar.ok());
  EXPECT_NE(scalar->find("'shape': ()"), std::string::npos);
  EXPECT_EQ(scalar->back(), 8);
  // numpy reads them back, when available.
  ShResult np = Sh("/usr/bin/python3 -c \"import numpy as n; a=n.load('" + out +
              "/model.layers.0.self_attention_res_proj.weight.npy'); print(a.dtype, a.shape, a[0,7])\" 2>&1");
  if (np.code == 0) {
    EXPECT_EQ(np.out, "float32 (1, 8) 8.0\n");
  }
}

TEST(LoadCli, ErrorsAndUsage) {
  TempDir dir("clierr");
  const std::string m = SmallModel(dir.path);
  auto j = json::parse(*ReadFileToString(m));
  j["complete"] = false;
  const std::string bad = WriteJson(dir.path + "/bad.json", j);
  ShResult r = Sh(Bin() + " load --manifest " + bad + " --quiet 2>&1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("Kimi-K3 manifest is incomplete"), std::string::npos) << r.out;
  EXPECT_EQ(Sh(Bin() + " load --manifest " + m + " --json --summary 2>&1").code, 2);
  EXPECT_EQ(Sh(Bin() + " load 2>&1").code, 2);
}

// Pages of [data, data + n) of `path` that are in the page cache (mincore on a
// fresh map of the file), whole pages inside the range only.
size_t ResidentPagesOf(const std::string& path, uint64_t offset, uint64_t n, size_t* pages_total) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t lo = (offset + page - 1) / page * page, hi = (offset + n) / page * page;
  *pages_total = hi > lo ? (hi - lo) / page : 0;
  if (hi <= lo) return 0;
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  void* p = ::mmap(nullptr, hi - lo, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(lo));
  EXPECT_NE(p, MAP_FAILED);
  std::vector<unsigned char> vec(*pages_total);
  EXPECT_EQ(::mincore(p, hi - lo, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  ::munmap(p, hi - lo);
  ::close(fd);
  return resident;
}

// `load --no-read` walks and checks the stream without reading tensor bytes.
// It used to keep the stream's read-ahead on, which asks the kernel for every
// non-routed byte (MADV_WILLNEED): on a full-size checkpoint 62 GB read for a
// walk that reads nothing (49 s on the k3-structure model). Counted with
// mincore: a large tensor's pages, dropped from the page cache first, must
// still be out after the walk.
TEST(LoadCli, NoReadLeavesTensorBytesUnread) {
  TempDir dir("noread");
  std::vector<std::string> shards;
  std::vector<gguf::TensorSpec> t;
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, {-1.0f, -2.0f, -0.5f, -4.0f}));
  t.push_back(Typed("blk.1.ffn_down_exps.weight", GgmlType::Q3_K, {256, 4, 2}));
  t.push_back(Typed("token_embd.weight", GgmlType::Q8_0, {4096, 2048}));  // 8.5 MiB
  t.push_back(Typed("output.weight", GgmlType::Q8_0, {4096, 2048}));
  const std::string m = WriteModel(dir.path, t, {0, 0, 1, 1}, nullptr, &shards);
  auto drop = [&] {
    for (const auto& s : shards) {
      const int fd = ::open(s.c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      ::fdatasync(fd);
      ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
      ::close(fd);
    }
  };
  auto f = gguf::GgufFile::Open(shards[1]);
  ASSERT_TRUE(f.ok()) << f.error().message();
  const gguf::TensorInfo* embd = nullptr;
  for (const auto& ti : (*f)->tensors()) embd = ti.name == "token_embd.weight" ? &ti : embd;
  ASSERT_NE(embd, nullptr);
  const uint64_t off = (*f)->data_offset() + embd->data_offset, n = embd->nbytes;
  size_t pages = 0;
  drop();
  // The check itself must see a page read in: the plain load reads them all.
  ShResult full = Sh(Bin() + " load --manifest " + m + " --quiet 2>&1");
  ASSERT_EQ(full.code, 0) << full.out;
  const size_t after_read = ResidentPagesOf(shards[1], off, n, &pages);
  ASSERT_GT(pages, 1000u);
  ASSERT_EQ(after_read, pages);
  drop();
  const size_t dropped = ResidentPagesOf(shards[1], off, n, &pages);
  if (dropped > pages / 10) GTEST_SKIP() << "the page cache keeps these pages (" << dropped << " of " << pages << ")";
  ShResult r = Sh(Bin() + " load --manifest " + m + " --no-read --quiet 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t resident = ResidentPagesOf(shards[1], off, n, &pages);
  // A few pages may come in with the header's read-around; the tensor's bytes must not.
  EXPECT_LT(resident, pages / 10) << resident << " of " << pages << " pages of token_embd.weight read by --no-read";
}

TEST(Npy, HeaderIsPaddedTo64) {
  NamedTensor t;
  t.dtype = DType::kBFloat16;
  t.shape = {3, 5};
  const std::string h = NpyHeader(t);
  EXPECT_EQ(h.size() % 64, 0u);
  EXPECT_EQ(h.back(), '\n');
  EXPECT_NE(h.find("'descr': '<u2'"), std::string::npos);
  EXPECT_NE(h.find("'shape': (3, 5)"), std::string::npos);
  EXPECT_EQ(static_cast<size_t>(static_cast<uint8_t>(h[8]) | (static_cast<uint8_t>(h[9]) << 8)), h.size() - 10);
}

}  // namespace
}  // namespace k3pack::loader
