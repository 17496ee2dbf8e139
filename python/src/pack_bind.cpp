// Pack and manifest operations (binds include/k3pack/pack.h and
// include/k3pack/manifest.h): build_pack, validate_pack, create_manifest,
// read_manifest, verify_pack. Long operations release the GIL; progress
// callbacks are called with the GIL held and receive a dict.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>

#include "common.h"
#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/manifest.h"
#include "k3pack/doctor.h"
#include "k3pack/pack.h"
#include "kimi/profile_sidecar.h"
#include "manifest/build_output.h"
#include "manifest/manifest_output.h"
#include "manifest/tokenizer_dir.h"
#include "pack/pack_output.h"
#include "util/file.h"
#include "util/process_limits.h"
#include "util/pyrepr.h"
#include "util/output_guard.h"
#include "util/sha256.h"
#include "util/json_text.h"

namespace k3py {
namespace {

namespace pack = k3pack::pack;
namespace kimi = k3pack::kimi;
namespace manifest = k3pack::manifest;
namespace gguf = k3pack::gguf;
using k3pack::Error;
using k3pack::Result;
using k3pack::Status;
using k3pack::OutputAction;

py::object JsonToPython(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

// A C++ progress callback that calls `fn` (may be None) under the GIL.
pack::ProgressFn ProgressCallback(py::object fn) {
  if (fn.is_none()) return nullptr;
  auto holder = HoldCallable(std::move(fn), "progress");
  return [holder](const pack::Progress& p) {
    CallbackGil gil;
    if (!gil.held()) return;
    try {
      py::dict d;
      d["phase"] = p.phase;
      d["done_bytes"] = p.done_bytes;
      d["total_bytes"] = p.total_bytes;
      d["done_objects"] = p.done_objects;
      d["total_objects"] = p.total_objects;
      d["elapsed_s"] = p.elapsed_s;
      const InUserCallback inside;
      (*holder)(d);
    } catch (py::error_already_set& e) {
      DiscardCallbackError(e, "k3pack progress callback");
    }
  };
}

kimi::Profile ProfileArg(const std::string& name) { return Unwrap(kimi::ParseProfile(name)); }

// The expert collection with its errors naming this module's keywords;
// allow_mixed_types under kimi-k3 is refused first, as the CLI's usage error
// (before, a small model's invariant error came first and hid it).
Result<pack::CollectOptions> PythonCollectOptions(bool allow_mixed_types, kimi::Profile profile) {
  pack::CollectOptions o;
  o.allow_mixed_types = allow_mixed_types;
  o.mixed_types_option = "allow_mixed_types=True";
  o.scaled_profile_option = "profile='scaled'";
  K3_RETURN_IF_ERROR(pack::CheckMixedTypesAllowed(o, profile));
  return o;
}

// profile=None: the one recorded beside the inputs (a manifest's k3pack
// section, or the sidecar k3pack.synth writes), else kimi-k3 - as the CLI
// does without --profile.
kimi::Profile ProfileArg(const py::object& name, const std::vector<std::string>& near) {
  if (!name.is_none()) {
    // .cast<std::string>() of an int was pybind11's RuntimeError "Unable to cast Python instance".
    if (!py::isinstance<py::str>(name))
      throw py::type_error("profile must be None, 'kimi-k3' or 'scaled', got " + TypeNameOf(name));
    return ProfileArg(name.cast<std::string>());
  }
  return Unwrap(kimi::ProfileRecordedNear(near));
}

// The overwrite rule of `k3pack pack` for build_pack(out=...) and build(pack=...):
// spelled with the Python keywords.
pack::PackOutputRequest PackRequest(const std::string& option, const std::string& out,
                                    const std::string& model_config, const pack::ExpertSet& experts, bool force) {
  pack::PackOutputRequest req;
  req.path = out;
  req.option = option;
  req.force_option = "force=True";
  req.repair_hint = "`k3pack pack --repair-damaged`";
  req.force = force;
  req.inputs = {{"model_config", model_config}};
  for (const auto& s : experts.shard_paths) req.inputs.push_back({"source shard", s});
  // The sidecar profile=None reads, as `k3pack pack` counts it.
  for (const auto& s : kimi::ProfileSidecarsNear({model_config, experts.shard_paths.empty() ? "" : experts.shard_paths.front()}))
    req.inputs.push_back({"the profile record", s});
  return req;
}

const manifest::InputNames kPyInputNames{"gguf_dir", "expert_pack", "model_config", "tokenizer_dir"};

// nlohmann's DOM parser, except that an integer outside int64 / uint64 is
// refused: nlohmann parses it as a double, which was then written back as
// "1.8446744073709552e+19" where json.dump writes the integer's digits.
struct IntegersAsWritten : nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using json_sax_dom_parser::json_sax_dom_parser;
  std::string inexact;  // the first such integer's text
  bool number_float(double value, const std::string& text) {
    if (text.find_first_of(".eE") == std::string::npos) {
      inexact = text;
      return false;  // stops the parse
    }
    return json_sax_dom_parser::number_float(value, text);
  }
};

// build_pack(): collects the experts, applies `k3pack pack`'s output rule and
// builds (or reports the pack already built).
py::dict BuildPackCall(const std::string& gguf_dir, const std::string& model_config, const std::string& out,
                       const py::object& profile, bool allow_mixed_types, double safety_margin_gib, bool restart,
                       const py::object& threads, py::object progress, py::object log, bool force,
                       bool hash_sources, const py::object& wait) {
  RefuseInsideUserCallback("k3pack.build_pack");
  kimi::Profile p = ProfileArg(profile, {model_config, gguf_dir});
  LockWaitKeyword waiting(wait, log, "the pack's lock");
  pack::BuildOptions o;
  o.out_path = out;
  o.safety_margin_gib = safety_margin_gib;
  o.restart = restart;
  o.threads = IntInRange<int>(threads, "threads", 0, INT_MAX);  // 0: the default
  o.hash_sources = hash_sources;
  o.progress = ProgressCallback(progress);
  o.log = LineCallback(log, "log");
  pack::PackOutputPlan plan;
  Result<pack::BuildResult> r = [&]() -> Result<pack::BuildResult> {
    NoGil nogil;
    K3_ASSIGN_OR_RETURN(const pack::CollectOptions copts, PythonCollectOptions(allow_mixed_types, p));
    K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(gguf_dir, model_config, p, copts));
    if (o.out_path.empty()) {
      K3_ASSIGN_OR_RETURN(o.out_path, pack::DefaultPackPath(experts.shard_paths.front()));
    }
    // `k3pack pack`'s rule, before BuildPack creates its lock file beside the output.
    pack::PackOutputRequest req = PackRequest("out", o.out_path, model_config, experts, force);
    req.progress = o.progress;  // the full comparison of a pack whose shards' stamps changed
    if (o.log) req.note = [&o](const std::string& why) { o.log("note: " + why); };
    K3_ASSIGN_OR_RETURN(plan, pack::PlanPackOutput(req, experts));
    if (plan.action == OutputAction::kAlreadyBuilt) return pack::BuildResult{};
    o.replace_existing = plan.action == OutputAction::kReplace;  // kept until the new pack is done
    return pack::BuildPack(experts, o);
  }();
  waiting.RaiseIfInterrupted();
  if (!r.ok()) RaiseBuildError(r.error());
  pack::BuildResult b = std::move(r).value();
  py::dict d;
  if (plan.action == OutputAction::kAlreadyBuilt) {
    // A valid pack of these shards is there: nothing was written (the CLI's "already built").
    const nlohmann::json& v = plan.valid_section;
    d["already_built"] = true;
    d["pack"] = o.out_path;
    d["digests"] = pack::DigestsPathFor(o.out_path);
    d["size"] = v.value("size", uint64_t{0});
    d["index_count"] = v.value("index_count", uint64_t{0});
    d["index_sha256"] = v.value("index_sha256", std::string());
    return d;
  }
  d["already_built"] = false;
  d["pack"] = b.pack_path;
  d["digests"] = b.digests_path;
  d["size"] = b.pack_bytes;
  d["index_count"] = b.index_count;
  d["index_sha256"] = b.index_sha256;
  d["copied_bytes"] = b.copied_bytes;
  d["hole_bytes"] = b.hole_bytes;
  d["resumed_objects"] = b.resumed_objects;
  d["seconds"] = b.seconds;
  if (hash_sources) d["source_sha256"] = b.source_sha256;
  return d;
}

// _plan_build(): k3pack.build's checks before a byte is written; returns the
// paths, the profile and the pack's lock, held for the build.
py::dict PlanBuildCall(const std::string& gguf_dir, const std::string& model_config,
                       const std::string& tokenizer_dir, const std::string& pack_arg,
                       const std::string& manifest_arg, const py::object& profile, bool allow_mixed_types,
                       bool allow_unsupported, bool force, const py::object& wait, const py::object& log,
                       const py::object& payload_samples) {
  RefuseInsideUserCallback("k3pack.build");
  std::optional<int64_t> samples;  // converted here: the plan runs without the GIL
  if (!payload_samples.is_none()) samples = IntInRange<int64_t>(payload_samples, "payload_samples", 0, INT64_MAX);
  kimi::Profile p = ProfileArg(profile, {model_config, gguf_dir});
  LockWaitKeyword waiting(wait, log, "the pack's lock");
  std::string out = pack_arg, manifest_path = manifest_arg;
  pack::PackOutputPlan plan;
  OutputAction maction{};
  // Why an existing manifest is taken over, told to `log` (else the "k3pack"
  // logger) once the GIL is back; the plan's pass may run twice: each once.
  std::vector<std::string> notes;
  auto note = [&](const std::string& why) {
    if (std::find(notes.begin(), notes.end(), why) == notes.end()) notes.push_back(why);
  };
  Status st = [&]() -> Status {
    NoGil nogil;
    K3_ASSIGN_OR_RETURN(const pack::CollectOptions copts, PythonCollectOptions(allow_mixed_types, p));
    K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(gguf_dir, model_config, p, copts));
    if (!allow_unsupported) {  // `k3pack build`'s gate, before a byte is written
      Status gate = k3pack::doctor::CheckSglangCanLoad(experts.shard_paths.front(), p, model_config, tokenizer_dir,
                                                       allow_mixed_types);
      if (!gate.ok()) {
        // A shard the process could not read is no problem of the model.
        if (k3pack::IsProcessCannotRead(gate.error().sys_errno())) return gate;
        const std::string doctor = k3pack::doctor::DoctorCommand(gguf_dir, p, model_config, tokenizer_dir,
                                                                 allow_mixed_types);
        return gate.error().WithHint("run `" + doctor +
                                     "` for every problem and its fix; pass allow_unsupported=True to build the "
                                     "pack anyway");
      }
    }
    // `k3pack build`'s preflight: the manifest's tokenizer files, before the pack.
    K3_RETURN_IF_ERROR(manifest::CheckTokenizerFilesReadable("tokenizer_dir", tokenizer_dir));
    if (out.empty()) {
      K3_ASSIGN_OR_RETURN(out, pack::DefaultPackPath(experts.shard_paths.front()));
    }
    pack::PackOutputRequest req = PackRequest("pack", out, model_config, experts, force);
    req.note = note;
    // `k3pack build`'s manifest rule, in the plan's own pass (under the pack's lock; a refusal makes no
    // lock file): none of the inputs, the pack included.
    req.then = [&](const pack::PackOutputPlan& decided) -> Status {
      if (manifest_path.empty()) {
        manifest_path = (std::filesystem::path(out).parent_path() / manifest::kDefaultManifestName).string();
      }
      manifest::BuildManifestRequest request;
      request.path = manifest_path;
      request.option = "manifest";
      request.force_option = "force=True";
      request.force = force;
      request.pack_path = out;
      request.pack_action = decided.action;
      request.pack_section = decided.valid_section;
      request.inputs = req.inputs;
      request.tokenizer_dir = tokenizer_dir;
      request.payload_samples = samples;
      request.names.pack = "pack";
      request.names.tokenizer_dir = "tokenizer_dir";
      request.note = note;
      K3_ASSIGN_OR_RETURN(maction, manifest::DecideBuildManifest(request));
      return Status::OK();
    };
    K3_ASSIGN_OR_RETURN(plan, pack::PlanPackOutput(req, experts));
    return Status::OK();
  }();
  waiting.RaiseIfInterrupted();
  Check(st);
  if (!notes.empty()) {
    auto say = LogLines(log);
    for (const std::string& why : notes) say("note: " + why);
  }
  py::dict d;
  d["pack"] = out;
  d["manifest"] = manifest_path;
  d["profile"] = kimi::ProfileName(p);
  d["already_built"] = maction == OutputAction::kAlreadyBuilt;
  // The manifest there is written over (force=True, or the rule took it over).
  d["replace_manifest"] = maction == OutputAction::kReplace;
  // k3pack.build holds it to its manifest's last byte, as `k3pack build` does.
  // None taken where the user may not write and the pack is finished
  // (nothing is written then): an empty one, released alike.
  d["lock"] = py::cast(plan.lock ? std::move(*plan.lock) : k3pack::LockFile());
  return d;
}

