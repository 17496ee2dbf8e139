// Path spellings users type (path-shape audit): a file input with a trailing
// '/', two spellings of one new output, an output at a pack's side file or in
// the tokenizer directory, `nox/..` with nox missing, a dangling link where a
// directory is made, names past the kernel's limits. Each is refused before
// anything is written, naming the option, the path and the rule.
#include <unistd.h>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// Runs `args` with `dir` as the current directory (relative spellings).
CliRun CliIn(const std::string& dir, const std::string& args) { return CliVia("cd " + Q(dir) + " &&", args); }

// A fresh, empty scratch directory.
std::string EmptyDir(const std::string& name) {
  const std::string d = Root() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Before: "--manifest M/m.json/ does not exist" with the hint "directory
// M/m.json does not exist either", while M/m.json is right there.
TEST(PathShapes, AFileInputWrittenWithASlashSaysItIsAFile) {
  const std::string& m = BuiltTinyModel();
  const std::string manifest = m + "/" + kManifestName;
  CliRun verify = Cli("verify --progress none " + Q(manifest + "/"));
  EXPECT_EQ(verify.code, 1) << verify.out;
  EXPECT_TRUE(Contains(verify.out, "--manifest " + manifest + "/ ends in '/', so it names a directory, but " +
                                       manifest + " is a file"))
      << verify.out;
  EXPECT_TRUE(Contains(verify.out, "hint: pass --manifest " + manifest + " (without the '/')")) << verify.out;
  EXPECT_FALSE(Contains(verify.out, "does not exist")) << verify.out;

  const std::string out = EmptyDir("slash-input-out");
  CliRun build = Cli("build --progress none " + Q(m) + " --pack " + Q(out + "/p.pack") + " --model-config " +
                     Q(m + "/config.json/"));
  EXPECT_EQ(build.code, 1) << build.out;
  EXPECT_TRUE(Contains(build.out, "--model-config " + m + "/config.json/ ends in '/', so it names a directory"))
      << build.out;
  // Where a directory is what the option takes, the hint does not offer the file.
  CliRun tokenizer = Cli("build --progress none " + Q(m) + " --pack " + Q(out + "/p.pack") + " --tokenizer-dir " +
                         Q(m + "/config.json/"));
  EXPECT_EQ(tokenizer.code, 1) << tokenizer.out;
  EXPECT_TRUE(Contains(tokenizer.out, "--tokenizer-dir " + m + "/config.json/ ends in '/', so it names a directory"))
      << tokenizer.out;
  EXPECT_TRUE(Contains(tokenizer.out, "hint: pass the Kimi tokenizer directory")) << tokenizer.out;
  CliRun repair = Cli("repair --fix ssm-a " + Q(Shard(m, 1) + "/") + " " + Q(out + "/r"));
  EXPECT_EQ(repair.code, 1) << repair.out;
  EXPECT_TRUE(Contains(repair.out, "IN " + Shard(m, 1) + "/ ends in '/', so it names a directory")) << repair.out;
  EXPECT_TRUE(fs::is_empty(out));
}

// The shard readers (inspect, dump-tensor, doctor) said a shard written with
// a trailing '/' "does not exist" (session 37).
TEST(PathShapes, AShardWrittenWithASlashSaysItIsAFile) {
  const std::string shard = Shard(BuiltTinyModel(), 1);
  for (const std::string cmd : {"inspect ", "dump-tensor "}) {
    CliRun r = Cli(cmd + Q(shard + "/") + (cmd == "inspect " ? "" : " blk.0.ssm_a"));
    EXPECT_EQ(r.code, 1) << cmd << r.out;
    EXPECT_TRUE(Contains(r.out, "GGUF path " + shard + "/ ends in '/', so it names a directory, but " + shard +
                                    " is a file"))
        << cmd << r.out;
    EXPECT_TRUE(Contains(r.out, "hint: pass " + shard + " (without the '/')")) << cmd << r.out;
  }
  CliRun doctor = Cli("doctor " + Q(shard + "/"));
  EXPECT_NE(doctor.code, 0) << doctor.out;
  EXPECT_TRUE(Contains(doctor.out, "it ends in '/', so it names a directory, but " + shard + " is a file"))
      << doctor.out;
}

// Before: `X` and `./X` compared unequal while neither existed, so the whole
// pack was written to X, and then the manifest was refused as written by
// "another process while this run went on".
TEST(PathShapes, TwoSpellingsOfOneNewOutputAreRefusedBeforeTheBuild) {
  const std::string m = FreshModel("two-spellings");
  const std::string out = EmptyDir("two-spellings-out");
  CliRun r = CliIn(out, "build --progress none " + Q(m) + " --pack X --manifest ./X");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest ./X is an input (--pack)")) << r.out;
  EXPECT_FALSE(Contains(r.out, "another process")) << r.out;
  EXPECT_TRUE(fs::is_empty(out));
}

// Before: only <pack>.digests was kept from being the manifest; <pack>.inputs
// was refused after the build ("another process wrote it"), <pack>.lock once
// the build had made it (and left it).
TEST(PathShapes, AManifestAtAPackSideFileIsRefusedBeforeTheBuild) {
  const std::string m = FreshModel("side-file-manifest");
  const std::string out = EmptyDir("side-file-manifest-out");
  for (const std::string side : {".inputs", ".lock", ".partial", ".partial.checkpoint"}) {
    const std::string pack = out + "/p.pack";
    CliRun r = Cli("build --progress none " + Q(m) + " --pack " + Q(pack) + " --manifest " + Q(pack + side));
    EXPECT_EQ(r.code, 1) << side << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, "--manifest " + pack + side + " is an input (--pack (its " + side + "))"))
        << side << ": " << r.out;
    EXPECT_TRUE(fs::is_empty(out)) << side << " left files behind";
  }
}

