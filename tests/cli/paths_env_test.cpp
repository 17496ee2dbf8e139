// Paths, filesystems and the process environment as operators meet them
// (session 15 paths-and-environment audit): named pipes and device nodes where
// files are expected, a link to the output directory, the profile record as
// an output, stdout/stderr closed or unwritable, a filesystem without O_DIRECT
// or without a size. Commands that hung before run under `timeout`.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "../scratch_mount.h"
#include "cli_fixture.h"

namespace k3cli {
namespace {

std::string FileText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Exit code of a shell command line (-1 when it did not exit normally).
int Shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

mode_t TypeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

TEST(PathsEnv, AFifoWhereAnInputFileIsExpectedIsRefusedNotWaitedOn) {
  const std::string d = Root() + "/fifo-inputs";
  fs::create_directories(d);
  for (const char* name : {"x-00001-of-00001.gguf", "config.json", "m.manifest.json", "t.k3t"})
    ASSERT_EQ(::mkfifo((d + "/" + name).c_str(), 0644), 0);
  const std::string m = FreshModel("fifo-inputs-model");
  // Before: each waited forever in open() for a writer.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"inspect " + Q(d + "/x-00001-of-00001.gguf"), d + "/x-00001-of-00001.gguf"},
      {"inspect " + Q(d), d + "/x-00001-of-00001.gguf"},
      {"pack --progress none --model-config " + Q(d + "/config.json") + " --pack " + Q(m + "/o.pack") + " " + Q(m),
       d + "/config.json"},
      {"verify " + Q(d + "/m.manifest.json"), d + "/m.manifest.json"},
      {"trace replay --simulate --trace " + Q(d + "/t.k3t") + " --manifest " + Q(BuiltTinyModel()), d + "/t.k3t"},
  };
  for (const auto& [args, fifo] : cases) {
    SCOPED_TRACE(args);
    CliRun r = Timed(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "cannot open " + fifo + ": it is a FIFO (named pipe), not a regular file")) << r.out;
  }
  EXPECT_FALSE(fs::exists(m + "/o.pack"));
}

TEST(PathsEnv, TraceGenAndSweepTakeTheDirectoryBuildWroteTheManifestInto) {
  const std::string& m = BuiltTinyModel();
  const std::string d = Root() + "/trace-manifest-dir";
  fs::create_directories(d);
  // Before: "cannot read DIR: read failed at offset 0: Is a directory", while
  // replay, verify, load and run-experts took the directory.
  CliRun r = Cli("trace gen --requests 1 --decode-tokens 2 --trace " + Q(d + "/t.k3t") + " --manifest " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "using --manifest " + m + "/kimi-k3-expert-pack.manifest.json")) << r.out;
  r = Cli("trace sweep --progress none --requests 1 --decode-tokens 2 --svg " + Q(d + "/s.svg") + " --manifest " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "3 layers x top-4 of 16")) << r.out;
}

