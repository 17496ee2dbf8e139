// The tiny synthetic model, made into a pack + manifest once per test suite
// by the real CLI (`synth`, then `build --profile scaled`): the fixture of
// the tests that run routed experts on a real pack.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "k3pack/gguf.h"
#include "k3pack/store.h"

namespace k3pack::store::testing_model {

class BuiltTinyModelTest : public ::testing::Test {
 protected:
  // `tag` names the temporary directory (one per suite and process).
  static void BuildModel(const std::string& tag) {
    namespace fs = std::filesystem;
    if (!fs::exists(K3PACK_BIN)) return;
    dir_ = (fs::temp_directory_path() / (tag + "-" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    const std::string model = dir_ + "/model";
    testing_cli::CliRun s = testing_cli::Cli("synth --preset tiny --seed 7 --out " + model);
    ASSERT_EQ(s.code, 0) << s.out;
    testing_cli::CliRun b =
        testing_cli::Cli("build --gguf-dir " + model + " --model-config " + model + "/config.json --tokenizer-dir " +
                         model + "/tokenizer --profile scaled --manifest " + dir_ + "/m.json --progress none");
    ASSERT_EQ(b.code, 0) << b.out;
    manifest_ = dir_ + "/m.json";
    pack_ = nlohmann::json::parse(std::ifstream(manifest_))["expert_pack"]["path"].get<std::string>();
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
    manifest_.clear();
    pack_.clear();
  }
  void SetUp() override {
    if (manifest_.empty()) GTEST_SKIP() << "k3pack CLI not built";
  }

  static std::shared_ptr<ExpertStore> OpenStore() {
    auto st = ExpertStore::Open(pack_, manifest_);
    EXPECT_TRUE(st.ok()) << st.error().message();
    return st.ok() ? *st : nullptr;
  }
  // The GGUF source the pack was built from.
  static gguf::ShardSet Source() {
    auto s = gguf::ShardSet::Open(dir_ + "/model");
    EXPECT_TRUE(s.ok()) << s.error().message();
    return std::move(s).value();
  }

  static inline std::string dir_, manifest_, pack_;
};

}  // namespace k3pack::store::testing_model
