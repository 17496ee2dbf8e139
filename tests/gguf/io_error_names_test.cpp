// Every I/O error names the file the user asked for: a write that fails half
// way (here: RLIMIT_FSIZE, the same short write as a full disk) through the
// temp-file + rename writers names the target, never only an offset and never
// the `*.tmp` name on the first line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <string>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"
#include "util/file.h"

namespace k3pack {
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Caps the size of files this process writes at `bytes` for its lifetime;
// writes past it fail with EFBIG instead of raising SIGXFSZ.
class FileSizeCap {
 public:
  explicit FileSizeCap(rlim_t bytes) {
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit cap = old_;
    cap.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &cap) == 0;
  }
  ~FileSizeCap() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_;
  bool ok_ = false;
};

TEST(IoErrorNames, WriteFileAtomicNamesTheTargetNotItsTempFile) {
  const auto dir = k3test::TempDir("io-names");
  const std::string path = (dir / "stats.json").string();
  Status st;
  {
    FileSizeCap cap(100);
    ASSERT_TRUE(cap.ok());
    st = WriteFileAtomic(path, std::string(1000, 'x'));
  }
  ASSERT_FALSE(st.ok());
  const std::string first = FirstLine(st.message());
  EXPECT_NE(first.find("cannot write " + path + ": "), std::string::npos) << st.message();
  EXPECT_EQ(first.find(".tmp"), std::string::npos) << st.message();
  EXPECT_NE(first.find("File too large"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // The temp file cannot even be created (the "directory" is a file).
  const std::string under_file = path + "-file/stats.json";
  ASSERT_TRUE(WriteFileAtomic(path + "-file", "x").ok());
  st = WriteFileAtomic(under_file, "{}");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(FirstLine(st.message()).find("cannot write " + under_file + ": "), 0u) << st.message();
  EXPECT_EQ(FirstLine(st.message()).find(".tmp"), std::string::npos) << st.message();
}

TEST(IoErrorNames, GgufWriterAndReadFileNameTheirFile) {
  const auto dir = k3test::TempDir("io-names-gguf");
  const std::string path = (dir / "model.gguf").string();
  gguf::MetadataBuilder meta;
  meta.Str("general.architecture", "kimi-k3");
  std::vector<gguf::TensorSpec> tensors = {
      {"t", GgmlType::F32, {4096}, [](uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 1); }}};
  Status st;
  {
    FileSizeCap cap(1000);
    ASSERT_TRUE(cap.ok());
    st = gguf::WriteGguf(path, meta, tensors);
  }
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(FirstLine(st.message()).find("cannot write " + path + ": "), 0u) << st.message();
  EXPECT_EQ(FirstLine(st.message()).find(".tmp"), std::string::npos) << st.message();

  // A read error (EISDIR from read(2) on a directory) names the file.
  auto r = ReadFileToString(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find(dir.string()), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace k3pack
