// The store where the kernel refuses io_uring (session 31 constrained-resources
// audit): containers' default seccomp profile makes io_uring_setup fail with
// EPERM, `sysctl kernel.io_uring_disabled=2` does the same, kernels before
// 5.1 answer ENOSYS. The refusal here is the kernel's own: a seccomp filter
// installed in a forked child, not a stand-in for the engine.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>

#include "../forked_child.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::SmallStore;
using testing::TinyPack;
using testing::TinySpec;

#ifdef __NR_io_uring_setup
// Makes every later io_uring_setup of this process fail with `err`, as a
// container's seccomp profile does (the syscall number is the build's own
// architecture's; nothing else is filtered).
bool RefuseIoUringSetup(int err) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}
#endif

// Before: `io_uring is unavailable: Operation not permitted`, with no word of
// what refused it or that the pread backend works without it.
TEST(StoreResourceLimits, IoUringRefusedByTheKernelIsNamedWithThePreadWayOut) {
#ifndef __NR_io_uring_setup
  GTEST_SKIP() << "no io_uring_setup syscall number on this architecture";
#else
  TinyPack p(TinySpec{}, "uring-refused");
  for (const int err : {EPERM, ENOSYS}) {
    SCOPED_TRACE(err == EPERM ? "EPERM (seccomp, io_uring_disabled)" : "ENOSYS (old kernel)");
    const int rc = k3test::InForkedChild([&] {
      if (!RefuseIoUringSetup(err)) ::_exit(4);
      StoreOptions o = SmallStore();
      o.io_backend = "uring";
      auto s = ExpertStore::Open(p.pack, p.manifest, o);
      if (s.ok()) ::_exit(5);
      const Error& e = s.error();
      std::fprintf(stderr, "%s\n", e.message().c_str());
      if (e.headline().find("io_uring is unavailable: cannot set up a ring of") == std::string::npos) ::_exit(2);
      if (e.sys_errno() != err || e.kind() != ErrorKind::kOS) ::_exit(3);
      const std::string why = err == EPERM ? "seccomp filter" : "this kernel has no io_uring";
      if (e.hint().find(why) == std::string::npos) ::_exit(6);
      if (e.hint().find("use the pread backend (--io pread, io_backend=\"pread\")") == std::string::npos) ::_exit(7);
      // The way out works in the same process.
      o.io_backend = "pread";
      ::_exit(ExpertStore::Open(p.pack, p.manifest, o).ok() ? 0 : 8);
    });
    if (rc == 4) GTEST_SKIP() << "seccomp filters cannot be installed here";
    EXPECT_EQ(rc, 0) << "child exit code (5: opened; 2, 3: message or errno; 6, 7: hint; 8: pread failed too)";
  }
#endif
}

}  // namespace
}  // namespace k3pack::store
