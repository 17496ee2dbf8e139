// Inputs cli_json_fuzz found that made doctor misbehave, kept in
// fuzz/corpus/cli_json/regression-*.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "doctor_test_util.h"

namespace dtest {
namespace {

// A 2 KB file whose header has a metadata key length running far past its end:
// doctor parsed it again from a copy extended by 1 TiB of zeros (meant for
// shards cut off inside their tensor data) and read ~750 MB of zeros per try,
// 2.2 GB resident. Now only a whole header is re-parsed that way.
TEST(DoctorFuzzRegression, BrokenHeaderIsNotReparsedFromTheZeroExtension) {
  const std::string input = std::string(K3PACK_SOURCE_DIR) + "/fuzz/corpus/cli_json/regression-doctor-cutoff-huge-key-length";
  ASSERT_TRUE(fs::exists(input));
  const pid_t pid = ::fork();
  if (pid == 0) {
    const doctor::Report r = doctor::Diagnose({input});
    ::_exit(r.Has("gguf-unreadable") ? 0 : 3);
  }
  int status = 0;
  rusage usage{};
  ASSERT_EQ(::wait4(pid, &status, 0, &usage), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the file must be reported unreadable";
  EXPECT_LT(usage.ru_maxrss, 256 * 1024) << "peak resident KiB";
}

}  // namespace
}  // namespace dtest
