// k3pack.synth: the synthetic Kimi-K3 model writer (include/k3pack/synth.h),
// so Python code and tests can make models without the CLI.
#include <pybind11/stl.h>

#include "common.h"
#include "k3pack/synth.h"

namespace k3py {

namespace synth = k3pack::synth;

void RegisterSynth(py::module_& m) {
  m.def("synth", [](const std::string& out_dir, const std::string& preset, uint64_t seed,
                    const std::vector<std::string>& faults, bool all_data, std::optional<uint32_t> shards,
                    std::optional<std::string> matrix_type, std::optional<uint32_t> hidden,
                    std::optional<uint32_t> vocab) {
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
    k3pack::Result<synth::SynthResult> r = [&] {
      py::gil_scoped_release nogil;
      return synth::WriteSynthModel(o);
    }();
    synth::SynthResult s = Unwrap(std::move(r));
    py::dict d;
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
     "write a synthetic Kimi-K3 GGUF set + config.json + tokenizer/ (like `k3pack synth`)");
  m.def("synth_faults", [] {
    std::vector<std::string> out;
    for (synth::Fault f : synth::AllFaults()) out.emplace_back(synth::FaultName(f));
    return out;
  });
}

}  // namespace k3py
