// The crash-consistency audit (SIGKILL at every rename/unlink/fsync, ENOSPC
// injection) of pack, build, ep-merge, repair and synth, through the real
// binary: a user's file at a sidecar path is never replaced, a --force run
// stopped early can be rerun, a pack of edited shards is not reused, an
// unfinished repair or synth is finished by the rerun, a merge replacing a
// pack never pairs it with the other pack's digests, and leftovers of
// killed writers are cleaned by the next run.
#include "cli_fixture.h"
#include "../forked_child.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace k3cli {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

bool HasTempFiles(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".tmp") return true;
  }
  return false;
}

std::string PackArgs(const std::string& model, const std::string& pack) {
  return "pack --progress none --safety-margin-gib 0 --gguf-dir " + Q(model) + " --model-config " +
         Q(model + "/config.json") + " --pack " + Q(pack);
}

std::string BuildArgs(const std::string& model, const std::string& pack, const std::string& manifest) {
  return "build --progress none --safety-margin-gib 0 --gguf-dir " + Q(model) + " --model-config " +
         Q(model + "/config.json") + " --tokenizer-dir " + Q(model + "/tokenizer") + " --pack " + Q(pack) +
         " --manifest " + Q(manifest);
}

// Item 1: pack, build and ep-merge replaced or deleted a user's file at
// `<pack>.digests`, `<pack>.partial.digests`, `<pack>.partial.checkpoint.spare`;
// one at `<pack>.partial` was taken for a build and --restart deleted it.
TEST(CrashConsistency, AUserFileAtASidecarPathIsNeverReplacedNotEvenWithForce) {
  const std::string m = FreshModel("cc-user");
  const std::string d = Root() + "/cc-user-out";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string p = d + "/p.pack";
  for (const std::string suffix : {".digests", ".partial", ".partial.digests", ".partial.checkpoint",
                                   ".partial.checkpoint.spare"}) {
    for (const std::string extra : {"", " --force", " --force --restart"}) {
      SCOPED_TRACE(suffix + extra);
      WriteText(p + suffix, "USER DATA\n");
      CliRun r = Cli(PackArgs(m, p) + extra);
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + p + suffix)) << r.out;
      EXPECT_TRUE(Contains(r.out, "k3pack replaces only a file of the kind it writes")) << r.out;
      EXPECT_EQ(ReadAll(p + suffix), "USER DATA\n");
      EXPECT_FALSE(fs::exists(p)) << "nothing may be copied before the refusal";
      fs::remove(p + suffix);
    }
  }
  // build, the same rule.
  WriteText(p + ".digests", "USER DATA\n");
  CliRun b = Cli(BuildArgs(m, p, d + "/m.json") + " --force");
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_TRUE(Contains(b.out, "refusing to overwrite existing " + p + ".digests")) << b.out;
  EXPECT_EQ(ReadAll(p + ".digests"), "USER DATA\n");
  // A directory where the sidecar goes: found up front, not after the copy.
  fs::remove(p + ".digests");
  fs::create_directories(p + ".digests");
  CliRun dir = Cli(PackArgs(m, p));
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_TRUE(Contains(dir.out, "it is a directory")) << dir.out;
  EXPECT_FALSE(fs::exists(p + ".partial"));
  fs::remove(p + ".digests");

  // ep-merge.
  const std::string e = Root() + "/cc-user-ep";
  fs::remove_all(e);
  ASSERT_EQ(Cli(PackArgs(m, e + "/m.pack") + " --ep-size 2 --ep-rank all").code, 0);
  WriteText(e + "/m.pack.digests", "USER DATA\n");
  for (const std::string extra : {"", " --force"}) {
    CliRun r = Cli("ep-merge --progress none " + Q(e + "/m.ep0-of-2.pack") + " " + Q(e + "/m.ep1-of-2.pack") + extra);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + e + "/m.pack.digests")) << r.out;
    EXPECT_EQ(ReadAll(e + "/m.pack.digests"), "USER DATA\n");
    EXPECT_FALSE(fs::exists(e + "/m.pack"));
  }
}

