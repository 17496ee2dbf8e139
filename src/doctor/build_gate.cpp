// CheckSglangCanLoad: the doctor findings `k3pack build` and `k3pack.build`
// refuse to build a pack for (one rule for both front ends).
#include "k3pack/doctor.h"

#include <cerrno>

#include "util/format.h"
#include "util/process_limits.h"

namespace k3pack::doctor {

Status CheckSglangCanLoad(const std::string& any_shard, kimi::Profile profile, const std::string& model_config,
                          const std::string& tokenizer_dir, bool allow_mixed_types) {
  DiagnoseOptions dopt;
  dopt.profile = profile;
  dopt.config_path = model_config;
  dopt.tokenizer_dir = tokenizer_dir;
  dopt.check_values = false;
  dopt.check_ssm_a = true;
  dopt.allow_mixed_types = allow_mixed_types;  // asked for by name
  const Report report = Diagnose({any_shard}, dopt);
  std::vector<const Finding*> fatal;
  for (const auto& f : report.findings) {
    if (f.severity == Severity::kError) fatal.push_back(&f);
  }
  if (fatal.empty()) return Status::OK();
  // A file doctor could not read for want of permission, descriptors or
  // address space says nothing of the checkpoint: the error is the OS's,
  // with its errno (Python's PermissionError, ...) and its hint (ulimit -n
  // / -v), and --allow-unsupported is no way out of it.
  for (const Finding* f : fatal) {
    const int err = f->details.value("errno", 0);
    if (IsProcessCannotRead(err)) return Error(f->message, err == ENOMEM ? ErrorKind::kMemory : ErrorKind::kOS, err);
  }
  const Finding& first = *fatal.front();
  return Error("SGLang cannot load this checkpoint: doctor reports " + std::to_string(fatal.size()) +
               " error(s); first: [" + first.code + "] " + first.object + ": " + first.message +
               (first.sglang_error.empty() ? "" : " (SGLang: " + first.sglang_error + ")"));
}

std::string DoctorCommand(const std::string& gguf_dir, kimi::Profile profile, const std::string& model_config,
                          const std::string& tokenizer_dir, bool allow_mixed_types) {
  std::string command = "k3pack doctor " + ShellQuoted(gguf_dir) + " --profile " + kimi::ProfileName(profile);
  if (!model_config.empty()) command += " --model-config " + ShellQuoted(model_config);
  if (!tokenizer_dir.empty()) command += " --tokenizer-dir " + ShellQuoted(tokenizer_dir);
  if (allow_mixed_types) command += " --allow-mixed-types";
  return command;
}

}  // namespace k3pack::doctor
