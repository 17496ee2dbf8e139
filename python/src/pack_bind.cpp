// Pack and manifest operations (binds include/k3pack/pack.h and
// include/k3pack/manifest.h): build_pack, validate_pack, create_manifest,
// read_manifest, verify_pack. Long operations release the GIL; progress
// callbacks are called with the GIL held and receive a dict.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "common.h"
#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3py {
namespace {

namespace pack = k3pack::pack;
namespace kimi = k3pack::kimi;
namespace manifest = k3pack::manifest;
namespace gguf = k3pack::gguf;
using k3pack::Error;
using k3pack::Result;
using k3pack::Status;

py::object JsonToPython(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

// Shares a Python callable with C++ code that may copy and drop it on any
// thread: the last reference is released under the GIL.
std::shared_ptr<py::object> HoldCallable(py::object fn) {
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// A C++ progress callback that calls `fn` (may be None) under the GIL.
pack::ProgressFn ProgressCallback(py::object fn) {
  if (fn.is_none()) return nullptr;
  auto holder = HoldCallable(std::move(fn));
  return [holder](const pack::Progress& p) {
    py::gil_scoped_acquire gil;
    try {
      py::dict d;
      d["phase"] = p.phase;
      d["done_bytes"] = p.done_bytes;
      d["total_bytes"] = p.total_bytes;
      d["done_objects"] = p.done_objects;
      d["total_objects"] = p.total_objects;
      d["elapsed_s"] = p.elapsed_s;
      (*holder)(d);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("k3pack progress callback");
    }
  };
}

std::function<void(const std::string&)> LineCallback(py::object fn) {
  if (fn.is_none()) return nullptr;
  auto holder = HoldCallable(std::move(fn));
  return [holder](const std::string& line) {
    py::gil_scoped_acquire gil;
    try {
      (*holder)(line);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("k3pack log callback");
    }
  };
}

kimi::Profile ProfileArg(const std::string& name) { return Unwrap(kimi::ParseProfile(name)); }

}  // namespace

void RegisterPack(py::module_& m) {
  m.def("build_pack", [](const std::string& gguf_dir, const std::string& model_config, const std::string& out,
                         const std::string& profile, bool allow_mixed_types, double safety_margin_gib, bool restart,
                         int threads, py::object progress, py::object log) {
    kimi::Profile p = ProfileArg(profile);
    pack::BuildOptions o;
    o.out_path = out;
    o.safety_margin_gib = safety_margin_gib;
    o.restart = restart;
    o.threads = threads;
    o.progress = ProgressCallback(progress);
    o.log = LineCallback(log);
    Result<pack::BuildResult> r = [&]() -> Result<pack::BuildResult> {
      py::gil_scoped_release nogil;
      pack::CollectOptions copts;
      copts.allow_mixed_types = allow_mixed_types;
      K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(gguf_dir, model_config, p, copts));
      if (o.out_path.empty()) {
        K3_ASSIGN_OR_RETURN(o.out_path, pack::DefaultPackPath(experts.shard_paths.front()));
      }
      return pack::BuildPack(experts, o);
    }();
    pack::BuildResult b = Unwrap(std::move(r));
    py::dict d;
    d["pack"] = b.pack_path;
    d["digests"] = b.digests_path;
    d["size"] = b.pack_bytes;
    d["index_count"] = b.index_count;
    d["index_sha256"] = b.index_sha256;
    d["copied_bytes"] = b.copied_bytes;
    d["hole_bytes"] = b.hole_bytes;
    d["resumed_objects"] = b.resumed_objects;
    d["seconds"] = b.seconds;
    return d;
  }, py::arg("gguf_dir"), py::arg("model_config"), py::kw_only(), py::arg("out") = "",
     py::arg("profile") = "kimi-k3", py::arg("allow_mixed_types") = false, py::arg("safety_margin_gib") = 2.0,
     py::arg("restart") = false, py::arg("threads") = 0, py::arg("progress") = py::none(),
     py::arg("log") = py::none(),
     "build the expert-major pack (resumable; `k3pack pack`); out='' = <dir>/<prefix>.expert-major.pack");

  m.def("validate_pack", [](const std::string& pack_path, const std::string& gguf_dir, const std::string& model_config,
                            const std::string& profile, py::object allow_mixed_types, int64_t payload_samples,
                            bool full_pack_hash, py::object progress) {
    kimi::Profile p = ProfileArg(profile);
    bool mixed = allow_mixed_types.is_none() ? p == kimi::Profile::kScaled : allow_mixed_types.cast<bool>();
    pack::ValidateOptions o;
    o.payload_samples = payload_samples;
    o.full_pack_hash = full_pack_hash;
    o.progress = ProgressCallback(progress);
    Result<nlohmann::json> r = [&]() -> Result<nlohmann::json> {
      py::gil_scoped_release nogil;
      pack::CollectOptions copts;
      copts.allow_mixed_types = mixed;
      K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(gguf_dir, model_config, p, copts));
      return pack::ValidatePack(pack_path, experts, o);
    }();
    return JsonToPython(Unwrap(std::move(r)));
  }, py::arg("pack_path"), py::arg("gguf_dir"), py::arg("model_config"), py::kw_only(),
     py::arg("profile") = "kimi-k3", py::arg("allow_mixed_types") = py::none(), py::arg("payload_samples") = 6,
     py::arg("full_pack_hash") = false, py::arg("progress") = py::none(),
     "SGLang's validate_ggml_moe_pack: returns the manifest's expert_pack section");