// Item 2: `ep-merge --force` over a merged pack wrote the new sidecar before
// renaming the new pack: a kill between left the old pack with the new
// digests (read as damaged throughout). Now every kill point leaves a pack
// with its own sidecar or none.
TEST(CrashConsistency, EpMergeForceKilledBetweenItsFilesNeverPairsAPackWithOtherDigests) {
  const std::string a = Root() + "/cc-merge-a", b = Root() + "/cc-merge-b";
  fs::remove_all(a);
  fs::remove_all(b);
  ASSERT_EQ(Cli("synth --preset tiny --seed 2 --out " + Q(b + "/model")).code, 0);
  ASSERT_EQ(Cli(PackArgs(BaseModel(), a + "/m.pack") + " --ep-size 2 --ep-rank all").code, 0);
  ASSERT_EQ(Cli(PackArgs(b + "/model", b + "/m.pack") + " --ep-size 2 --ep-rank all").code, 0);
  auto merge = [](const std::string& dir, const std::string& out, const std::string& extra = "") {
    return "ep-merge --progress none " + Q(dir + "/m.ep0-of-2.pack") + " " + Q(dir + "/m.ep1-of-2.pack") +
           " --pack " + Q(out) + extra;
  };
  ASSERT_EQ(Cli(merge(a, a + "/m.pack")).code, 0);
  ASSERT_EQ(Cli(merge(b, b + "/m.pack")).code, 0);
  const std::string a_pack = ReadAll(a + "/m.pack"), a_dig = ReadAll(a + "/m.pack.digests");
  const std::string b_pack = ReadAll(b + "/m.pack"), b_dig = ReadAll(b + "/m.pack.digests");
  ASSERT_NE(a_dig, b_dig);

  const std::string out = Root() + "/cc-merge-out";
  fs::remove_all(out);
  fs::create_directories(out);
  ASSERT_EQ(Cli(merge(a, out + "/m.pack")).code, 0);
  CliRun killed = CliVia("env K3PACK_TEST_KILL_IN_MERGE=1", merge(b, out + "/m.pack", " --force"));
  ASSERT_NE(killed.code, 0) << killed.out;
  const std::string pack = ReadAll(out + "/m.pack");
  const bool sidecar = fs::exists(out + "/m.pack.digests");
  const std::string dig = ReadAll(out + "/m.pack.digests");
  ASSERT_TRUE(pack == a_pack || pack == b_pack);
  if (sidecar) {
    EXPECT_EQ(dig, pack == a_pack ? a_dig : b_dig) << "the pack was left with the other pack's digests";
  }
  CliRun rerun = Cli(merge(b, out + "/m.pack", " --force"));
  ASSERT_EQ(rerun.code, 0) << rerun.out;
  EXPECT_TRUE(ReadAll(out + "/m.pack") == b_pack);
  EXPECT_EQ(ReadAll(out + "/m.pack.digests"), b_dig);
  EXPECT_FALSE(HasTempFiles(out));
}

// Item 3: a `pack --force` stopped before `<pack>.partial` existed (its
// checkpoint made, then a full disk) was refused on every rerun, even with
// --force --restart: "refusing to overwrite existing Expert Pack".
TEST(CrashConsistency, AForceRebuildStoppedBeforeItsPartialExistedIsFinishedByTheRerun) {
  const std::string m = FreshModel("cc-force");
  for (const std::string command : {"pack", "build"}) {
    SCOPED_TRACE(command);
    const std::string d = Root() + "/cc-force-" + command;
    fs::remove_all(d);
    fs::create_directories(d);
    const std::string p = d + "/p.pack";
    const std::string args = command == "pack" ? PackArgs(m, p) : BuildArgs(m, p, d + "/m.json");
    ASSERT_EQ(Cli(args).code, 0);
    // The state a kill right after the checkpoint's creation leaves: the
    // checkpoint (no object done), no partial pack, no journal.
    CliRun full = CliVia("env K3PACK_TEST_ENOSPC_AFTER_BYTES=0", args + " --force");
    ASSERT_EQ(full.code, 1) << full.out;
    fs::remove(p + ".partial");
    fs::remove(p + ".partial.digests");
    ASSERT_TRUE(fs::exists(p + ".partial.checkpoint"));
    CliRun rerun = Cli(args + " --force");
    EXPECT_EQ(rerun.code, 0) << rerun.out;
    EXPECT_FALSE(fs::exists(p + ".partial.checkpoint"));
    EXPECT_FALSE(fs::exists(p + ".partial.checkpoint.spare"));
  }
}

// Item 5: a repair killed before its record (written last) left OUT refused
// by every rerun as "other files"; a synth killed between naming and
// renaming its marker left only the marker's temporary, refused too.
TEST(CrashConsistency, AnUnfinishedRepairOrSynthIsFinishedByTheRerun) {
  const std::string broken = Root() + "/cc-broken", out = Root() + "/cc-repaired";
  fs::remove_all(broken);
  fs::remove_all(out);
  ASSERT_EQ(Cli("synth --preset tiny --seed 1 --fault raw-ssm-a --out " + Q(broken)).code, 0);
  const std::string repair = "repair " + Q(broken) + " " + Q(out) + " --fix ssm-a";
  ASSERT_EQ(Cli(repair).code, 0);
  const auto repaired = Snapshot(out);
  // Killed after its last shard, before the record: the marker stays.
  const std::string marker = ReadAll(out + "/.k3pack-repair.partial");
  ASSERT_TRUE(marker.empty()) << "the finished repair removes its marker";
  fs::remove(out + "/k3pack-repair.json");
  WriteText(out + "/.k3pack-repair.partial", "{\"k3pack_repair_in_progress\": null}\n");
  for (const std::string extra : {"", " --force"}) {
    CliRun r = Cli(repair + extra);
    EXPECT_EQ(r.code, 0) << extra << ": " << r.out;
    EXPECT_EQ(Snapshot(out), repaired) << extra;
    fs::remove(out + "/k3pack-repair.json");
    WriteText(out + "/.k3pack-repair.partial", "{\"k3pack_repair_in_progress\": null}\n");
  }
  // Killed before the marker's rename: only its temporary is there.
  fs::remove_all(out);
  fs::create_directories(out);
  WriteText(out + "/.k3pack-repair.partial." + std::to_string(k3test::DeadPid()) + ".0.tmp", "{}");
  CliRun r = Cli(repair);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Snapshot(out), repaired);

  const std::string s = Root() + "/cc-synth";
  fs::remove_all(s);
  fs::create_directories(s);
  WriteText(s + "/.k3pack-synth.partial." + std::to_string(k3test::DeadPid()) + ".0.tmp", "k3pack synth");
  CliRun synth = Cli("synth --preset tiny --seed 1 --progress none --out " + Q(s));
  EXPECT_EQ(synth.code, 0) << synth.out;
  EXPECT_FALSE(HasTempFiles(s));
  EXPECT_FALSE(fs::exists(s + "/.k3pack-synth.partial"));
}