// create_manifest(): the manifest, written as `k3pack manifest` writes it
// when `output` is given.
py::object CreateManifestCall(const std::string& gguf_dir, const std::string& expert_pack,
                              const std::string& model_config, const std::string& tokenizer_dir,
                              const std::string& output, const py::object& profile,
                              const py::object& payload_samples,
                              bool full_source_hashes, bool full_pack_hash, py::object progress, bool force,
                              std::map<std::string, std::string> known_shard_sha256) {
  if (!output.empty()) RefuseInsideUserCallback("k3pack.create_manifest");  // without, it writes nothing
  manifest::CreateOptions o;
  o.gguf_dir = gguf_dir;
  o.expert_pack = expert_pack;
  o.model_config = model_config;
  o.tokenizer_dir = tokenizer_dir;
  o.profile = ProfileArg(profile, {expert_pack, model_config, gguf_dir});
  // By its keyword: the library's refusal names the CLI's --payload-samples.
  o.payload_samples = IntInRange<int64_t>(payload_samples, "payload_samples", 0, INT64_MAX);
  o.full_source_hashes = full_source_hashes;
  o.full_pack_hash = full_pack_hash;
  o.progress = LineCallback(progress, "progress");
  // Written into the manifest as given: a digest that is not one ("y", an
  // uppercase one) made a manifest that every later verify refused, as if the
  // shard had changed.
  for (const auto& [path, digest] : known_shard_sha256) {
    const bool hex = digest.size() == 64 && digest.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex) {
      Raise(k3pack::Error("known_shard_sha256[" + k3pack::PyRepr(path) + "] must be a SHA-256 digest (64 lowercase hex "
                          "digits, as hashlib's hexdigest()), got " + k3pack::PyRepr(digest),
                          k3pack::ErrorKind::kValue)
                .WithHint("pass build_pack(hash_sources=True)'s source_sha256, or leave the shard out to hash it"));
    }
  }
  o.known_shard_sha256 = std::move(known_shard_sha256);
  auto signals = std::make_shared<PendingSignals>("creating the manifest");
  o.interrupt_check = PendingSignals::CheckOf(signals);
  Result<nlohmann::json> r = [&]() -> Result<nlohmann::json> {
    NoGil nogil;
    if (!output.empty()) {  // `k3pack manifest`'s look at its output, before the shards are hashed
      K3_RETURN_IF_ERROR(manifest::PreflightManifestOutput("output", output, force, "force=True", gguf_dir, expert_pack,
                                                           model_config, tokenizer_dir, kPyInputNames)
                             .status());
    }
    const std::optional<k3pack::FileStamp> seen = k3pack::SeeOutput(output);
    K3_ASSIGN_OR_RETURN(nlohmann::json doc, manifest::CreateManifest(o));
    if (output.empty()) return doc;
    k3pack::OutputSpec spec;
    spec.option = "output";
    spec.path = output;
    spec.force = force;
    spec.force_option = "force=True";
    spec.is_finished = [&]() -> Result<bool> { return manifest::SameManifest(output, doc); };
    spec.why_refused = "it differs from the manifest of these inputs";
    spec.not_own_kind = [&] { return manifest::NotAManifestFile(output); };
    K3_ASSIGN_OR_RETURN(OutputAction action, k3pack::DecideOutput(spec));
    // Already built: the file is left as it is, and is what is returned.
    if (action == OutputAction::kAlreadyBuilt) return manifest::ReadManifestJson(output);
    K3_RETURN_IF_ERROR(k3pack::CheckOutputWritable("output", output));
    K3_RETURN_IF_ERROR(k3pack::WriteIfStillAsSeen("output", output, seen,
                                                  [&] { return manifest::WriteManifest(output, doc); }));
    return doc;
  }();
  signals->RaiseIfInterrupted();
  return JsonToPython(Unwrap(std::move(r)));
}

