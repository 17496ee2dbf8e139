// Status / Result (include/k3pack/error.h) used the way an integrator may
// misuse them: error() without checking ok(), a Result made from an OK
// Status (docs/RELIABILITY.md, "Faults from a C++ integrator's audit").
#include <gtest/gtest.h>

#include <string>
#include <variant>

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

}  // namespace
}  // namespace k3pack