  m.def("create_manifest", [](const std::string& gguf_dir, const std::string& expert_pack,
                              const std::string& model_config, const std::string& tokenizer_dir,
                              const std::string& output, const std::string& profile, int64_t payload_samples,
                              bool full_source_hashes, bool full_pack_hash, py::object progress) {
    manifest::CreateOptions o;
    o.gguf_dir = gguf_dir;
    o.expert_pack = expert_pack;
    o.model_config = model_config;
    o.tokenizer_dir = tokenizer_dir;
    o.profile = ProfileArg(profile);
    o.payload_samples = payload_samples;
    o.full_source_hashes = full_source_hashes;
    o.full_pack_hash = full_pack_hash;
    o.progress = LineCallback(progress);
    Result<nlohmann::json> r = [&]() -> Result<nlohmann::json> {
      py::gil_scoped_release nogil;
      K3_ASSIGN_OR_RETURN(nlohmann::json doc, manifest::CreateManifest(o));
      if (!output.empty()) K3_RETURN_IF_ERROR(manifest::WriteManifest(output, doc));
      return doc;
    }();
    return JsonToPython(Unwrap(std::move(r)));
  }, py::arg("gguf_dir"), py::arg("expert_pack"), py::arg("model_config"), py::arg("tokenizer_dir"), py::kw_only(),
     py::arg("output") = "", py::arg("profile") = "kimi-k3", py::arg("payload_samples") = 6,
     py::arg("full_source_hashes") = false, py::arg("full_pack_hash") = false, py::arg("progress") = py::none(),
     "SGLang's create_manifest; writes it byte-compatibly to `output` when given; returns the document");

  m.def("serialize_manifest", [](py::object doc) {
    std::string text = py::module_::import("json").attr("dumps")(doc).cast<std::string>();
    return py::bytes(manifest::SerializeManifest(nlohmann::json::parse(text)));
  }, py::arg("manifest"), "the exact bytes the manifest file holds (indent=2, sorted keys, raw UTF-8, newline)");

  m.def("read_manifest", [](const std::string& path) {
    return JsonToPython(Unwrap(manifest::ReadManifestJson(path)));
  }, py::arg("path"));

  m.def("verify_pack", [](const std::string& manifest_path, bool full, int64_t samples, bool against_source,
                          py::object progress) {
    manifest::VerifyPackOptions o;
    o.full = full;
    o.against_source = against_source;
    o.samples = samples;
    o.progress = ProgressCallback(progress);
    Result<nlohmann::json> r = [&]() -> Result<nlohmann::json> {
      py::gil_scoped_release nogil;
      return manifest::VerifyPack(manifest_path, o);
    }();
    return JsonToPython(Unwrap(std::move(r)));
  }, py::arg("manifest"), py::kw_only(), py::arg("full") = false, py::arg("samples") = 6,
     py::arg("against_source") = false, py::arg("progress") = py::none(),
     "shards unchanged (size + header digest), pack structure and index digest as recorded, then payloads: "
     "`samples` byte compares with GGUF, or full=True: every payload against the digest sidecar");
}

}  // namespace k3py