// build_pack and the lock _plan_build hands k3pack.build.
void RegisterBuildPack(py::module_& m) {
  py::class_<k3pack::LockFile>(m, "_PackLock",
                       "the exclusive lock on <pack>.lock that _plan_build took; held until release() "
                       "(or until the object goes): no other writer of the pack acts meanwhile")
      .def("release", [](k3pack::LockFile& lock) { lock = k3pack::LockFile(); }, "let the lock go (idempotent)");

  m.def("build_pack", &BuildPackCall,
        py::arg("gguf_dir"), py::arg("model_config"), py::kw_only(), py::arg("out") = "",
        py::arg("profile") = py::none(), py::arg("allow_mixed_types") = false, py::arg("safety_margin_gib") = 2.0,
        py::arg("restart") = false, py::arg("threads") = 0, py::arg("progress") = py::none(),
        py::arg("log") = py::none(), py::arg("force") = false, py::arg("hash_sources") = false,
        py::arg("wait") = py::none(),
        "build the expert-major pack (resumable; `k3pack pack`); out='' = <dir>/<prefix>.expert-major.pack. "
        "As the CLI: out must not be an input; a valid pack of these shards there is reported "
        "(already_built=True) and kept; anything else there is refused unless force=True. "
        "Another process writing the same pack: refused at once, or, with wait=SECONDS (float('inf') or "
        "'forever': until it lets go; `k3pack pack --wait`), waited for, then judged as it left the pack. "
        "hash_sources=True also hashes every whole shard beside the copy (one read of the shards) and returns "
        "source_sha256 {resolved shard path: hex}, which create_manifest(known_shard_sha256=...) takes");
}

