"""Quantization, pack, manifest, expert-store and synthetic-model operations
(bindings of include/k3pack/quant.h, pack.h, manifest.h, store.h, synth.h)."""

import os

from . import _k3pack
from ._paths import accept_paths_in, accepts_paths

__all__ = [
    "dequantize", "tensor_stats", "quant_isa", "dequantize_tensor",
    "build_pack", "validate_pack", "create_manifest", "read_manifest", "serialize_manifest", "verify_pack",
    "build", "ExpertStore", "Acquisition", "ExpertView", "synth", "synth_faults",
]

dequantize = _k3pack.dequantize
tensor_stats = _k3pack.tensor_stats
quant_isa = _k3pack.quant_isa
build_pack = accepts_paths(_k3pack.build_pack)
validate_pack = accepts_paths(_k3pack.validate_pack)
create_manifest = accepts_paths(_k3pack.create_manifest)
read_manifest = accepts_paths(_k3pack.read_manifest)
serialize_manifest = _k3pack.serialize_manifest
verify_pack = accepts_paths(_k3pack.verify_pack)
ExpertStore = accept_paths_in(_k3pack.ExpertStore)
Acquisition = _k3pack.Acquisition
ExpertView = _k3pack.ExpertView
synth = accepts_paths(_k3pack.synth)
synth_faults = _k3pack.synth_faults


def dequantize_tensor(source, name):
    """float32 values of tensor `name` of a GGUFFile or ShardSet, in numpy
    (reversed-ne) shape, bit-identical to ggml's dequantization."""
    t = source.tensor(name)
    return _k3pack.dequantize(source.tensor_data(name), t.type_id)


# What build() passes on to build_pack through **build_options (the rest of
# build_pack's keywords build() sets itself).
_BUILD_PACK_OPTIONS = frozenset({"allow_mixed_types", "safety_margin_gib", "restart", "threads"})


