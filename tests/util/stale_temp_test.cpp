// AtomicFile's named temporaries (`<out>.<pid>.<n>.tmp`) left by a writer
// killed between naming and renaming one: the next writer of the same output
// removes those whose process is gone, never a live writer's or another
// output's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "util/file.h"
#include "../forked_child.h"

namespace k3pack {
namespace {

namespace fs = std::filesystem;

TEST(StaleTempFiles, TheNextWriterRemovesOnlyThoseOfGoneWritersOfItsOutput) {
  const fs::path dir = fs::temp_directory_path() / ("k3pack-stale-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string out = (dir / "m.json").string();
  const std::string dead = out + "." + std::to_string(k3test::DeadPid()) + ".0.tmp";
  const std::string live = out + "." + std::to_string(::getppid()) + ".1.tmp";
  const std::string other = (dir / "n.json").string() + "." + std::to_string(k3test::DeadPid()) + ".0.tmp";
  const std::string odd = out + ".x.0.tmp";
  // A pid this process cannot see, but the file is locked: a live writer in
  // another PID namespace (a container sharing the directory).
  const std::string foreign = out + "." + std::to_string(k3test::DeadPid()) + ".2.tmp";
  for (const auto& f : {dead, live, other, odd, foreign}) std::ofstream(f) << "x";
  const int held = ::open(foreign.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  ASSERT_TRUE(WriteFileAtomic(out, "{}\n").ok());
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(foreign));
  ::close(held);
  ASSERT_TRUE(WriteFileAtomic(out, "{}\n").ok());
  EXPECT_FALSE(fs::exists(foreign));  // its writer let go
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(odd));
  EXPECT_TRUE(IsAtomicTempNameOf("m.json.12.0.tmp", "m.json"));
  EXPECT_FALSE(IsAtomicTempNameOf("m.json.tmp", "m.json"));
  EXPECT_FALSE(IsAtomicTempNameOf("m.json.12.tmp", "m.json"));
  EXPECT_FALSE(IsAtomicTempNameOf("xm.json.12.0.tmp", "m.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace k3pack