// k3pack.build's planning: the outputs and the inputs it finds itself.
void RegisterPlanBuild(py::module_& m) {
  m.def("_plan_build", &PlanBuildCall,
        py::arg("gguf_dir"), py::arg("model_config"), py::arg("tokenizer_dir"), py::kw_only(), py::arg("pack") = "",
        py::arg("manifest") = "", py::arg("profile") = py::none(), py::arg("allow_mixed_types") = false,
        py::arg("allow_unsupported") = false, py::arg("force") = false, py::arg("wait") = py::none(),
        py::arg("log") = py::none(), py::arg("payload_samples") = py::none(),
        "k3pack.build's checks before a byte is written (`k3pack build`'s rules): the pack and manifest paths, "
        "the profile, and whether both are already built");

  // k3pack.build checks its integer options with the binding's own rule
  // before the plan: an already built model returned before build_pack or
  // create_manifest saw a bad one (`k3pack build` refuses it either way).
  m.def("_check_int_option", [](const py::object& value, const std::string& keyword, int64_t lo, int64_t hi) {
    (void)IntInRange<int64_t>(value, keyword.c_str(), lo, hi);
  }, py::arg("value"), py::arg("keyword"), py::arg("lo"), py::arg("hi"),
     "IntInRange's check of an integer option: TypeError (not an int) or ValueError (outside lo..hi)");

  m.def("_implied_inputs", [](const std::string& gguf_dir, const std::string& model_config,
                              const std::string& tokenizer_dir) {
    py::list used;
    auto note = [&](const char* keyword, const manifest::ImpliedPath& found) {
      used.append(py::make_tuple(keyword, found.path, found.why));
    };
    std::string tok = tokenizer_dir, config = model_config;
    // A directory without shards is what is wrong then (as `k3pack build`
    // says), not the tokenizer or config that could not be found beside it.
    if (tok.empty() || config.empty()) Check(gguf::ShardSet::Discover(gguf_dir).status());
    if (tok.empty()) {
      manifest::ImpliedPath found = Unwrap(manifest::ImpliedTokenizerDir(gguf_dir, kPyInputNames));
      tok = found.path;
      note("tokenizer_dir", found);
    }
    if (config.empty()) {
      manifest::ImpliedPath found = Unwrap(manifest::ImpliedModelConfig(gguf_dir, tok, kPyInputNames));
      config = found.path;
      note("model_config", found);
    }
    return py::make_tuple(config, tok, used);
  }, py::arg("gguf_dir"), py::arg("model_config"), py::arg("tokenizer_dir"),
     "(model_config, tokenizer_dir, [(keyword, path, why)]): the inputs left empty, found as `k3pack build` "
     "finds them (SGLang's server's tokenizer rule; config.json beside the shards or in the tokenizer dir)");
}

