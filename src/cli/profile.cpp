#include "cli/profile.h"

#include "k3pack/pack.h"

namespace k3pack::cli {

void AddProfileOption(Args& args) {
  args.Option("--profile",
              "kimi-k3 (SGLang's audited invariants) or scaled (any dimensions); default: the one recorded in the "
              "manifest or by `k3pack synth` (" + std::string(kProfileSidecar) + "), else kimi-k3");
}

Result<kimi::Profile> ResolveProfile(const Args& args, const std::vector<std::string>& near) {
  if (args.Has("--profile")) return kimi::ParseProfile(args.Get("--profile"));
  return kimi::ProfileRecordedNear(near);
}

int ProfileErrorExit(const Args& args) { return args.Has("--profile") ? kExitUsage : kExitFailed; }

Status CheckMixedTypesProfile(const Args& args, kimi::Profile profile) {
  pack::CollectOptions named;  // the CLI's names are the defaults
  named.allow_mixed_types = args.Has("--allow-mixed-types");
  return pack::CheckMixedTypesAllowed(named, profile);
}

}  // namespace k3pack::cli
