// Soak tests of the pipeline's one-shot calls run many times in one process
// (session 32 resource-leak audit): the GGUF reader, the non-routed weight
// stream, manifest creation, verify, doctor and the pack build on the tiny
// synthetic model, and their failures on broken inputs. After each loop the
// process's descriptors, threads, mappings and resident memory must be back
// where they were (tests/process_resources.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "../process_resources.h"
#include "../store/built_tiny_model.h"
#include "k3pack/doctor.h"
#include "k3pack/gguf.h"
#include "k3pack/loader.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"

namespace k3pack {
namespace {

namespace fs = std::filesystem;
using testing_resources::CameBack;
using testing_resources::ProcessResources;

class PipelineSoak : public store::testing_model::BuiltTinyModelTest {
 protected:
  static void SetUpTestSuite() {
    testing_resources::UseOneMallocArena();
    BuildModel("k3-pipeline-soak");
  }

  static std::string Model() { return dir_ + "/model"; }

  // Runs `once` a first time (what stays for the process: locale, thread
  // pools' first arenas), then `rounds` times, and compares.
  static void Soak(int rounds, const std::function<void()>& once, int map_slack = 4) {
    once();
    if (::testing::Test::HasFatalFailure()) return;
    const ProcessResources before = ProcessResources::Now();
    for (int i = 0; i < rounds && !::testing::Test::HasFatalFailure(); ++i) once();
    const ProcessResources after = testing_resources::SettledAfter(before, map_slack);
    EXPECT_TRUE(CameBack(before, after, map_slack)) << "before " << before << ", after " << after;
  }

  // A copy of the model with one shard cut short (a broken checkpoint).
  static std::string BrokenModel() {
    const std::string broken = dir_ + "/broken";
    if (!fs::exists(broken)) {
      fs::copy(Model(), broken, fs::copy_options::recursive);
      const std::string shard = broken + "/KIMI-K3-SYNTH-00002-of-00003.gguf";
      fs::resize_file(shard, fs::file_size(shard) / 2);
    }
    return broken;
  }
};

TEST_F(PipelineSoak, ShardSetOpensLeaveNothingBehind) {
  Soak(300, [] {
    auto s = gguf::ShardSet::Open(Model());
    ASSERT_TRUE(s.ok()) << s.error().message();
    ASSERT_GT(s->AllTensors().size(), 0u);
  });
  const std::string broken = BrokenModel();
  Soak(300, [&] { ASSERT_FALSE(gguf::ShardSet::Open(broken).ok()); });
}

TEST_F(PipelineSoak, NonExpertStreamsWholeAndAbandonedLeaveNothingBehind) {
  for (const bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verify_metadata" : "plain");
    loader::LoadOptions o;
    o.verify_metadata = verify;
    int round = 0;
    Soak(40, [&] {
      auto st = loader::NonExpertStream::Open(manifest_, o);
      ASSERT_TRUE(st.ok()) << st.error().message();
      // Odd rounds stop half way (a caller that broke out of its loop).
      const int stop_at = (round++ % 2) ? 5 : -1;
      std::vector<loader::NamedTensor> kept;  // views outliving the stream
      for (int n = 0;; ++n) {
        auto t = st->Next();
        ASSERT_TRUE(t.ok()) << t.error().message();
        if (!t->has_value() || n == stop_at) break;
        if (n < 3) kept.push_back(std::move(**t));
      }
    });
  }
}

TEST_F(PipelineSoak, NonExpertStreamOverABrokenCheckpointLeavesNothingBehind) {
  // The manifest of the intact model, its shards swapped for the broken copy's.
  const std::string broken = BrokenModel();
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest_));
  for (auto& s : m["source"]["shards"]) {
    std::string p = s["path"];
    s["path"] = broken + "/" + fs::path(p).filename().string();
  }
  const std::string broken_manifest = dir_ + "/broken.json";
  std::ofstream(broken_manifest) << m.dump(2);
  Soak(200, [&] {
    auto st = loader::NonExpertStream::Open(broken_manifest);
    if (!st.ok()) return;
    Status s = st->ForEach([](loader::NamedTensor&&) { return Status::OK(); });
    ASSERT_FALSE(s.ok());
  });
}

TEST_F(PipelineSoak, CreateManifestVerifyAndDoctorLeaveNothingBehind) {
  manifest::CreateOptions c;
  c.gguf_dir = Model();
  c.expert_pack = pack_;
  c.model_config = Model() + "/config.json";
  c.tokenizer_dir = Model() + "/tokenizer";
  c.profile = kimi::Profile::kScaled;
  c.full_source_hashes = true;
  Soak(10, [&] {
    auto r = manifest::CreateManifest(c);
    ASSERT_TRUE(r.ok()) << r.error().message();
  });
  for (const bool full : {false, true}) {
    manifest::VerifyPackOptions v;
    v.full = full;
    v.against_source = full;
    Soak(15, [&] {
      auto r = manifest::VerifyPack(manifest_, v);
      ASSERT_TRUE(r.ok()) << r.error().message();
    });
  }
  doctor::DiagnoseOptions d;
  d.profile = kimi::Profile::kScaled;
  Soak(10, [&] {
    doctor::Report r = doctor::Diagnose({Model(), manifest_}, d);
    ASSERT_FALSE(r.unusable) << r.ToText();
  });
  const std::string broken = BrokenModel();
  Soak(20, [&] { (void)doctor::Diagnose({broken}, d); });
}

TEST_F(PipelineSoak, PackBuildsAndFailedBuildsLeaveNothingBehind) {
  auto experts = pack::CollectExpertsFromGguf(Model(), Model() + "/config.json", kimi::Profile::kScaled);
  ASSERT_TRUE(experts.ok()) << experts.error().message();
  const std::string out = dir_ + "/soak-out/p.expert-major.pack";
  // A build starts and joins threads; glibc keeps up to 40 MiB of freed
  // thread stacks for reuse, each two mappings (stack, guard page), so the
  // count wanders by up to about 10 from build to build (8 builds once
  // ended 6 above the start with slack 4). 24 builds against a slack of 12:
  // a mapping kept per build still shows.
  Soak(24, [&] {
    pack::BuildOptions o;
    o.out_path = out;
    o.safety_margin_gib = 0;
    o.replace_existing = true;
    o.hash_sources = true;
    auto r = pack::BuildPack(*experts, o);
    ASSERT_TRUE(r.ok()) << r.error().message();
  }, /*map_slack=*/12);
  // A build whose output directory is a file fails before the copy; one
  // from the broken checkpoint fails to collect.
  const std::string blocker = dir_ + "/blocker";
  std::ofstream(blocker) << "x";
  Soak(100, [&] {
    pack::BuildOptions o;
    o.out_path = blocker + "/p.expert-major.pack";
    o.safety_margin_gib = 0;
    ASSERT_FALSE(pack::BuildPack(*experts, o).ok());
  });
  const std::string broken = BrokenModel();
  Soak(100, [&] {
    ASSERT_FALSE(pack::CollectExpertsFromGguf(broken, broken + "/config.json", kimi::Profile::kScaled).ok());
  });
}

}  // namespace
}  // namespace k3pack