// SGLang's validator.
void RegisterValidatePack(py::module_& m) {
  m.def("validate_pack", [](const std::string& pack_path, const std::string& gguf_dir, const std::string& model_config,
                            const py::object& profile, py::object allow_mixed_types,
                            const py::object& payload_samples,
                            bool full_pack_hash, py::object progress) {
    kimi::Profile p = ProfileArg(profile, {model_config, gguf_dir});
    bool mixed = allow_mixed_types.is_none() ? p == kimi::Profile::kScaled : TruthArg(allow_mixed_types);
    pack::ValidateOptions o;
    o.payload_samples = IntInRange<int64_t>(payload_samples, "payload_samples", 0, INT64_MAX);
    o.full_pack_hash = full_pack_hash;
    o.progress = ProgressCallback(progress);
    auto signals = std::make_shared<PendingSignals>("validating the pack");
    o.interrupt_check = PendingSignals::CheckOf(signals);
    Result<nlohmann::json> r = [&]() -> Result<nlohmann::json> {
      NoGil nogil;
      K3_ASSIGN_OR_RETURN(const pack::CollectOptions copts, PythonCollectOptions(mixed, p));
      K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(gguf_dir, model_config, p, copts));
      return pack::ValidatePack(pack_path, experts, o);
    }();
    signals->RaiseIfInterrupted();
    return JsonToPython(Unwrap(std::move(r)));
  }, py::arg("pack_path"), py::arg("gguf_dir"), py::arg("model_config"), py::kw_only(),
     py::arg("profile") = py::none(), py::arg("allow_mixed_types") = py::none(), py::arg("payload_samples") = 6,
     py::arg("full_pack_hash") = false, py::arg("progress") = py::none(),
     "SGLang's validate_ggml_moe_pack: returns the manifest's expert_pack section. profile=None: the one "
     "recorded beside the inputs (as build_pack), else kimi-k3");
}

