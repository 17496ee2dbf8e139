// k3pack.synth: the synthetic Kimi-K3 model writer (include/k3pack/synth.h),
// so Python code and tests can make models without the CLI.
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common.h"
#include "k3pack/synth.h"
#include "kimi/synth_output.h"

namespace k3py {

namespace synth = k3pack::synth;

void RegisterSynth(py::module_& m) {
  m.def("synth", [](const std::string& out_dir, const std::string& preset, const py::object& seed,
                    const std::vector<std::string>& faults, bool all_data, const py::object& shards_arg,
                    std::optional<std::string> matrix_type, const py::object& hidden_arg,
                    const py::object& vocab_arg, bool force, const py::object& wait, const py::object& log) {
    synth::SynthOptions o = Unwrap(synth::PresetOptions(preset));
    o.out_dir = out_dir;
    o.seed = IntInRange<uint64_t>(seed, "seed", 0, UINT64_MAX);
    // 1..65535: split.count is a UINT16 (`k3pack synth --shards`'s range).
    const std::optional<uint32_t> shards = OptionalIntInRange<uint32_t>(shards_arg, "shards", 1, 65535);
    const std::optional<uint32_t> hidden = OptionalIntInRange<uint32_t>(hidden_arg, "hidden", 0, UINT32_MAX);
    const std::optional<uint32_t> vocab = OptionalIntInRange<uint32_t>(vocab_arg, "vocab", 0, UINT32_MAX);
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
    // The model's rules on these values, checked before out_dir is looked at
    // (as `k3pack synth` checks them): the writer checked them only after it
    // had made out_dir and its .k3pack-synth.partial marker, which a refused
    // call then left behind as "an interrupted synth".
    const uint64_t planned = Unwrap(synth::PlannedTensorCount(o));
    if (o.shards > planned) {
      throw py::value_error("shards " + std::to_string(o.shards) + " is more than the model's " +
                            std::to_string(planned) + " tensors (every shard holds at least one)");
    }
    k3pack::kimi::SynthOutputRequest request;
    request.options = std::move(o);
    request.option = "out_dir";
    request.force_option = "force=True";
    request.force = force;
    request.why_refused = "it is not a model written by k3pack.synth with these options";
    request.note = LogLines(log);
    LockWaitKeyword waiting(wait, log, "the lock of " + out_dir);
    k3pack::Result<k3pack::kimi::SynthOutput> r = [&] {
      NoGil nogil;
      return k3pack::kimi::WriteSynthModelInto(request);
    }();
    waiting.RaiseIfInterrupted();
    k3pack::kimi::SynthOutput written = Unwrap(std::move(r));
    namespace fs = std::filesystem;
    py::dict d;
    d["out_dir"] = out_dir;
    if (written.already_built) {
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
    const synth::SynthResult& s = written.written;
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
     py::arg("force") = false, py::arg("wait") = py::none(), py::arg("log") = py::none(),
     "write a synthetic Kimi-K3 GGUF set + config.json + tokenizer/ + k3pack-profile.json (like `k3pack synth`: "
     "a non-empty out_dir is refused unless force=True; the same model already there is reported, "
     "already_built=True; an interrupted synth there is started over). Another process writing out_dir: "
     "refused at once, or, with wait=SECONDS (float('inf') or 'forever': until it lets go), waited for; "
     "`log` (None: the \"k3pack\" logger) is told what it waits for and what it starts over");
  m.def("synth_faults", [] {
    std::vector<std::string> out;
    for (synth::Fault f : synth::AllFaults()) out.emplace_back(synth::FaultName(f));
    return out;
  }, "the names synth(faults=[...]) accepts, one per defect it can inject ('raw-ssm-a', ...)");
}

}  // namespace k3py
