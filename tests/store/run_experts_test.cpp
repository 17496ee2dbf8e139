// Pack-vs-source routed-expert forward on the synthetic model: the store's
// bytes and the GGUF source's bytes give identical outputs for every layer,
// and corrupted payload bytes of a routed expert are caught.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "k3pack/gguf.h"
#include "k3pack/pack.h"
#include "k3pack/run_experts.h"
#include "pack/format.h"
#include "../cli_run.h"
#include "built_tiny_model.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;

using testing_cli::Cli;
using testing_cli::CliRun;

class RunExpertsTest : public testing_model::BuiltTinyModelTest {
 protected:
  static void SetUpTestSuite() { BuildModel("k3-run-experts"); }


  // Corrupts the middle of (layer, expert)'s down projection in the pack.
  static void CorruptDown(uint32_t layer, uint32_t expert) {
    std::fstream f(pack_, std::ios::in | std::ios::out | std::ios::binary);
    std::array<uint8_t, pack::kHeaderBytes> hb;
    f.read(reinterpret_cast<char*>(hb.data()), hb.size());
    auto h = pack::DecodeHeader(hb);
    ASSERT_TRUE(h.ok());
    const std::string want = pack::ExpertTensorName(layer, pack::Role::kDown);
    for (uint64_t i = 0; i < h->index_count; ++i) {
      std::array<uint8_t, pack::kEntryBytes> eb;
      f.seekg(static_cast<std::streamoff>(pack::kHeaderBytes + i * pack::kEntryBytes));
      f.read(reinterpret_cast<char*>(eb.data()), eb.size());
      auto e = pack::DecodeEntry(eb);
      ASSERT_TRUE(e.ok());
      if (e->name != want || e->expert != static_cast<int32_t>(expert)) continue;
      // Invert 4 KiB in the middle of the matrix: one flipped byte can land on
      // a sub-block whose scale is zero and change nothing; 4 KiB cannot.
      const auto at = static_cast<std::streamoff>(e->offset + e->nbytes / 2);
      std::string bytes(4096, '\0');
      f.seekg(at);
      f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      for (char& c : bytes) c = static_cast<char>(~c);
      f.seekp(at);
      f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      return;
    }
    FAIL() << "no pack entry " << want << " expert " << expert;
  }

};

TEST_F(RunExpertsTest, EveryLayerMatchesTheSourceBitForBit) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  ASSERT_FALSE(store->info().active_layer_ids.empty());
  for (bool quantized : {true, false}) {
    for (uint32_t layer : store->info().active_layer_ids) {
      ExpertRunOptions o;
      o.layer = layer;
      o.tokens = 3;
      o.seed = 11 + layer;
      o.quantize_activations = quantized;
      auto r = RunRoutedExperts(*store, source, o);
      ASSERT_TRUE(r.ok()) << r.error().message();
      EXPECT_TRUE(r->matches()) << "layer " << layer << ": " << r->mismatched_values << " values differ";
      EXPECT_EQ(r->store_sha256, r->source_sha256);
      ASSERT_EQ(r->from_store.size(), size_t{3} * static_cast<size_t>(r->latent));
      double mag = 0;
      for (float v : r->from_store) mag += std::fabs(v);
      EXPECT_GT(mag, 0) << "an all-zero output would prove nothing";
      ASSERT_EQ(r->routed.size(), 3u);
      for (const auto& experts : r->routed) {
        EXPECT_EQ(experts.size(), r->top_k);
        EXPECT_EQ(std::set<uint32_t>(experts.begin(), experts.end()).size(), experts.size());
      }
      std::set<uint32_t> distinct;
      for (const auto& experts : r->routed) distinct.insert(experts.begin(), experts.end());
      EXPECT_EQ(r->hits + r->misses, distinct.size()) << "the store counts each distinct object of a call once";
    }
  }
  ASSERT_TRUE(store->Close().ok());
}

TEST_F(RunExpertsTest, UnknownLayerNamesTheMissingTensor) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  ExpertRunOptions o;
  o.layer = 999;
  auto r = RunRoutedExperts(*store, source, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("blk.999.ffn_up_exps.weight"), std::string::npos) << r.error().message();
}

// Runs last in this suite (it corrupts the shared pack).
TEST_F(RunExpertsTest, ZCorruptedPayloadIsCaughtOnlyInItsLayer) {
  CliRun ok = Cli("run-experts --manifest " + manifest_ + " --all-layers --tokens 2 --json");
  ASSERT_EQ(ok.code, 0) << ok.out;
  auto j = nlohmann::json::parse(ok.out);
  ASSERT_TRUE(j["all_match"].get<bool>());
  ASSERT_GE(j["layers"].size(), 2u);
  const uint32_t bad_layer = j["layers"][0]["layer"].get<uint32_t>();
  const uint32_t bad_expert = j["layers"][0]["routed_experts"][0][0].get<uint32_t>();
  CorruptDown(bad_layer, bad_expert);

  // The store checks each object it reads against the digest sidecar's
  // CRC32Cs: the damaged object is refused, by layer and expert.
  CliRun refused = Cli("run-experts --manifest " + manifest_ + " --all-layers --tokens 2 --json");
  EXPECT_NE(refused.code, 0) << refused.out;
  EXPECT_NE(refused.out.find("expert-pack object (layer " + std::to_string(bad_layer) + ", expert " +
                             std::to_string(bad_expert) + ") is damaged: down payload at file offset "),
            std::string::npos)
      << refused.out;
  // Without the sidecar (as SGLang's store), the comparison with the GGUF
  // source is what catches it, in its layer only.
  const std::string sidecar = pack::DigestsPathFor(pack_);
  std::filesystem::rename(sidecar, sidecar + ".off");
  CliRun bad = Cli("run-experts --manifest " + manifest_ + " --all-layers --tokens 2 --json");
  EXPECT_EQ(bad.code, 1) << bad.out;
  auto bj = nlohmann::json::parse(bad.out);
  EXPECT_FALSE(bj["all_match"].get<bool>());
  for (const auto& layer : bj["layers"]) {
    const bool is_bad = layer["layer"].get<uint32_t>() == bad_layer;
    EXPECT_EQ(layer["matches_source"].get<bool>(), !is_bad) << layer.dump();
    if (is_bad) {
      EXPECT_GT(layer["mismatched_values"].get<uint64_t>(), 0u);
    }
  }
  CliRun text = Cli("run-experts --manifest " + manifest_ + " --layer " + std::to_string(bad_layer) + " --tokens 2");
  EXPECT_EQ(text.code, 1);
  EXPECT_NE(text.out.find("MISMATCH"), std::string::npos) << text.out;
  std::filesystem::rename(sidecar + ".off", sidecar);
}

}  // namespace
}  // namespace k3pack::store