// Writing, serializing and reading manifests.
void RegisterManifest(py::module_& m) {
  m.def("create_manifest", &CreateManifestCall,
        py::arg("gguf_dir"), py::arg("expert_pack"), py::arg("model_config"), py::arg("tokenizer_dir"), py::kw_only(),
        py::arg("output") = "", py::arg("profile") = py::none(), py::arg("payload_samples") = 6,
        py::arg("full_source_hashes") = true, py::arg("full_pack_hash") = false, py::arg("progress") = py::none(),
        py::arg("force") = false, py::arg("known_shard_sha256") = std::map<std::string, std::string>{},
        "SGLang's create_manifest; writes it byte-compatibly to `output` when given (as `k3pack manifest`: not an "
        "input; the same manifest there is kept; another manifest there is replaced only with force=True, and any "
        "other file never); returns the "
        "document. known_shard_sha256 {resolved shard path: hex} (build_pack(hash_sources=True)'s source_sha256): "
        "those shards are not read again for full_source_hashes");

  m.def("serialize_manifest", [](py::object doc) {
    // allow_nan=False: NaN / Infinity is json's own ValueError, not nlohmann's parse_error as a RuntimeError.
    std::string text =
        py::module_::import("json").attr("dumps")(doc, py::arg("allow_nan") = false).cast<std::string>();
    nlohmann::json parsed;
    IntegersAsWritten sax(parsed);
    try {
      nlohmann::json::sax_parse(text, &sax);
    } catch (const nlohmann::json::exception& e) {
      // json.dumps escapes a lone surrogate (a path os.fsdecode made of
      // bytes that are not UTF-8), which no UTF-8 file can hold.
      throw py::value_error("serialize_manifest: the manifest holds text that UTF-8 cannot encode (a lone "
                            "surrogate, as os.fsdecode makes of a name that is not UTF-8): " +
                            k3pack::JsonErrorText(e));
    }
    if (!sax.inexact.empty()) {
      throw py::value_error("serialize_manifest: the integer " + sax.inexact +
                            " does not fit in 64 bits, so the manifest's JSON cannot hold it exactly");
    }
    return py::bytes(manifest::SerializeManifest(parsed));
  }, py::arg("manifest"), "the exact bytes the manifest file holds (indent=2, sorted keys, raw UTF-8, newline)");

  m.def("read_manifest", [](const std::string& path) {
    return JsonToPython(Unwrap(manifest::ReadManifestJson(path)));
  }, py::arg("path"),
     "the manifest file's JSON as dicts and lists, parsed but not checked (ExpertStore and verify_pack check "
     "it); a missing file is FileNotFoundError, text that is not JSON a ValueError naming the file and the "
     "parser's position");
}

