// A Repeatable() option (src/cli/command.h): every occurrence is kept, in
// order, where any other option given twice with two values is refused.
// `synth --layer-expert-types` is one; it used to be pulled out of argv
// before parsing, and is now declared to the parser like any other option.
#include "cli_fixture.h"

#include "k3pack/gguf.h"

namespace k3cli {
namespace {

TEST(RepeatableOption, EveryValueIsKeptInOrder) {
  const std::string d = Root() + "/repeatable";
  const std::string base = "synth --layers 3 --experts 8 --top-k 2 --progress none --out ";
  // Both spellings, twice: each layer gets its own types.
  CliRun r = Cli(base + Q(d + "/a") + " --layer-expert-types 1:Q4_K,Q4_K,Q5_K --layer-expert-types=2:Q6_K,Q6_K,Q8_0");
  ASSERT_EQ(r.code, 0) << r.out;
  auto set = k3pack::gguf::ShardSet::Open(d + "/a");
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->FindTensor("blk.1.ffn_down_exps.weight")->info->type, k3pack::GgmlType::Q5_K);
  EXPECT_EQ(set->FindTensor("blk.2.ffn_up_exps.weight")->info->type, k3pack::GgmlType::Q6_K);
  EXPECT_EQ(set->FindTensor("blk.2.ffn_down_exps.weight")->info->type, k3pack::GgmlType::Q8_0);
  // The same arguments again are the same model: reported, not rewritten.
  r = Cli(base + Q(d + "/a") + " --layer-expert-types 1:Q4_K,Q4_K,Q5_K --layer-expert-types=2:Q6_K,Q6_K,Q8_0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  // Later values come later: the parser hands them over in order, so the
  // synth's own rule for a layer given twice sees both.
  r = Cli(base + Q(d + "/b") + " --layer-expert-types 1:Q4_K,Q4_K,Q5_K --layer-expert-types 1:Q6_K,Q6_K,Q8_0");
  EXPECT_NE(r.code, 0) << "a layer given twice must not be resolved silently: " << r.out;
  EXPECT_TRUE(Contains(r.out, "layer 1 is given expert types twice")) << r.out;
  // A value is still required, and other options still refuse a second value.
  r = Cli(base + Q(d + "/c") + " --layer-expert-types");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--layer-expert-types needs a value")) << r.out;
  r = Cli(base + Q(d + "/c") + " --seed 1 --seed 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_FALSE(fs::exists(d + "/c"));
}

TEST(RepeatableOption, HelpSaysRepeatable) {
  CliRun help = Cli("synth --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "per-layer override L:up,gate,down (or several, ';'-separated) (repeatable)"))
      << help.out;
}

}  // namespace
}  // namespace k3cli