// Review: the record of a --force repair listed every file in OUT, a user's
// too, and the next --force removed it as the old output's; and a --force
// over an output of another shard prefix reported several-shard-sets (its
// check ran while the old set was still there).
TEST(CrashConsistency, RepairForceNeverTakesAUsersFileAndJudgesTheSetItLeaves) {
  const std::string a = Root() + "/cc-rf-a", b = Root() + "/cc-rf-b", out = Root() + "/cc-rf-out";
  for (const auto& d : {a, b, out}) fs::remove_all(d);
  ASSERT_EQ(Cli("synth --preset tiny --seed 1 --fault raw-ssm-a --out " + Q(a)).code, 0);
  ASSERT_EQ(Cli("synth --preset tiny --seed 2 --fault raw-ssm-a --prefix OTHER --out " + Q(b)).code, 0);
  ASSERT_EQ(Cli("repair " + Q(a) + " " + Q(out) + " --fix ssm-a").code, 0);
  WriteText(out + "/notes.txt", "mine\n");
  CliRun other = Cli("repair " + Q(b) + " " + Q(out) + " --fix ssm-a --force --json");
  ASSERT_EQ(other.code, 0) << other.out;
  EXPECT_FALSE(Contains(other.out, "several-shard-sets")) << other.out;
  EXPECT_FALSE(Contains(ReadAll(out + "/k3pack-repair.json"), "notes.txt"));
  CliRun back = Cli("repair " + Q(a) + " " + Q(out) + " --fix ssm-a --force");
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_EQ(ReadAll(out + "/notes.txt"), "mine\n");
  EXPECT_FALSE(fs::exists(out + "/OTHER-00001-of-00003.gguf"));
}

// Review: a side file k3pack cannot read read as empty, which is what a
// crash leaves, so it was replaced. Root reads everything: run as nobody.
TEST(CrashConsistency, AnUnreadableSideFileIsNeverTakenForOurs) {
  if (::geteuid() != 0 || !fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("cc-unreadable");
  const std::string d = Root() + "/cc-unreadable-out";
  fs::remove_all(d);
  fs::create_directories(d);
  for (const auto& e : fs::recursive_directory_iterator(m)) {
    fs::permissions(e.path(), fs::perms::others_read, fs::perm_options::add);
    if (e.is_directory()) fs::permissions(e.path(), fs::perms::others_exec, fs::perm_options::add);
  }
  for (const std::string& dir : {Root(), m}) fs::permissions(dir, fs::perms::others_read | fs::perms::others_exec,
                                                             fs::perm_options::add);
  fs::permissions(d, fs::perms::all);
  const std::string p = d + "/p.pack";
  WriteText(p + ".digests", "USER DATA\n");
  fs::permissions(p + ".digests", fs::perms::owner_read | fs::perms::owner_write);  // root's, unreadable to nobody
  CliRun r = CliVia("/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups", PackArgs(m, p) + " --force");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "it cannot be read, so k3pack cannot tell it is a k3pack digest sidecar")) << r.out;
  fs::permissions(p + ".digests", fs::perms::owner_read, fs::perm_options::add);
  EXPECT_EQ(ReadAll(p + ".digests"), "USER DATA\n");
}

// Item 6: a killed writer's `<out>.<pid>.<n>.tmp` stayed for good, and so did
// a checkpoint's spare left by a kill in the finalize.
TEST(CrashConsistency, LeftoversOfKilledWritersAreRemovedByTheNextRun) {
  const std::string m = FreshModel("cc-leftover");
  const std::string d = Root() + "/cc-leftover-out";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string p = d + "/p.pack";
  ASSERT_EQ(Cli(PackArgs(m, p)).code, 0);
  WriteText(p + ".partial.checkpoint.spare", std::string(4096, '\0'));
  const std::string dead = d + "/m.json." + std::to_string(k3test::DeadPid()) + ".3.tmp";
  const std::string live = d + "/m.json." + std::to_string(::getpid()) + ".3.tmp";
  WriteText(dead, "{}");
  WriteText(live, "{}");
  CliRun r = Cli(BuildArgs(m, p, d + "/m.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(p + ".partial.checkpoint.spare"));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live)) << "a running writer's temporary is its own";
}

}  // namespace
}  // namespace k3cli
