// The CLI run by a user other than the files' owner (session 30 non-root
// permissions audit): every other CLI test runs as root, which reads and
// replaces anything, so a file or directory this user may not read, list or
// replace was never met. Each test runs k3pack as nobody (setpriv) over a
// model root made, and skips where it cannot.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "cli_fixture.h"

namespace k3cli {
namespace {

const char* kNobody = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups";

bool CanRunAsNobody() { return ::geteuid() == 0 && fs::exists("/usr/bin/setpriv"); }

// k3pack as nobody, under `timeout` (a hang is a failure, not a stalled run).
CliRun AsNobody(const std::string& args) { return CliVia(std::string(kNobody) + " timeout -k 5 60", args); }

// Everything under `dir` readable (and its directories searchable) by
// others, with the scratch root, so nobody reaches it; `writable_dir` also
// lets nobody write in `dir` itself.
void OpenToOthers(const std::string& dir, bool writable_dir = false) {
  fs::permissions(Root(), fs::perms::others_read | fs::perms::others_exec, fs::perm_options::add);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    fs::permissions(e.path(), fs::perms::others_read, fs::perm_options::add);
    if (e.is_directory()) fs::permissions(e.path(), fs::perms::others_exec, fs::perm_options::add);
  }
  fs::permissions(dir, fs::perms::others_read | fs::perms::others_exec, fs::perm_options::add);
  if (writable_dir) fs::permissions(dir, fs::perms::all);
}

// A file only its owner (root) may read, as a download or copy made by
// another user leaves it.
void OwnerOnly(const std::string& path) { fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write); }

TEST(Permissions, AnUnreadableTokenizerFileIsRefusedBeforeThePackIsBuilt) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  for (const bool unlistable : {false, true}) {
    SCOPED_TRACE(unlistable ? "tokenizer directory not listable" : "tokenizer file unreadable");
    const std::string m = FreshModel(unlistable ? "perm-tok-dir" : "perm-tok-file");
    OpenToOthers(m, /*writable_dir=*/true);
    const std::string tok = m + "/tokenizer";
    if (unlistable) {
      fs::permissions(tok, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    } else {
      OwnerOnly(tok + "/tiktoken.model");
    }
    // Before: the whole pack was built, then the manifest writer failed on
    // the tokenizer (hours, for a real model), against "checks all inputs
    // before writing a byte".
    CliRun r = AsNobody("build --progress none --safety-margin-gib 0 " + Q(m));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, unlistable ? "cannot list tokenizer directory " + tok + ": Permission denied"
                                           : "cannot open " + tok + "/tiktoken.model: Permission denied"))
        << r.out;
    EXPECT_TRUE(Contains(r.out, "every file of the tokenizer directory is hashed into the manifest")) << r.out;
    EXPECT_FALSE(Contains(r.out, "EXPERT_PACK_BUILD_START")) << r.out;
    EXPECT_FALSE(fs::exists(m + "/" + kPackName)) << r.out;
    EXPECT_FALSE(fs::exists(m + "/" + std::string(kPackName) + ".partial")) << r.out;
    fs::permissions(tok, fs::perms::all);
  }
}

// A shard, the manifest or the pack this user may not read is a permission to
// fix, not a damaged file to download or rebuild again.
TEST(Permissions, DoctorTellsAFileItMayNotReadFromADamagedOne) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("perm-doctor");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  OpenToOthers(m);
  const std::string manifest = m + "/" + kManifestName, pack = m + "/" + kPackName;
  // Before: the shard was `gguf-unreadable` ("its header breaks a rule of
  // ggml's reader", fix "Re-download the file"), the pack `pack-invalid`
  // with SGLang's "Kimi expert-pack index is truncated" and a rebuild, the
  // manifest `input-unrecognized` ("neither a GGUF file ... nor a manifest").
  for (const auto& [unreadable, target] : std::vector<std::pair<std::string, std::string>>{
           {Shard(m, 2), m}, {Shard(m, 2), Shard(m, 1)}, {pack, manifest}, {manifest, manifest},
           {m + "/config.json", m}}) {
    SCOPED_TRACE("doctor " + target + " with " + unreadable + " unreadable");
    OwnerOnly(unreadable);
    CliRun r = AsNobody("doctor " + Q(target));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "ERROR [file-permission-denied] " + unreadable)) << r.out;
    EXPECT_TRUE(Contains(r.out, "cannot open " + unreadable + ": Permission denied")) << r.out;
    EXPECT_TRUE(Contains(r.out, "PermissionError")) << r.out;
    for (const char* wrong : {"gguf-unreadable", "Re-download", "pack-invalid", "index is truncated",
                              "input-unrecognized", "config-invalid", "healthy"}) {
      EXPECT_FALSE(Contains(r.out, wrong)) << wrong << "\n" << r.out;
    }
    fs::permissions(unreadable, fs::perms::others_read, fs::perm_options::add);
  }
}