// verify_pack: a pack against its manifest and shards.
void RegisterVerifyPack(py::module_& m) {
  m.def("verify_pack", [](const std::string& manifest_path, bool full, const py::object& samples,
                          bool against_source, py::object progress) {
    manifest::VerifyPackOptions o;
    o.full = full;
    o.against_source = against_source;
    o.samples = CountArg(samples, "samples", 0, INT64_MAX);  // negative: the library's "must be non-negative"
    o.progress = ProgressCallback(progress);
    auto signals = std::make_shared<PendingSignals>("verifying the pack");
    o.interrupt_check = PendingSignals::CheckOf(signals);
    Result<nlohmann::json> r = [&]() -> Result<nlohmann::json> {
      NoGil nogil;
      return manifest::VerifyPack(manifest_path, o);
    }();
    signals->RaiseIfInterrupted();
    return JsonToPython(Unwrap(std::move(r)));
  }, py::arg("manifest"), py::kw_only(), py::arg("full") = false, py::arg("samples") = 6,
     py::arg("against_source") = false, py::arg("progress") = py::none(),
     "shards unchanged (size + header digest), pack structure and index digest as recorded, then payloads: "
     "`samples` byte compares with GGUF, or full=True: every payload against the digest sidecar");
}

}  // namespace

void RegisterPack(py::module_& m) {
  RegisterBuildPack(m);
  RegisterPlanBuild(m);
  RegisterValidatePack(m);
  RegisterManifest(m);
  RegisterVerifyPack(m);
}

}  // namespace k3py
