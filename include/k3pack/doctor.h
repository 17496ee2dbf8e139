// `k3pack doctor`: diagnose a Kimi-K3 GGUF shard set (or a manifest and what
// it points to) and explain every problem, not only the first one.
//
// The pipeline's own readers are strict and stop at the first broken rule,
// which is right for loading but poor for a user with a bad download or a
// half-right conversion. Diagnose() runs every check it can reach, keeps
// going past broken files, and returns one Finding per problem with:
//   * a stable code (documented in docs/doctor.md),
//   * the object (file / tensor / key) it concerns,
//   * the exact SGLang error text the problem would cause (when SGLang has
//     one), what it means, and how to fix it.
// `k3pack repair` fixes the one problem that is safely mechanical: ssm_a
// tensors stored as raw A_log instead of llama.cpp's -exp(A_log).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/progress.h"
#include "k3pack/ggml_types.h"
#include "k3pack/kimi.h"

namespace k3pack::doctor {

// The JSON schema id written by Report::ToJson (bumped on breaking changes).
inline constexpr const char* kReportSchema = "k3pack-doctor-v1";

enum class Severity {
  kError,    // SGLang (or the k3pack pipeline) will refuse or mis-load this
  kWarning,  // loads, but is suspicious or only partly checked
  kInfo,     // context: a check that was skipped and why
};
const char* SeverityName(Severity s);  // "error" / "warning" / "info"

struct Finding {
  Severity severity = Severity::kError;
  std::string code;          // stable id, e.g. "ssm-a-raw-a-log"
  std::string object;        // what it concerns: tensor name, file path or key
  std::string file;          // the file involved ("" when not file-specific)
  std::string message;       // what was found, specific to this object
  std::string sglang_error;  // SGLang's verbatim text for this condition, or ""
  std::string sglang_exception;  // Python exception class, e.g. "ValueError", or ""
  std::string meaning;       // what it means (general, from the catalog)
  std::string fix;           // how to fix it (may name this object)
  nlohmann::json details = nlohmann::json::object();  // machine-readable facts
};

// One diagnosis kind of the catalog (docs/doctor.md lists them all).
struct Diagnosis {
  const char* code;
  Severity severity;
  const char* sglang_exception;  // "" when SGLang raises nothing for it
  const char* meaning;
  const char* fix;
};
const std::vector<Diagnosis>& Catalog();
const Diagnosis* FindDiagnosis(std::string_view code);

struct CheckRun {
  std::string name;    // "files", "split", "spec", "names", "experts", "values", "manifest", "pack"
  bool ran = false;
  std::string note;    // why it was skipped or limited
};

struct Report {
  std::vector<std::string> inputs;
  kimi::Profile profile = kimi::Profile::kKimiK3;
  bool unusable = false;  // an input could not be read at all (exit 2)
  std::vector<std::string> files;  // GGUF files examined, in order
  // The directories whose shards were examined (absolute; for a manifest, the
  // directories of the shards it records), so a report says which copy of a
  // model it describes.
  std::vector<std::string> shard_dirs;
  uint64_t tensors_examined = 0;
  std::vector<CheckRun> checks;
  std::vector<Finding> findings;