// In a directory with the sticky bit (/tmp, a shared scratch directory) only
// the owner of a file, or of the directory, may rename over it: another
// user's output there cannot be replaced, with --force or without.
TEST(Permissions, AnotherUsersOutputInAStickyDirectoryIsRefusedBeforeTheRun) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  const std::string d = Root() + "/perm-sticky";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string trace = d + "/t.k3t";
  ASSERT_EQ(Cli(TraceGen(trace, "--seed 1")).code, 0);
  OpenToOthers(d);
  fs::permissions(d, fs::perms::all | fs::perms::sticky_bit);
  const std::string before = k3pack::testing_cli::FileBytes(trace);
  // Before: --force generated the trace and then failed to rename it into
  // place ("cannot move it into place: Operation not permitted", the rule
  // unnamed: after the run, for a sweep's plot after the whole sweep), and
  // without --force the refusal's hint offered --force.
  for (const std::string force : {"--force", ""}) {
    SCOPED_TRACE(force);
    CliRun r = AsNobody(TraceGen(trace, "--seed 2 " + force));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + trace + " (--trace): it belongs to uid 0 and " + d +
                                    " has the sticky bit, so only the owner of the file or of the directory may "
                                    "replace it\n"))
        << r.out;
    // One sentence: the strerror once glued after it ("...may replace it:
    // Operation not permitted") said again what the sentence says.
    EXPECT_FALSE(Contains(r.out, "Operation not permitted")) << r.out;
    EXPECT_FALSE(Contains(r.out, "pass --force")) << r.out;
    EXPECT_FALSE(Contains(r.out, "wrote ")) << r.out;
    EXPECT_EQ(k3pack::testing_cli::FileBytes(trace), before);
  }
  // A plot is regenerated over its own kind without --force.
  const std::string svg = d + "/s.svg";
  const std::string sweep = "trace sweep --progress none --requests 1 --decode-tokens 2 --manifest " +
                            Q(BuiltTinyModel()) + " --svg " + Q(svg);
  fs::permissions(d, fs::perms::sticky_bit, fs::perm_options::remove);
  ASSERT_EQ(Cli(sweep + " --seed 1").code, 0);
  fs::permissions(svg, fs::perms::others_read, fs::perm_options::add);
  fs::permissions(d, fs::perms::sticky_bit, fs::perm_options::add);
  CliRun r = AsNobody(sweep + " --seed 7");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + svg + " (--svg): it belongs to uid 0")) << r.out;
  EXPECT_FALSE(Contains(r.out, "hit rate vs cache size")) << r.out;  // refused before the sweep
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++entries;
  EXPECT_EQ(entries, 2u);  // the trace and the plot, no temporary beside them
}

// A writer of a directory (synth, repair, load --dump) whose output is, or
// is to be made in, a directory this user may not write names the option it
// was given, as every other writer does (--manifest, --trace, ...).
TEST(Permissions, AReadOnlyOutputDirectoryIsNamedByItsOption) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("perm-ro-out-model");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string ro = Root() + "/perm-ro-out";
  fs::remove_all(ro);
  fs::create_directories(ro);
  OpenToOthers(m);
  OpenToOthers(ro);  // readable and searchable, not writable
  struct Case {
    std::string args, option, out;
  };
  // Before: `cannot create directory RO/new: Permission denied` (synth),
  // `cannot create dump directory RO/d: Permission denied` (load), `cannot
  // write RO/.k3pack-synth.partial` (an existing directory), and repair named
  // OUT as RO/x, a file nobody asked for.
  for (const Case& c : std::vector<Case>{
           {"synth --preset tiny --out " + Q(ro + "/new"), "--out", ro + "/new"},
           {"synth --preset tiny --out " + Q(ro), "--out", ro},
           {"repair --fix ssm-a " + Q(m) + " " + Q(ro), "OUT", ro},
           {"repair --fix ssm-a " + Q(m) + " " + Q(ro + "/new"), "OUT", ro + "/new"},
           {"load --dump " + Q(ro + "/d") + " " + Q(m), "--dump", ro + "/d"},
           {"load --dump " + Q(ro) + " " + Q(m), "--dump", ro}}) {
    SCOPED_TRACE(c.args);
    CliRun r = AsNobody(c.args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, c.option + " " + c.out + ": cannot write in " + ro + ": Permission denied")) << r.out;
    EXPECT_TRUE(Contains(r.out, "hint: the directory is read-only for you; pass " + c.option + " elsewhere")) << r.out;
  }
  EXPECT_TRUE(fs::is_empty(ro));
}