TEST(PathsEnv, ForceNeverReplacesADeviceNodeAFifoOrADirectory) {
  const std::string m = FreshModel("special-outputs");
  ASSERT_EQ(::mkfifo((m + "/fifo.pack").c_str(), 0644), 0);
  fs::create_directories(m + "/dir.pack");
  // Before: the FIFO hung the "is it already built?" check; the empty
  // directory was removed and replaced by the pack with --force.
  CliRun r = Timed("pack --progress none --safety-margin-gib 0 --pack " + Q(m + "/fifo.pack") + " " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--pack " + m + "/fifo.pack is a FIFO (named pipe), not a file: k3pack never replaces one"))
      << r.out;
  r = Timed("pack --progress none --safety-margin-gib 0 --force --pack " + Q(m + "/dir.pack") + " " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--pack " + m + "/dir.pack is a directory, not a file: k3pack never replaces one, "
                              "not even with --force"))
      << r.out;
  r = Timed("trace gen --layers 1 --experts 8 --top-k 2 --requests 1 --decode-tokens 2 --force --trace " +
            Q(m + "/dir.pack"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--trace " + m + "/dir.pack is a directory, not a file")) << r.out;
  EXPECT_EQ(TypeOf(m + "/fifo.pack"), S_IFIFO);
  EXPECT_EQ(TypeOf(m + "/dir.pack"), S_IFDIR);
  EXPECT_FALSE(fs::exists(m + "/fifo.pack.lock"));

  // Before: `--pack /dev/null --force` (or --trace, --svg) as root removed or
  // renamed over the device node: /dev/null became a 27 MB regular file.
  if (::geteuid() != 0) GTEST_SKIP() << "making a device node needs root";
  const std::string dev = m + "/null";
  ASSERT_EQ(::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  const std::string trace = m + "/t.k3t";
  ASSERT_EQ(Cli("trace gen --layers 1 --experts 8 --top-k 2 --requests 1 --decode-tokens 2 --trace " + Q(trace)).code, 0);
  for (const std::string& args :
       {"pack --progress none --safety-margin-gib 0 --force --pack " + Q(dev) + " " + Q(m),
        "trace gen --layers 1 --experts 8 --top-k 2 --requests 1 --decode-tokens 2 --force --trace " + Q(dev),
        "trace sweep --progress none --sizes 4 --force --trace " + Q(trace) + " --svg " + Q(dev)}) {
    SCOPED_TRACE(args);
    r = Timed(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, dev + " is a character device, not a file: k3pack never replaces one, not even "
                                      "with --force"))
        << r.out;
    EXPECT_EQ(TypeOf(dev), S_IFCHR);
  }
}

TEST(PathsEnv, ALinkToADirectoryIsADirectoryOutput) {
  const std::string d = Root() + "/dir-link";
  fs::create_directories(d + "/real");
  fs::create_directory_symlink("real", d + "/link");
  // Before: "--out .../link is a file, not a directory".
  CliRun r = Cli("synth --out " + Q(d + "/link"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(d + "/real/config.json"));
  EXPECT_TRUE(fs::is_symlink(d + "/link"));
  r = Cli("synth --out " + Q(d + "/link"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + d + "/link")) << r.out;
  // A link to a file stays "a file".
  std::ofstream(d + "/file") << "x";
  fs::create_symlink("file", d + "/file-link");
  r = Cli("synth --out " + Q(d + "/file-link"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--out " + d + "/file-link is a file, not a directory")) << r.out;
}

TEST(PathsEnv, TheProfileRecordIsAnInputThatNoOutputReplaces) {
  const std::string m = FreshModel("profile-record");
  const std::string sidecar = m + "/k3pack-profile.json";
  const auto before = Snapshot(m);
  // Before: build overwrote the sidecar it had read its profile from with the
  // manifest (exit 0), and pack with the pack.
  CliRun r = Build(m, "--force --manifest " + Q(sidecar));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest " + sidecar + " is an input (the profile record)")) << r.out;
  r = Pack(m, "--force --pack " + Q(sidecar));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--pack " + sidecar + " is an input (the profile record)")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  ASSERT_EQ(Build(m).code, 0);
  r = Cli("manifest --progress none --force --gguf-dir " + Q(m) + " --manifest " + Q(sidecar));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest " + sidecar + " is an input (the profile record)")) << r.out;
  EXPECT_EQ(FileText(sidecar), FileText(BaseModel() + "/k3pack-profile.json"));
}

TEST(PathsEnv, ClosedStandardDescriptorsAreNeverReusedByTheFilesItOpens) {
  const std::string m = FreshModel("closed-fds");
  // Before: with stderr closed, the lock file opened as descriptor 2 and
  // received every progress line and message.
  EXPECT_EQ(Shell(std::string(K3PACK_BIN) + " build --progress json --safety-margin-gib 0 " + Q(m) + " >/dev/null 2>&-"),
            0);
  EXPECT_EQ(fs::file_size(m + "/KIMI-K3-SYNTH.expert-major.pack.lock"), 0u);
  CliRun r = Cli("verify --full " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  // stdout closed: its lines cannot be written, which is an error now
  // (before: exit 0), and nothing lands in a file.
  const std::string err = m + "/stderr.txt";
  EXPECT_EQ(Shell(std::string(K3PACK_BIN) + " verify " + Q(m) + " >&- 2>" + Q(err)), 1);
  EXPECT_TRUE(Contains(FileText(err), "k3pack verify: error: cannot write to standard output")) << FileText(err);
  EXPECT_EQ(fs::file_size(m + "/KIMI-K3-SYNTH.expert-major.pack.lock"), 0u);
  // stdin closed is harmless.
  EXPECT_EQ(Shell(std::string(K3PACK_BIN) + " inspect --summary " + Q(m) + " <&- >/dev/null"), 0);
}

TEST(PathsEnv, TheUmaskAloneDecidesTheModeOfEveryFileWritten) {
  const std::string d = Root() + "/umask-002";
  fs::remove_all(d);
  // Before: every file was created 0644, so a group sharing the directory
  // under umask 002 could not replace or repair what k3pack wrote.
  const std::string bin = K3PACK_BIN;
  ASSERT_EQ(Shell("umask 002 && " + bin + " synth --preset tiny --seed 1 --out " + Q(d) + " >/dev/null && " + bin +
                  " build --progress none --safety-margin-gib 0 " + Q(d) + " >/dev/null"),
            0);
  int checked = 0;
  for (const auto& e : fs::recursive_directory_iterator(d)) {
    if (!e.is_regular_file()) continue;
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0664u) << e.path();
    ++checked;
  }
  EXPECT_GE(checked, 8) << "shards, config, tokenizer, pack, its sidecars and the manifest";
  ASSERT_EQ(Shell("umask 077 && " + bin + " manifest --progress none --force --gguf-dir " + Q(d) + " >/dev/null"), 0);
  struct stat st {};
  ASSERT_EQ(::stat((d + "/kimi-k3-expert-pack.manifest.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(PathsEnv, AStdoutThatCannotBeWrittenIsAnErrorNotExitZero) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string err = Root() + "/full-stderr.txt";
  // Before: exit 0 with the JSON lost (`inspect --json > report.json` on a full disk).
  for (const std::string& args : {"inspect --json " + Q(BaseModel()), "inspect " + Q(BaseModel()), std::string("--help")}) {
    SCOPED_TRACE(args);
    EXPECT_EQ(Shell(std::string(K3PACK_BIN) + " " + args + " >/dev/full 2>" + Q(err)), 1);
    EXPECT_TRUE(Contains(FileText(err), "error: cannot write to standard output: No space left on device")) << FileText(err);
  }
}

TEST(PathsEnv, AFilesystemWithoutOdirectOrASizeNamesTheRule) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a ramfs needs root";
  k3pack::testing_scratch::ScratchMount ram(Root() + "/ramfs", "ramfs");
  if (!ram.ok) GTEST_SKIP() << "cannot mount a ramfs here";
  const std::string m = ram.dir + "/m";
  fs::copy(BaseModel(), m, fs::copy_options::recursive);
  // ramfs reports no size (0 blocks): before, "insufficient space for Kimi
  // Expert Pack: available=0" for every build there.
  CliRun r = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  ASSERT_EQ(r.code, 0) << r.out;
  // The build falls back to buffered I/O by itself; the store was asked for
  // direct I/O: before, "cannot open PACK: Invalid argument".
  for (const std::string& args : {"run-experts --tokens 1 --direct " + Q(m),
                                  "trace replay --direct --trace " + Q(m + "/t.k3t") + " --manifest " + Q(m)}) {
    SCOPED_TRACE(args);
    if (Contains(args, "replay")) {
      ASSERT_EQ(Cli("trace gen --requests 1 --decode-tokens 2 --trace " + Q(m + "/t.k3t") + " --manifest " + Q(m)).code, 0);
    }
    r = Cli(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "cannot open " + m + "/KIMI-K3-SYNTH.expert-major.pack for direct I/O (O_DIRECT): "
                                "Invalid argument"))
        << r.out;
    EXPECT_TRUE(Contains(r.out, "hint: the filesystem holding it does not support O_DIRECT")) << r.out;
  }
  r = Cli("run-experts --tokens 1 " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
}

// A model directory this user may enter but not list (mode 0711): SGLang's
// glob skips it and says "no GGUF files found". Here doctor on one of its
// shards said "healthy" after checking 0 files, and inspect said
// "GGUF shard filenames disagree on split count: set()". Root lists every
// directory: run as nobody.
TEST(PathsEnv, ADirectoryThatCannotBeListedIsSglangsNoGgufFilesWithTheReason) {
  if (::geteuid() != 0 || !fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("unlistable");
  for (const auto& e : fs::recursive_directory_iterator(m)) {
    fs::permissions(e.path(), fs::perms::others_read, fs::perm_options::add);
    if (e.is_directory()) fs::permissions(e.path(), fs::perms::others_exec, fs::perm_options::add);
  }
  fs::permissions(Root(), fs::perms::others_read | fs::perms::others_exec, fs::perm_options::add);
  fs::permissions(m, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  const std::string shard = m + "/KIMI-K3-SYNTH-00001-of-00003.gguf";
  ASSERT_TRUE(fs::exists(shard));
  const std::string shown = fs::canonical(m).string();  // SGLang's text names the resolved directory
  const std::string nobody = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups";
  for (const std::string& args : {"doctor " + Q(shard), "doctor " + Q(m), "inspect " + Q(shard), "inspect " + Q(m),
                                  "build " + Q(m) + " --pack " + Q(Root() + "/unlistable.pack")}) {
    CliRun r = CliVia(nobody, args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "no GGUF files found in " + shown)) << args << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "cannot be listed: Permission denied")) << args << "\n" << r.out;
    EXPECT_FALSE(Contains(r.out, "healthy")) << args << "\n" << r.out;
  }
  fs::permissions(m, fs::perms::all);
}

// File names up to the 255-byte limit: a manifest of 250 bytes failed with
// "cannot give the temporary file a name: File name too long" (the
// temporary adds `.<pid>.<n>.tmp`), and a pack of 250 bytes failed after the
// build had started, its lock file left, because `.partial.checkpoint.spare`
// does not fit. The manifest is written; the pack is refused before anything
// is created, with the longest name it may have.
TEST(PathsEnv, NamesNearTheFileNameLimitAreWrittenOrRefusedUpFront) {
  const std::string m = FreshModel("long-names");
  const std::string out = Root() + "/long-names-out";
  fs::remove_all(out);
  fs::create_directories(out);
  CliRun refused = Cli("build --progress none " + Q(m) + " --pack " + Q(out + "/" + std::string(245, 'p') + ".pack"));
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_TRUE(Contains(refused.out, "the pack's name is 250 bytes")) << refused.out;
  EXPECT_TRUE(Contains(refused.out, "past the 255-byte limit of a file name")) << refused.out;
  EXPECT_TRUE(Contains(refused.out, "hint: give the pack a name of at most 230 bytes")) << refused.out;
  EXPECT_TRUE(fs::is_empty(out));
  const std::string pack = out + "/" + std::string(225, 'p') + ".pack";
  const std::string manifest = out + "/" + std::string(245, 'm') + ".json";
  CliRun built = Cli("build --progress none " + Q(m) + " --pack " + Q(pack) + " --manifest " + Q(manifest));
  EXPECT_EQ(built.code, 0) << built.out;
  EXPECT_TRUE(fs::exists(pack));
  EXPECT_TRUE(fs::exists(manifest));
  EXPECT_EQ(Cli("verify --progress none " + Q(manifest)).code, 0);
}

}  // namespace
}  // namespace k3cli
