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

// A name of 250 bytes is legal, but `<name>.<pid>.<n>.tmp` is not: the
// write failed with "cannot give the temporary file a name: File name too
// long". The temporary's name is cut to fit, and the next writer still
// knows a gone writer's cut temporary as its own.
TEST(StaleTempFiles, AnOutputWhoseNameLeavesNoRoomForTheSuffixIsWrittenAndItsTemporariesKnown) {
  const fs::path dir = fs::temp_directory_path() / ("k3pack-longname-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string name(250, 'm');
  const std::string out = (dir / name).string();
  ASSERT_TRUE(WriteFileAtomic(out, "{}\n").ok());
  {
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "{}\n");
  }
  const std::string suffix = "." + std::to_string(k3test::DeadPid()) + ".0.tmp";
  const std::string cut = name.substr(0, 255 - suffix.size()) + suffix;
  EXPECT_TRUE(IsAtomicTempNameOf(cut, name));
  EXPECT_FALSE(IsAtomicTempNameOf(cut, std::string(250, 'n')));
  EXPECT_FALSE(IsAtomicTempNameOf("mm" + suffix, name));  // cut, but not to the limit: another output's
  std::ofstream((dir / cut).string()) << "x";
  ASSERT_TRUE(WriteFileAtomic(out, "{}\n").ok());
  EXPECT_FALSE(fs::exists(dir / cut));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{name});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace k3pack
