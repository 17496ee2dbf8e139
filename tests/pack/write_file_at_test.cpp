// A failed write outside the copy (the checkpoint's spare, the partial pack's
// header, the digest journal) names its file and offset and, on a full disk,
// says to free space: before, "error: write failed at offset 0: No space left
// on device" named nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "pack/build_inputs.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

TEST(WriteFileAt, AFullDiskNamesTheFileTheOffsetAndWhatToDo) {
  UniqueFd fd(::open("/dev/full", O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) GTEST_SKIP() << "no /dev/full";
  const std::string bytes(64, 'x');
  Status st = WriteFileAt(fd.get(), "out.pack.partial", bytes.data(), bytes.size(), 4096);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("cannot write out.pack.partial at offset 4096"), std::string::npos)
      << st.error().message();
  EXPECT_EQ(st.error().sys_errno(), ENOSPC);
  EXPECT_NE(st.error().hint().find("free space on the filesystem of out.pack.partial"), std::string::npos)
      << st.error().hint();
}

}  // namespace
}  // namespace k3pack::pack
