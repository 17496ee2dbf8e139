// Status / Result (include/k3pack/error.h) used the way an integrator may
// misuse them: error() without checking ok(), a Result made from an OK
// Status (docs/RELIABILITY.md, "Faults from a C++ integrator's audit").
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <variant>

#include "../scratch_dir.h"
#include "k3pack/error.h"

namespace k3pack {
namespace {

// error() of an OK Status dereferenced an empty optional, and a Result made
// from an OK Status copied that "error": both undefined behaviour (garbage
// or a crash), now a defined placeholder / a defined error.
TEST(CppIntegratorAudit, ErrorOfAnOkStatusOrResultIsDefined) {
  const Status ok;
  EXPECT_EQ(ok.error().message(), "OK");
  EXPECT_EQ(&ok.error(), &ErrorOfOk());
  const Result<int> value = 3;
  EXPECT_EQ(value.error().message(), "OK");

  const Result<int> from_ok = Status::OK();
  ASSERT_FALSE(from_ok.ok());
  EXPECT_EQ(from_ok.error().kind(), ErrorKind::kRuntime);
  EXPECT_NE(from_ok.error().message().find("OK Status"), std::string::npos) << from_ok.error().message();

  // A failed Status still carries its error into a Result unchanged.
  const Result<int> failed = Status(Error::FromErrno("cannot open x", ENOENT));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().kind(), ErrorKind::kFileNotFound);
  EXPECT_EQ(failed.error().sys_errno(), ENOENT);
  EXPECT_EQ(failed.error().message(), "cannot open x: No such file or directory");
  // value() of an error is the one documented throw.
  EXPECT_THROW((void)failed.value(), std::bad_variant_access);
}

// Session 36: "File too large" was blamed on `ulimit -f` or on nothing,
// but a file system's own size cap (FAT32's 4 GiB, ext4's 16 TiB) gives the
// same EFBIG with no process limit set. Here a real one: a write past the
// largest offset the scratch file system allows.
TEST(ProcessLimitHints, FileTooLargeWithoutAProcessLimitNamesTheFileSystemsCap) {
  rlimit fsize{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &fsize), 0);
  if (fsize.rlim_cur != RLIM_INFINITY) GTEST_SKIP() << "runs without `ulimit -f`";
  const std::string path = testing_scratch::ProcessScratchDir("k3-error-test") + "/huge";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  // Past ext4's and xfs's caps; tmpfs and btrfs take any offset below 2^63.
  const off_t past_cap = off_t{1} << 62;
  const ssize_t wrote = ::pwrite(fd, "x", 1, past_cap);
  const int err = errno;
  ::close(fd);
  ::unlink(path.c_str());
  Error e = Error::FromErrno("cannot write " + path, EFBIG);
  if (wrote < 0) {
    ASSERT_EQ(err, EFBIG) << "a write past the file system's cap fails with EFBIG";
    e = Error::FromErrno("cannot write " + path, err);
  }
  EXPECT_EQ(e.message().substr(0, e.message().find('\n')), "cannot write " + path + ": File too large");
  EXPECT_NE(e.message().find("\nhint: the file system holding the file caps a file's size"), std::string::npos)
      << e.message();
  EXPECT_EQ(e.message().find("ulimit"), std::string::npos) << e.message();
}

// Two hints: hint() is both, each without its label (the JSON "hint" read
// "first\nhint: second"); the message keeps both labels.
TEST(ErrorHints, EveryHintIsGivenWithoutItsLabel) {
  const Error e = Error("cannot open fifo").WithHint("pass the file itself").WithHint("pass a readable config.json");
  EXPECT_EQ(e.headline(), "cannot open fifo");
  EXPECT_EQ(e.hint(), "pass the file itself\npass a readable config.json");
  EXPECT_EQ(e.message(), "cannot open fifo\nhint: pass the file itself\nhint: pass a readable config.json");
  EXPECT_EQ(Error("no hint").hint(), "");
}

}  // namespace
}  // namespace k3pack