@accepts_paths
def build(gguf_dir, model_config=None, tokenizer_dir=None, *, pack=None, manifest=None, profile=None,
          payload_samples=None, full_source_hashes=True, force=False, allow_unsupported=False, progress=None, log=None,
          wait=None, **build_options):
    """GGUF shards -> expert pack -> adapter manifest in one call, with
    `k3pack build`'s defaults and output rules: the pack beside the shards
    (<prefix>.expert-major.pack), the manifest beside the pack
    (kimi-k3-expert-pack.manifest.json, SGLang's name); the profile, when
    None, is the one recorded by k3pack.synth / a manifest, else kimi-k3.
    tokenizer_dir, when None, is found where SGLang's server finds it
    (<shard dir>/tokenizer, <shard dir>/../kimi-k3-tokenizer, the sorted
    <shard dir>/../*tokenizer* directories; none or several: RuntimeError
    with SGLang's text), and model_config is config.json beside the shards,
    else the tokenizer directory's; each one found is passed to `log` and
    returned under "inputs". Both outputs are checked before a byte is
    written: neither may be an input; a valid pack with its manifest is
    "already built" and left as it is; anything else there is refused
    (FileExistsError, saying whose model a copied directory's manifest
    records) unless force=True, which replaces only a pack or a manifest
    (another file there is refused even with it). As `k3pack build`, a manifest that records
    this pack where none of its files is any more (a moved model), the
    manifest of a forced rebuild under way, an old rank manifest SGLang
    would serve with zeros, one older than a shard it records, or one that
    records another tokenizer_dir or payload_samples than asked (given:
    None, the default, is 6 and judges no finished manifest) is written
    anew without force, saying so to `log`
    (else the "k3pack" logger). Returns {"pack": build result dict,
    "manifest": path, "document": manifest dict, "already_built": bool,
    "inputs": {"model_config": path, "tokenizer_dir": path}}.
    As `k3pack build`, a checkpoint doctor finds SGLang cannot load (e.g.
    BF16 matrices, attn_k_b not Q4_0) is refused before a byte is written
    ("SGLang cannot load this checkpoint: ...") unless allow_unsupported=True.
    Another process writing the same pack (`k3pack build`, another build()):
    refused at once (OSError, errno EWOULDBLOCK, naming it), or with wait=SECONDS
    (float("inf") or "forever": until it lets go; `k3pack build --wait`)
    waited for, each change told to `log` (else the "k3pack" logger), and the
    outputs then judged as it left them."""
    # Checked before the plan, as `k3pack build` checks its flags: an already
    # built model returned before these reached build_pack, so a misspelt
    # option (threds=2) or a bad value (payload_samples=-1) passed unnoticed;
    # a fresh build refused a misspelt one as build_pack()'s, a name not called.
    unknown = sorted(set(build_options) - _BUILD_PACK_OPTIONS)
    if unknown:
        raise TypeError(f"build() got an unexpected keyword argument {unknown[0]!r}")
    asked_samples = payload_samples  # None: the default, which judges no finished manifest
    payload_samples = 6 if payload_samples is None else payload_samples
    _k3pack._check_int_option(payload_samples, "payload_samples", 0, 2 ** 63 - 1)
    for keyword, callback in (("progress", progress), ("log", log)):
        if callback is not None and not callable(callback):
            raise TypeError(f"{keyword} must be a callable or None, got {type(callback).__name__}")
    if "threads" in build_options:
        _k3pack._check_int_option(build_options["threads"], "threads", 0, 2 ** 31 - 1)
    model_config, tokenizer_dir, found = _k3pack._implied_inputs(
        os.fspath(gguf_dir), "" if model_config is None else os.fspath(model_config),
        "" if tokenizer_dir is None else os.fspath(tokenizer_dir))
    for keyword, path, why in found:
        if log is not None:
            log("using %s=%s (%s)" % (keyword, path, why))
    inputs = {"model_config": model_config, "tokenizer_dir": tokenizer_dir}
    plan = _k3pack._plan_build(gguf_dir, model_config, tokenizer_dir, pack=pack or "", manifest=manifest or "",
                               profile=profile, allow_mixed_types=build_options.get("allow_mixed_types", False),
                               allow_unsupported=allow_unsupported, force=force, wait=wait, log=log,
                               payload_samples=asked_samples)
    # The pack's lock, from the look at the outputs to the manifest's last byte: another writer never
    # replaces the pack between its build and the manifest that records it (this thread takes it again).
    lock = plan.pop("lock")
    try:
        if plan["already_built"]:
            document = _k3pack.read_manifest(plan["manifest"])
            if log is not None:
                if full_source_hashes and document.get("verification", {}).get("full_source_hashes") is False:
                    # Asked for (the default) but not in the finished manifest, which is kept as it is.
                    log("note: %s was written without whole-shard SHA-256 of the shards (full_source_hashes=False) "
                        "and is kept as it is; create_manifest(..., output=%r, force=True) writes it with them "
                        "(reads every shard once)" % (plan["manifest"], plan["manifest"]))
                # force=True writes beside it: where this user may not write, it is refused.
                writable = os.access(os.path.dirname(os.path.abspath(plan["manifest"])), os.W_OK | os.X_OK)
                log("already built: %s (%s)" % (plan["manifest"], "use force=True to rebuild" if writable
                                                 else "read-only for you: rebuild it elsewhere"))
            return {"pack": {"pack": plan["pack"], "already_built": True}, "manifest": plan["manifest"],
                    "document": document, "already_built": True, "inputs": inputs}
        # The shards are hashed beside the copy (one read of them, as `k3pack build`), not again by the manifest.
        result = _k3pack.build_pack(gguf_dir, model_config, out=plan["pack"], profile=plan["profile"], force=force,
                                    progress=progress, log=log, hash_sources=full_source_hashes, **build_options)
        doc = _k3pack.create_manifest(gguf_dir, result["pack"], model_config, tokenizer_dir, output=plan["manifest"],
                                      profile=plan["profile"], payload_samples=payload_samples,
                                      full_source_hashes=full_source_hashes, force=plan["replace_manifest"],
                                      known_shard_sha256=result.get("source_sha256", {}))
        return {"pack": result, "manifest": plan["manifest"], "document": doc, "already_built": False,
                "inputs": inputs}
    finally:
        lock.release()
