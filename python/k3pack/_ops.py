"""Quantization, pack, manifest, expert-store and synthetic-model operations
(bindings of include/k3pack/quant.h, pack.h, manifest.h, store.h, synth.h)."""

import os

from . import _k3pack

__all__ = [
    "dequantize", "tensor_stats", "quant_isa", "dequantize_tensor",
    "build_pack", "validate_pack", "create_manifest", "read_manifest", "serialize_manifest", "verify_pack",
    "build", "ExpertStore", "Acquisition", "ExpertView", "synth", "synth_faults",
]

dequantize = _k3pack.dequantize
tensor_stats = _k3pack.tensor_stats
quant_isa = _k3pack.quant_isa
build_pack = _k3pack.build_pack
validate_pack = _k3pack.validate_pack
create_manifest = _k3pack.create_manifest
read_manifest = _k3pack.read_manifest
serialize_manifest = _k3pack.serialize_manifest
verify_pack = _k3pack.verify_pack
ExpertStore = _k3pack.ExpertStore
Acquisition = _k3pack.Acquisition
ExpertView = _k3pack.ExpertView
synth = _k3pack.synth
synth_faults = _k3pack.synth_faults


def dequantize_tensor(source, name):
    """float32 values of tensor `name` of a GGUFFile or ShardSet, in numpy
    (reversed-ne) shape, bit-identical to ggml's dequantization."""
    t = source.tensor(name)
    return _k3pack.dequantize(source.tensor_data(name), t.type_id)


def build(gguf_dir, model_config, tokenizer_dir, *, pack=None, manifest=None, profile="kimi-k3",
          payload_samples=6, progress=None, log=None, **build_options):
    """GGUF shards -> expert pack -> adapter manifest in one call, with
    `k3pack build`'s defaults: the pack beside the shards
    (<prefix>.expert-major.pack), the manifest beside the pack
    (kimi-k3-expert-pack.manifest.json, SGLang's name).
    Returns {"pack": build result dict, "manifest": path, "document": manifest dict}."""
    result = _k3pack.build_pack(gguf_dir, model_config, out=pack or "", profile=profile, progress=progress,
                                log=log, **build_options)
    pack_path = result["pack"]
    if manifest is None:
        manifest = os.path.join(os.path.dirname(pack_path), "kimi-k3-expert-pack.manifest.json")
    doc = _k3pack.create_manifest(gguf_dir, pack_path, model_config, tokenizer_dir, output=manifest, profile=profile,
                                  payload_samples=payload_samples)
    return {"pack": result, "manifest": manifest, "document": doc}