  size_t Count(Severity s) const;
  // 0 healthy (no errors), 1 problems found or unusable input (status tells which).
  int ExitCode() const;
  nlohmann::json ToJson() const;  // schema kReportSchema, see docs/doctor.md
  std::string ToText() const;     // for people
  bool Has(std::string_view code) const;
  std::vector<const Finding*> With(std::string_view code) const;
};

struct DiagnoseOptions {
  kimi::Profile profile = kimi::Profile::kKimiK3;
  // config.json to check the GGUF against; empty = `<shard dir>/config.json`
  // when present.
  std::string config_path;
  // The tokenizer directory: SGLang's server builds its model from
  // `<tokenizer_dir>/config.json`; where that is another config than
  // config_path's, it is checked against the GGUF as well. Empty: not checked.
  std::string tokenizer_dir;
  // Check tensor values (ssm_a, residual scores, small F32 vectors).
  bool check_values = true;
  // With check_values false: still check the ssm_a values (a few KiB per
  // layer), which SGLang's loader rejects at start-up (`k3pack build`).
  bool check_ssm_a = false;
  // Under the scaled profile: routed experts may use other types than the
  // other layers (and gate than up), as `k3pack pack --allow-mixed-types`
  // accepts; no `expert-dtype` finding then. Ignored under kimi-k3.
  bool allow_mixed_types = false;
  // Compare pack payload samples with the GGUF when a manifest is given.
  int64_t pack_payload_samples = 6;
  std::function<void(const std::string&)> progress;  // status lines; may be empty
  // Bytes and tensors of the value checks (the long part on a big set):
  // phase "doctor values", unit "tensors". May be empty.
  ProgressFn value_progress;
};

// Runs every check on each path (GGUF file, shard directory or manifest
// JSON). Never fails for problems in the inputs: those become findings. An
// input that cannot be read at all sets report.unusable.
Report Diagnose(const std::vector<std::string>& paths, const DiagnoseOptions& options = {});

// `build`'s gate (CLI and Python alike): the error findings of a doctor run
// on the shard set of `any_shard` (no value checks but ssm_a's, which SGLang's
// loader rejects at start-up), as one error "SGLang cannot load this
// checkpoint: doctor reports N error(s); first: ..."; OK when there are none.
// A pack of such a checkpoint builds fine and then fails at server start.
Status CheckSglangCanLoad(const std::string& any_shard, kimi::Profile profile, const std::string& model_config,
                          const std::string& tokenizer_dir, bool allow_mixed_types);
// The `k3pack doctor ...` command line that sees what the gate saw (the
// same configs, profile and type rule), for the gate's hint.
std::string DoctorCommand(const std::string& gguf_dir, kimi::Profile profile, const std::string& model_config,
                          const std::string& tokenizer_dir, bool allow_mixed_types);

// ------------------------------------------------------------ ssm_a values

// What the values of an ssm_a tensor look like. The classification rules
// (thresholds below) are documented in docs/doctor.md.
enum class SsmAForm {
  kNegExp,       // all < 0: llama.cpp's -exp(A_log) (what SGLang accepts)
  kTinyNegative, // all < 0 but some |x| < kTinyMagnitude: accepted, suspicious
  kRawALog,      // some > 0, all in [-1, kMaxRawALog]: raw A_log, repairable
  kMixedForms,   // some > 0 and some < -1: both forms in one tensor, ambiguous
  kAllZero,      // every value 0 (missing data)
  kZeroedElements,  // none > 0, some exactly 0 among negative values: zeroed -exp(A_log) elements
  kNonFinite,    // NaN or Inf present
  kNormLike,     // all > 0 clustered around a mean in [0.25, 4]: a norm weight
  kImplausible,  // some value > kMaxRawALog: neither A_log nor -exp(A_log)
};
const char* SsmAFormName(SsmAForm f);
inline constexpr double kTinyMagnitude = 1e-3;  // |-exp(A_log)| below this means A_log < -6.9
inline constexpr double kMaxRawALog = 10.0;      // |A_log| beyond this means A > 22026 or < 4.5e-5
inline constexpr double kNormSpread = 0.25;      // norm-like: every value within 25% of the mean

struct SsmAStats {
  SsmAForm form = SsmAForm::kNegExp;
  uint64_t count = 0, negative = 0, zero = 0, positive = 0, nonfinite = 0;
  double min = 0, max = 0, mean = 0;
  bool repairable() const { return form == SsmAForm::kRawALog; }
};
SsmAStats ClassifySsmA(std::span<const float> values);

// Decodes F32 / F16 / BF16 tensor bytes to floats; nullopt for other types.
std::optional<std::vector<float>> DecodeFloatTensor(GgmlType type, std::span<const uint8_t> bytes);
// Encodes floats back into F32 / F16 / BF16 (round to nearest even).
Result<std::vector<uint8_t>> EncodeFloatTensor(GgmlType type, std::span<const float> values);

// ---------------------------------------------------------------- repair

struct RepairOptions {
  std::vector<std::string> fixes = {"ssm-a"};  // only "ssm-a" exists
  // Copy config.json and tokenizer/ found beside the input shards.
  bool copy_sidecars = true;
  // Profile of the doctor run that checks the output (remaining_problems).
  kimi::Profile profile = kimi::Profile::kKimiK3;
  std::function<void(const std::string&)> progress;
  // Leave OUT's marker (kRepairMarkerName) for the caller to remove once it
  // has written what else belongs to the output (the CLI's record). Without
  // it the marker goes once every shard and sidecar is in place.
  bool keep_marker = false;
};

struct RepairedTensor {
  std::string name;
  std::string file;         // output shard
  uint64_t data_offset = 0;  // byte range rewritten in that shard
  uint64_t nbytes = 0;
  SsmAStats before;
};

struct RepairResult {
  std::string out_dir;
  std::vector<std::string> shards_written;
  std::vector<std::string> sidecars_copied;  // relative to out_dir
  std::vector<RepairedTensor> repaired;
  uint64_t bytes_copied = 0;     // data bytes copied (holes excluded)
  // Errors doctor still reports on the output ("code object"): problems
  // this fix does not touch. Never an ssm_a diagnosis (that fails Repair).
  std::vector<std::string> remaining_problems;
  nlohmann::json ToJson() const;
};

// Writes a repaired copy of the shard set at `in` (a shard or its directory)
// into `out_dir` (must not exist or be empty). Only ssm_a tensors holding raw
// A_log are rewritten, as -exp(A_log) in their own dtype (F32, F16 or F64; BF16
// is refused: SGLang rejects BF16 ssm_a whatever the values); every other byte
// is copied unchanged (holes kept). Each shard goes through a temp file +
// fsync + rename. Refuses (ValueError, nothing written) when an ssm_a tensor
// fails SGLang's check but its fix is ambiguous, or when there is nothing to
// repair.
Result<RepairResult> Repair(const std::string& in, const std::string& out_dir, const RepairOptions& options = {});

// In OUT: `k3pack repair`'s record of a finished repair (recipe and files,
// written last), and the marker Repair writes before its first shard and
// `k3pack repair` removes after the record. While the marker is there, OUT
// holds an unfinished repair, which a rerun finishes.
inline constexpr const char* kRepairRecordName = "k3pack-repair.json";
inline constexpr const char* kRepairMarkerName = ".k3pack-repair.partial";

// What doctor still reports as errors on a repaired copy ("code object"), as
// RepairResult::remaining_problems; an ssm_a error left is an internal error.
// `k3pack repair --force` asks again once the replaced output's files are
// gone (with both sets there it read as several-shard-sets).
Result<std::vector<std::string>> CheckRepairedOutput(const std::string& out_dir, kimi::Profile profile);

}  // namespace k3pack::doctor
