// k3pack.synth: the synthetic Kimi-K3 model writer (include/k3pack/synth.h),
// so Python code and tests can make models without the CLI.
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common.h"
#include "k3pack/synth.h"
#include "kimi/profile_sidecar.h"
#include "util/output_guard.h"

namespace k3py {

namespace synth = k3pack::synth;

void RegisterSynth(py::module_& m) {
  m.def("synth", [](const std::string& out_dir, const std::string& preset, uint64_t seed,
                    const std::vector<std::string>& faults, bool all_data, std::optional<uint32_t> shards,
                    std::optional<std::string> matrix_type, std::optional<uint32_t> hidden,
                    std::optional<uint32_t> vocab, bool force) {
    synth::SynthOptions o = Unwrap(synth::PresetOptions(preset));
    o.out_dir = out_dir;
    o.seed = seed;
    for (const auto& f : faults) o.faults.push_back(Unwrap(synth::ParseFault(f)));
    if (all_data) o.hole_threshold_bytes = UINT64_MAX;
    if (shards) o.shards = *shards;
    if (hidden) o.dims.hidden = *hidden;
    if (vocab) o.dims.vocab = *vocab;
    if (matrix_type) {
      auto t = k3pack::GgmlTypeFromName(*matrix_type);
      if (!t) throw py::value_error("unknown ggml type '" + *matrix_type + "'");
      o.matrix_type = *t;
    }
    // The options that determine the bytes (not the directory): an existing
    // model written with the same ones, by this call or `k3pack synth`, is
    // the finished output.
    const nlohmann::json recipe = k3pack::kimi::SynthRecipe(o);
    k3pack::OutputSpec spec;
    spec.option = "out_dir";
    spec.path = out_dir;
    spec.directory = true;
    spec.force = force;
    spec.force_option = "force=True";
    spec.is_finished = [&]() -> k3pack::Result<bool> { return k3pack::kimi::SynthSidecarRecords(out_dir, recipe); };
    spec.why_refused = "it is not a model written by k3pack.synth with these options";
    const k3pack::OutputAction action = Unwrap(k3pack::DecideOutput(spec));
    namespace fs = std::filesystem;
    py::dict d;
    d["out_dir"] = out_dir;
    if (action == k3pack::OutputAction::kAlreadyBuilt) {
      // Nothing is written; the paths are those of the model already there.
      std::vector<std::string> shards_found;
      std::error_code ec;
      for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().extension() == ".gguf") shards_found.push_back(it->path().string());
      }
      std::sort(shards_found.begin(), shards_found.end());
      d["already_built"] = true;
      d["shards"] = shards_found;
      d["config"] = (fs::path(out_dir) / "config.json").string();
      d["tokenizer_dir"] = (fs::path(out_dir) / "tokenizer").string();
      return d;
    }
    k3pack::Result<synth::SynthResult> r = [&]() -> k3pack::Result<synth::SynthResult> {
      NoGil nogil;
      K3_ASSIGN_OR_RETURN(synth::SynthResult res, synth::WriteSynthModel(o));
      // The profile the model passes, recorded so later calls need none.
      K3_RETURN_IF_ERROR(k3pack::kimi::WriteSynthSidecar(out_dir, res.config_path, recipe).status());
      return res;
    }();
    synth::SynthResult s = Unwrap(std::move(r));
    d["already_built"] = false;
    d["shards"] = s.shard_paths;
    d["config"] = s.config_path;
    d["tokenizer_dir"] = s.tokenizer_dir;
    d["tensor_count"] = s.tensor_count;
    d["total_bytes"] = s.total_bytes;
    d["mla_layers"] = s.mla_layers;
    d["faults"] = s.fault_notes;
    return d;
  }, py::arg("out_dir"), py::kw_only(), py::arg("preset") = "tiny", py::arg("seed") = 0,
     py::arg("faults") = std::vector<std::string>{}, py::arg("all_data") = false, py::arg("shards") = py::none(),
     py::arg("matrix_type") = py::none(), py::arg("hidden") = py::none(), py::arg("vocab") = py::none(),
     py::arg("force") = false,
     "write a synthetic Kimi-K3 GGUF set + config.json + tokenizer/ + k3pack-profile.json (like `k3pack synth`: "
     "a non-empty out_dir is refused unless force=True; the same model already there is reported, "
     "already_built=True)");
  m.def("synth_faults", [] {
    std::vector<std::string> out;
    for (synth::Fault f : synth::AllFaults()) out.emplace_back(synth::FaultName(f));
    return out;
  }, "the names synth(faults=[...]) accepts, one per defect it can inject ('raw-ssm-a', ...)");
}

}  // namespace k3py