// `k3pack manifest` and the binding's create_manifest write a manifest for a
// pack that exists: at its .inputs with --force, the pack's inputs record was
// replaced, and every later build of that pack refused it ("it is a JSON
// document, not a k3pack record of a pack's inputs"). Refused as build does.
TEST(PathShapes, ManifestCommandRefusesAPackSideFileEvenWithForce) {
  const std::string m = FreshModel("manifest-side-file");
  ASSERT_EQ(Build(m).code, 0);
  std::string pack;
  for (const auto& e : fs::directory_iterator(m))
    if (e.path().extension() == ".pack") pack = e.path().string();
  ASSERT_FALSE(pack.empty());
  const auto before = Snapshot(m);
  for (const std::string side : {".inputs", ".lock", ".digests", ".partial"}) {
    CliRun r = Cli("manifest --progress none " + Q(m) + " --pack " + Q(pack) + " --model-config " +
                   Q(m + "/config.json") + " --tokenizer-dir " + Q(m + "/tokenizer") + " --manifest " +
                   Q(pack + side) + " --force");
    EXPECT_EQ(r.code, 1) << side << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, "--manifest " + pack + side + " is an input (--pack (its " + side + "))"))
        << side << ": " << r.out;
  }
  EXPECT_EQ(Snapshot(m), before);
  EXPECT_EQ(Build(m).code, 0);  // the pack's record is intact: still already built
}

// Before: `nox/../t.trace` with no nox was judged absent (the kernel finds
// nothing there), then the writer made nox (mkdir -p), found t.trace, and
// blamed another process; a run that succeeded left nox behind.
TEST(PathShapes, ADotDotAfterAMissingDirectoryIsRefusedUpFront) {
  const std::string d = EmptyDir("dotdot");
  ASSERT_EQ(CliIn(d, TraceGen("t.trace")).code, 0);
  const auto before = Snapshot(d);
  CliRun gen = CliIn(d, TraceGen("nox/../t.trace", "--seed 7"));
  EXPECT_EQ(gen.code, 1) << gen.out;
  EXPECT_TRUE(Contains(gen.out, "--trace nox/../t.trace: nox does not exist, so nox/.. names no directory"))
      << gen.out;
  EXPECT_TRUE(Contains(gen.out, "hint: write the path without it: --trace t.trace")) << gen.out;
  EXPECT_FALSE(Contains(gen.out, "another process")) << gen.out;
  CliRun synth = CliIn(d, "synth --progress none --out nox/../S");
  EXPECT_EQ(synth.code, 1) << synth.out;
  EXPECT_TRUE(Contains(synth.out, "nox does not exist")) << synth.out;
  EXPECT_EQ(Snapshot(d), before);
}

// Before: "cannot create directory DANG: File exists" (synth, load --dump,
// repair), which names neither the link nor the missing target.
TEST(PathShapes, ADanglingLinkWhereADirectoryIsMadeIsNamed) {
  const std::string& m = BuiltTinyModel();
  const std::string d = EmptyDir("dangling-dir");
  const std::string link = d + "/out";
  ASSERT_EQ(::symlink("nowhere", link.c_str()), 0);
  const std::vector<std::pair<std::string, std::string>> writers = {
      {"--out", "synth --progress none --out "},
      {"--dump", "load --progress none " + Q(m) + " --dump "},
      {"OUT", "repair --fix ssm-a " + Q(m) + " "},
  };
  for (const auto& [option, command] : writers) {
    CliRun r = Cli(command + Q(link));
    EXPECT_EQ(r.code, 1) << option << ": " << r.out;
    // The link's relative target is shown from here (session 39: it said
    // "nowhere", and "create nowhere first" meant ./nowhere).
    EXPECT_TRUE(Contains(r.out, option + " " + link + ": " + link + " is a symbolic link to " + d +
                                    "/nowhere, which does not exist"))
        << option << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, "hint: create " + d + "/nowhere first")) << option << ": " << r.out;
    EXPECT_FALSE(Contains(r.out, "File exists")) << option << ": " << r.out;
  }
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FALSE(fs::exists(d + "/nowhere"));
}