// A lock file another user's build left (the pack's `.lock`, kept between
// runs): flock needs no write access, so it is no reason to refuse.
TEST(Permissions, AnotherUsersLockFileIsTakenReadOnly) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("perm-lock");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  OpenToOthers(m, /*writable_dir=*/true);
  const std::string lock = m + "/" + std::string(kPackName) + ".lock";
  ASSERT_TRUE(fs::exists(lock));
  // Before: "cannot open lock file P.lock: Permission denied", exit 1, where
  // the pack and manifest are built and readable.
  CliRun r = AsNobody("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  // One this user may not even open: the owner and what to do are named.
  OwnerOnly(lock);
  r = AsNobody("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "cannot open lock file " + lock + ": Permission denied")) << r.out;
  EXPECT_TRUE(Contains(r.out, "it belongs to uid 0")) << r.out;
}

// A finished build in a directory this user may not write (a shared model
// directory, a read-only mount): its rerun writes nothing, so it is "already
// built", with or without the lock file the first build left; what would
// write there is still refused before any work, naming the option.
TEST(Permissions, AFinishedBuildInAReadOnlyDirectoryIsAlreadyBuilt) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("perm-ro-built");
  const std::string ro = Root() + "/perm-ro-built-out";
  fs::remove_all(ro);
  fs::create_directories(ro);
  const std::string full = "--pack " + Q(ro + "/x.pack") + " --manifest " + Q(ro + "/x.json");
  const std::string ranks = "--pack " + Q(ro + "/e.pack") + " --manifest " + Q(ro + "/e.json") +
                            " --ep-size 2 --ep-rank all";
  const std::string build = "build --progress none --safety-margin-gib 0 " + Q(m) + " ";
  ASSERT_EQ(Cli(build + full).code, 0);
  ASSERT_EQ(Cli(build + ranks).code, 0);
  OpenToOthers(m);
  OpenToOthers(ro);  // readable and searchable, not writable
  // Before: "--pack RO/x.pack: cannot write in RO: Permission denied", exit 1.
  for (const std::string& args : {build + full, build + ranks, "pack --progress none " + Q(m) + " --pack " +
                                                                   Q(ro + "/e.pack") + " --ep-size 2 --ep-rank all"}) {
    SCOPED_TRACE(args);
    CliRun r = AsNobody(args);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  }
  fs::remove(ro + "/x.pack.lock");
  CliRun r = AsNobody(build + full);
  EXPECT_EQ(r.code, 0) << r.out;
  // Not "use --force to rebuild": --force is refused there.
  EXPECT_TRUE(Contains(r.out, "already built: " + ro + "/x.json (read-only for you: rebuild it elsewhere)")) << r.out;
  struct Case {
    std::string args, option;
  };
  for (const Case& c : std::vector<Case>{{build + full + " --force", "--pack"},
                                         {build + full + " --restart", "--pack"},
                                         {build + "--pack " + Q(ro + "/x.pack") + " --manifest " + Q(ro + "/y.json"),
                                          "--manifest"}}) {
    SCOPED_TRACE(c.args);
    r = AsNobody(c.args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, ": cannot write in " + ro + ": Permission denied")) << r.out;
    EXPECT_TRUE(Contains(r.out, "hint: the directory is read-only for you; pass " + c.option + " elsewhere")) << r.out;
    EXPECT_FALSE(Contains(r.out, "EXPERT_PACK_BUILD_START")) << r.out;
  }
  // A judgement that would write (a damaged sidecar written anew) is refused
  // before it reads the pack, not after (hours at full scale).
  const std::string sidecar = ro + "/x.pack.digests";
  std::string bytes = FileBytes(sidecar);
  bytes[200] ^= 0x01;
  std::ofstream(sidecar, std::ios::binary | std::ios::trunc) << bytes;
  r = AsNobody(build + full);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "cannot write in " + ro + ": Permission denied, and judging the existing pack means "
                              "writing its digest sidecar anew"))
      << r.out;
  EXPECT_FALSE(Contains(r.out, "comparing every payload")) << r.out;
}

// The profile record synth writes says a scaled model is scaled; one this
// user may not read is not "no record".
TEST(Permissions, AnUnreadableProfileRecordIsNotTakenAsNone) {
  if (!CanRunAsNobody()) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("perm-profile");
  OpenToOthers(m, /*writable_dir=*/true);
  const std::string record = m + "/k3pack-profile.json";
  ASSERT_TRUE(fs::exists(record));
  OwnerOnly(record);
  // Before: build and doctor went on with the kimi-k3 profile and blamed the
  // config ("Kimi K3 model invariants do not match the audited model").
  for (const std::string& args : {"build --progress none --safety-margin-gib 0 " + Q(m), "doctor " + Q(m),
                                  "repair --fix ssm-a " + Q(m) + " " + Q(m + "/repaired")}) {
    SCOPED_TRACE(args);
    CliRun r = AsNobody(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "cannot open " + record + ": Permission denied")) << r.out;
    EXPECT_TRUE(Contains(r.out, "pass --profile")) << r.out;
    EXPECT_FALSE(Contains(r.out, "model invariants do not match")) << r.out;
    EXPECT_FALSE(fs::exists(m + "/" + kPackName)) << r.out;
  }
  // Told the profile, nothing needs the record.
  EXPECT_EQ(AsNobody("doctor --profile scaled " + Q(m)).code, 0);
}

}  // namespace
}  // namespace k3cli
