// Published dynamic ("UD") mixes quantize the routed experts of different
// layers (and gate/up vs down) differently. Under --profile scaled the doctor
// accepts what `k3pack pack --allow-mixed-types` packs when told so, instead of
// reporting every other layer as an error with a re-quantize fix.
#include <gtest/gtest.h>

#include "doctor_test_util.h"

namespace dtest {
namespace {

fs::path MixedModel() {
  const fs::path dir = TempDir("mixed");
  auto o = synth::PresetOptions("tiny");
  EXPECT_TRUE(o.ok());
  o->out_dir = dir.string();
  o->expert_types = {GgmlType::IQ1_S, GgmlType::IQ1_S, GgmlType::IQ3_XXS};
  auto layers = synth::ParseLayerExpertTypes({"2:IQ2_XXS,IQ2_XXS,IQ1_S;3:IQ2_XS,IQ1_M,Q8_0"});
  EXPECT_TRUE(layers.ok());
  o->layer_expert_types = *layers;
  auto r = synth::WriteSynthModel(*o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
  return dir;
}

size_t Count(const doctor::Report& r, const std::string& code) {
  size_t n = 0;
  for (const auto& f : r.findings) n += f.code == code;
  return n;
}

TEST(DoctorMixedTypes, ScaledWithAllowMixedTypesHasNoExpertDtypeFinding) {
  const fs::path dir = MixedModel();
  doctor::DiagnoseOptions o;
  o.profile = kimi::Profile::kScaled;
  const doctor::Report strict = doctor::Diagnose({dir.string()}, o);
  EXPECT_EQ(Count(strict, "expert-dtype"), 6u) << strict.ToText();  // layers 2 and 3, every role
  o.allow_mixed_types = true;
  const doctor::Report mixed = doctor::Diagnose({dir.string()}, o);
  EXPECT_EQ(Count(mixed, "expert-dtype"), 0u) << mixed.ToText();
  EXPECT_EQ(mixed.ExitCode(), 0) << mixed.ToText();
  // The Kimi-K3 profile keeps SGLang's fixed types whatever the option says.
  o.profile = kimi::Profile::kKimiK3;
  const doctor::Report k3 = doctor::Diagnose({dir.string()}, o);
  EXPECT_GT(Count(k3, "expert-dtype"), 0u) << k3.ToText();
}

TEST(DoctorMixedTypes, CliFlag) {
  const fs::path dir = MixedModel();
  CliResult plain = RunCli("doctor --profile scaled " + dir.string());
  EXPECT_EQ(plain.exit_code, 1) << plain.out;
  CliResult mixed = RunCli("doctor --profile scaled --allow-mixed-types " + dir.string());
  EXPECT_EQ(mixed.exit_code, 0) << mixed.out;
  CliResult k3 = RunCli("doctor --profile kimi-k3 --allow-mixed-types " + dir.string() + " 2>&1");
  EXPECT_EQ(k3.exit_code, 2) << k3.out;
  EXPECT_NE(k3.out.find("--allow-mixed-types requires --profile scaled"), std::string::npos) << k3.out;
  // The same usage error from pack and build, before any work (session 39:
  // they exited 1, from the expert collection, after the "using" lines).
  for (const std::string cmd : {"pack", "build"}) {
    const fs::path out = dir / (cmd + "-out.pack");
    CliResult r = RunCli(cmd + " --progress none --profile kimi-k3 --allow-mixed-types " + dir.string() + " --pack " +
                         out.string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("--allow-mixed-types requires --profile scaled"), std::string::npos) << cmd << ": " << r.out;
    EXPECT_FALSE(fs::exists(out)) << cmd;
  }
}

}  // namespace
}  // namespace dtest