// A dangling link at a file output. Session 38: `build --pack DANG` said the
// pack "is not a valid pack of these shards: No such file or directory"; now
// every file writer names the link and its target, and --force replaces the
// link (never writing through it).
TEST(PathShapes, ADanglingLinkAtAFileOutputIsNamed) {
  const std::string& m = BuiltTinyModel();
  const std::string d = EmptyDir("dangling-file-out");
  const std::string link = d + "/p.pack";
  ASSERT_EQ(::symlink("gone/p.pack", link.c_str()), 0);
  CliRun build = Build(m, "--pack " + Q(link));
  EXPECT_EQ(build.code, 1) << build.out;
  EXPECT_TRUE(Contains(build.out, "refusing to overwrite existing " + link + " (--pack): it is a symbolic link to " +
                                      d + "/gone/p.pack, which does not exist"))
      << build.out;
  EXPECT_TRUE(Contains(build.out, "hint: pass --pack " + d + "/gone/p.pack to write there, or --force")) << build.out;
  EXPECT_FALSE(Contains(build.out, "not a valid pack")) << build.out;
  const std::string trace_link = d + "/t.trace";
  ASSERT_EQ(::symlink("gone/t.trace", trace_link.c_str()), 0);
  CliRun trace = Cli("trace gen --manifest " + Q(m + "/" + kManifestName) + " --trace " + Q(trace_link));
  EXPECT_EQ(trace.code, 1) << trace.out;
  EXPECT_TRUE(Contains(trace.out, "(--trace): it is a symbolic link to " + d + "/gone/t.trace")) << trace.out;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_symlink(trace_link));
  EXPECT_FALSE(fs::exists(d + "/gone"));
}

// Before: a link to a directory or to a shard at a file output was replaced
// by the output with --force (the link's name renamed over), while the
// directory or the shard named itself was refused even with it.
TEST(PathShapes, ALinkToADirectoryOrAnotherKindOfFileIsRefusedEvenWithForce) {
  const std::string& m = BuiltTinyModel();
  const std::string d = EmptyDir("link-outputs");
  const std::string to_dir = d + "/to-dir", to_shard = d + "/to-shard";
  ASSERT_EQ(::symlink((m + "/tokenizer").c_str(), to_dir.c_str()), 0);
  ASSERT_EQ(::symlink(Shard(m, 1).c_str(), to_shard.c_str()), 0);
  CliRun dir = Cli(TraceGen(to_dir, "--force"));
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_TRUE(Contains(dir.out, "--trace " + to_dir + " is a symbolic link to a directory, not to a file")) << dir.out;
  CliRun manifest = Cli("build --progress none " + Q(m) + " --manifest " + Q(to_dir) + " --force");
  EXPECT_EQ(manifest.code, 1) << manifest.out;
  EXPECT_TRUE(Contains(manifest.out, "--manifest " + to_dir + " is a symbolic link to a directory")) << manifest.out;
  CliRun shard = Cli(TraceGen(to_shard, "--force"));
  EXPECT_EQ(shard.code, 1) << shard.out;
  EXPECT_TRUE(Contains(shard.out, "it is a GGUF file, not a routing trace")) << shard.out;
  EXPECT_TRUE(fs::is_symlink(to_dir));
  EXPECT_TRUE(fs::is_symlink(to_shard));
}

// Before: a file name over 255 bytes (or a path of 4096) was found only by
// the final rename, after the whole run: "cannot move it into place: File name
// too long"; `build --pack LONG/x.pack` said its manifest "is an input
// (--pack)" (both paths failed to resolve, as the same empty path).
TEST(PathShapes, NamesPastTheKernelLimitsAreRefusedBeforeTheRun) {
  const std::string d = EmptyDir("past-limits");
  const std::string long_name = std::string(300, 'a') + ".trace";
  CliRun name = CliIn(d, TraceGen(long_name));
  EXPECT_EQ(name.code, 1) << name.out;
  EXPECT_TRUE(Contains(name.out, "bytes, past the 255-byte limit of a file name")) << name.out;
  EXPECT_FALSE(Contains(name.out, "cannot move it into place")) << name.out;

  std::string deep;
  while (deep.size() < 4200) deep += std::string(90, 'd') + "/";
  CliRun path = CliIn(d, TraceGen(deep + "x.trace"));
  EXPECT_EQ(path.code, 1) << path.out.substr(0, 400);
  EXPECT_TRUE(Contains(path.out, "-byte limit of a path")) << path.out.substr(0, 400);

  const std::string m = FreshModel("past-limits-model");
  CliRun pack = CliIn(d, "build --progress none " + Q(m) + " --pack " + Q(deep + "x.pack"));
  EXPECT_EQ(pack.code, 1) << pack.out.substr(0, 400);
  EXPECT_TRUE(Contains(pack.out, "--pack " + deep + "x.pack: the path is")) << pack.out.substr(0, 400);
  EXPECT_FALSE(Contains(pack.out, "is an input")) << pack.out.substr(0, 400);
  EXPECT_TRUE(fs::is_empty(d));
}

// Before: the manifest was written into the tokenizer directory it records:
// `verify` refused it ("has a file the manifest does not record") and a rerun
// of the same build called it an input.
TEST(PathShapes, AManifestInTheTokenizerDirectoryIsRefused) {
  const std::string m = FreshModel("manifest-in-tokenizer");
  const std::string tok = m + "/tokenizer";
  const auto before = Snapshot(m);
  CliRun explicit_path = Build(m, "--manifest " + Q(tok + "/m.json"));
  EXPECT_EQ(explicit_path.code, 1) << explicit_path.out;
  EXPECT_TRUE(Contains(explicit_path.out, "--manifest " + tok + "/m.json is in --tokenizer-dir " + tok + ": the "
                                          "manifest records every file of that directory"))
      << explicit_path.out;
  // The default manifest goes beside the pack.
  CliRun beside_pack = Build(m, "--pack " + Q(tok + "/p.pack"));
  EXPECT_EQ(beside_pack.code, 1) << beside_pack.out;
  EXPECT_TRUE(Contains(beside_pack.out, "is in --tokenizer-dir")) << beside_pack.out;
  // Session 38: a pack there with its manifest elsewhere was built, and the
  // manifest recorded (and hashed) the pack and its sidecars as tokenizer files.
  CliRun pack_there = Build(m, "--pack " + Q(tok + "/p.pack") + " --manifest " + Q(m + "/elsewhere.json"));
  EXPECT_EQ(pack_there.code, 1) << pack_there.out;
  EXPECT_TRUE(Contains(pack_there.out, "--pack " + tok + "/p.pack is in --tokenizer-dir " + tok +
                                           ": the manifest records every file of that directory, so the pack"))
      << pack_there.out;
  EXPECT_EQ(Snapshot(m), before);

  ASSERT_EQ(Build(m).code, 0);
  CliRun manifest = Cli("manifest --progress none " + Q(m) + " --model-config " + Q(m + "/config.json") +
                        " --tokenizer-dir " + Q(tok) + " --manifest " + Q(tok + "/m.json"));
  EXPECT_EQ(manifest.code, 1) << manifest.out;
  EXPECT_TRUE(Contains(manifest.out, "is in --tokenizer-dir")) << manifest.out;
  EXPECT_FALSE(fs::exists(tok + "/m.json"));
}

// Session 38: a newline in an output's name was written, and split the
// `EXPERT_PACK_READY path=...` line that scripts read. Every output refuses a control character before any work.
TEST(PathShapes, AControlCharacterInAnOutputNameIsRefusedBeforeTheRun) {
  const std::string& m = BuiltTinyModel();
  const std::string out = EmptyDir("control-char-out");
  CliRun pack = Pack(m, "--pack " + Q(out + "/a\nb.pack"));
  EXPECT_EQ(pack.code, 1) << pack.out;
  EXPECT_TRUE(Contains(pack.out, "--pack " + out + "/a\\x0ab.pack: the name holds a control character (\\x0a)"))
      << pack.out;
  CliRun trace = Cli("trace gen --manifest " + Q(m + "/" + kManifestName) + " --trace " +
                     Q(out + "/t\tx.trace"));
  EXPECT_EQ(trace.code, 1) << trace.out;
  EXPECT_TRUE(Contains(trace.out, "--trace " + out + "/t\\x09x.trace: the name holds a control character"))
      << trace.out;
  EXPECT_TRUE(fs::is_empty(out));
}

}  // namespace
}  // namespace k3cli
