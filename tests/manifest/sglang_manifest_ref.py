"""Independent Python reference of SGLang's create_manifest (kimi_ggml.py),
written from the compatibility spec (docs/sglang-expert-pack.md §2-§4, §8.2)
for k3pack's tests. It shares no code with k3pack: GGUF files and the expert
pack are parsed by hand with `struct`, and the manifest is serialized with
CPython's json module exactly as SGLang's write_json_atomic does.

Under --profile scaled the k3pack extension key is added as the project
brief defines it ("k3pack": {"profile": "scaled", "layer_roles": [...]}).
"""
import argparse
import hashlib
import json
import mmap
import re
import struct
import sys
from pathlib import Path

# id -> (gguf-py name, block size, type size)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    # gguf-py's constants at the llama.cpp revision the GGUF doc's type table is taken from (UD-Q1_0 uses 41).
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

PACK_HEADER = struct.Struct("<16sIIQQ")
PACK_ENTRY = struct.Struct("<128siIQQ")
ROLE_ORDER = ("up", "gate", "down")
EXPERT_RE = re.compile(r"blk\.(?P<layer>\d+)\.ffn_(?P<role>up|gate|down)_exps\.weight")


class Reader:
    def __init__(self, data):
        self.d = data
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.d[self.o:self.o + n]).decode("utf-8")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            at = self.take("<I")
            n = self.take("<Q")
            return [self.value(at) for _ in range(n)]
        return self.take(SCALAR[t])


def map_file(path):
    # mmap, not read_bytes: the full-scale synthetic files are sparse (~1 TB apparent).
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def sha256_of(data, end=None):
    h = hashlib.sha256()
    end = len(data) if end is None else end
    for o in range(0, end, 64 << 20):
        h.update(data[o:min(end, o + (64 << 20))])
    return h.hexdigest()


def read_gguf(path):
    data = map_file(path)
    r = Reader(data)
    assert data[:4] == b"GGUF"
    r.o = 4
    r.take("<I")
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        kv[k] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        t = r.take("<I")
        off = r.take("<Q")
        infos.append((name, dims, t, off))
    align = kv.get("general.alignment", 32)
    data_offset = (r.o + align - 1) // align * align
    tensors = []
    for name, dims, t, off in infos:
        n_el = 1
        for d in dims:
            n_el *= d
        tname, blk, tsz = GGML_TYPES[t]
        tensors.append(dict(name=name, shape=list(dims), dtype=tname, dtype_id=t,
                            data_offset=data_offset + off, nbytes=n_el * tsz // blk))
    return kv, tensors, data_offset, data


def spec_from_config(path, profile):
    config = json.loads(path.read_text(encoding="utf-8"))
    text = config.get("text_config", config)
    s = dict(
        num_hidden_layers=int(text["num_hidden_layers"]),
        first_k_dense_replace=int(text["first_k_dense_replace"]),
        num_experts=int(text["num_experts"]),
        top_k=int(text["num_experts_per_token"]),
        num_shared_experts=int(text["num_shared_experts"]),
        hidden_size=int(text["hidden_size"]),
        routed_expert_hidden_size=int(text["routed_expert_hidden_size"]),
        moe_intermediate_size=int(text["moe_intermediate_size"]),
        hidden_act=str(text["hidden_act"]),
    )
    if profile == "kimi-k3":
        expected = dict(num_hidden_layers=93, first_k_dense_replace=1, num_experts=896, top_k=16,
                        num_shared_experts=2, hidden_size=7168, routed_expert_hidden_size=3584,
                        moe_intermediate_size=3072, hidden_act="situ")
        if s != expected:
            raise ValueError(f"Kimi K3 model invariants do not match the audited model: expected={expected}, actual={s}")
    s["active"] = list(range(s["first_k_dense_replace"], s["num_hidden_layers"]))
    return s


def canonical_sha256(v):
    return hashlib.sha256(json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def scan(gguf_dir, full_hashes):
    paths = sorted(Path(gguf_dir).resolve(strict=True).glob("*.gguf"))
    numbered = []
    for p in paths:
        m = re.search(r"-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$", p.name)
        numbered.append((int(m.group("number")), p))
    numbered.sort()
    shards, tensors, blobs = [], [], []
    for index, (_, p) in enumerate(numbered):
        p = p.resolve()
        kv, ts, meta, data = read_gguf(p)
        assert kv["split.no"] == index
        rec = dict(index=index, path=str(p), size=len(data), metadata_nbytes=meta,
                   metadata_sha256=sha256_of(data, meta), tensor_count=len(ts))
        if full_hashes:
            rec["sha256"] = sha256_of(data)
        shards.append(rec)
        for t in ts:
            t["shard_index"] = index
            tensors.append(t)
        blobs.append(data)
    tensors.sort(key=lambda t: t["name"])
    summary = dict(architecture="kimi-k3", shard_count=len(shards), tensor_count=len(tensors),
                   total_bytes=sum(s["size"] for s in shards), full_source_hashes=full_hashes)
    source = dict(summary=summary, shards=shards, tensors=tensors)
    source["inventory_sha256"] = canonical_sha256(source)
    return source, blobs


def pack_section(pack_path, spec, source, blobs, samples, full_hash):
    pack_path = Path(pack_path).resolve(strict=True)
    data = map_file(pack_path)
    magic, version, header_size, count, data_start = PACK_HEADER.unpack_from(data, 0)
    E = spec["num_experts"]
    by_name = {t["name"]: t for t in source["tensors"]}
    # SGLang keys a stack by (int(layer), role): "blk.07" is layer 7's, and its
    # writer keeps that name in the index.
    by_key = {}
    for t in source["tensors"]:
        m = EXPERT_RE.fullmatch(t["name"])
        if m:
            by_key[(int(m.group("layer")), m.group("role"))] = t
    entries = [PACK_ENTRY.unpack_from(data, 40 + 152 * i) for i in range(count)]
    assert count == len(spec["active"]) * E * 3
    # Per layer geometry from the entries themselves (first expert of each layer).
    layer_roles = []
    for li, layer in enumerate(spec["active"]):
        base = li * E * 3
        off = [entries[base + r][3] for r in range(3)]
        nb = [entries[base + r][4] for r in range(3)]
        item = dict(layer=layer, object_bytes=off[2] + nb[2] - off[0])
        for r, role in enumerate(ROLE_ORDER):
            t = by_key[(layer, role)]
            item[role] = dict(dtype=t["dtype"], dtype_id=t["dtype_id"], expert_bytes=t["nbytes"] // E)
        layer_roles.append(item)
    for i, (name, expert, reserved, off, nb) in enumerate(entries):
        obj, role_id = divmod(i, 3)
        li, e = divmod(obj, E)
        m = EXPERT_RE.fullmatch(name.split(b"\0", 1)[0].decode())
        assert m and (int(m.group("layer")), m.group("role")) == (spec["active"][li], ROLE_ORDER[role_id])
        assert expert == e and reserved == 0
        assert nb == layer_roles[li][ROLE_ORDER[role_id]]["expert_bytes"] and off % 4096 == 0
    roles = {}
    first = spec["active"][0]
    for role in ROLE_ORDER:
        t = by_key[(first, role)]
        n = len(spec["active"]) * E
        roles[role] = dict(dtype=t["dtype"], dtype_id=t["dtype_id"], logical_shape=t["shape"][:2],
                           expert_bytes=t["nbytes"] // E, entry_count=n,
                           payload_bytes=sum(lr[role]["expert_bytes"] for lr in layer_roles) * E)
    if samples <= 0:
        picks = []
    elif samples == 1:
        picks = [0]
    else:
        picks = sorted({round(i * (count - 1) / (samples - 1)) for i in range(samples)})
    for i in picks:
        name, expert, _, off, nb = entries[i]
        t = by_name[name.split(b"\0", 1)[0].decode()]
        src = blobs[t["shard_index"]][t["data_offset"] + expert * nb:t["data_offset"] + (expert + 1) * nb]
        assert data[off:off + nb] == src, f"payload mismatch at entry {i}"
    sec = dict(path=str(pack_path), size=len(data), magic=magic.rstrip(b"\0").decode("ascii"), version=version,
               header_bytes=header_size, entry_bytes=PACK_ENTRY.size, index_count=count, data_start=data_start,
               alignment=4096, index_sha256=sha256_of(data, 40 + 152 * count),
               physical_role_order=list(ROLE_ORDER), active_moe_layer_ids=spec["active"], num_experts=E,
               top_k=spec["top_k"], object_bytes=layer_roles[0]["object_bytes"], roles=roles,
               payload_samples_verified=len(picks), full_pack_hash=full_hash)
    if full_hash:
        sec["sha256"] = sha256_of(data)
    return sec, layer_roles


def tokenizer_section(tok_dir):
    tok = Path(tok_dir).resolve(strict=True)
    files = [dict(name=p.name, size=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
             for p in sorted(tok.iterdir()) if p.is_file()]
    return dict(path=str(tok), files=files, inventory_sha256=canonical_sha256(files))


def main():
    ap = argparse.ArgumentParser()
    for a in ("--gguf-dir", "--expert-pack", "--model-config", "--tokenizer-dir", "--output", "--created-at", "--git-sha"):
        ap.add_argument(a, required=True)
    ap.add_argument("--payload-samples", type=int, default=6)
    ap.add_argument("--full-source-hashes", action="store_true")
    ap.add_argument("--full-pack-hash", action="store_true")
    ap.add_argument("--profile", default="kimi-k3")
    a = ap.parse_args()
    config = Path(a.model_config)
    spec = spec_from_config(config, a.profile)
    source, blobs = scan(a.gguf_dir, a.full_source_hashes)
    pack, layer_roles = pack_section(a.expert_pack, spec, source, blobs, a.payload_samples, a.full_pack_hash)
    manifest = {
        "format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1",
        "complete": True,
        "created_at": a.created_at,
        "sglang_git_sha": a.git_sha,
        # SGLang's create_manifest writes the literal 16, whatever the model's top-k.
        "hard_constraints": {"top_k": 16, "top_k_is_immutable": True, "all_selected_experts_must_execute": True,
                             "expert_pruning_allowed": False, "requantization_allowed": False},
        "model": {
            "config_path": str(config.resolve()),
            "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
            "architecture": "KimiLinearForCausalLM",
            "num_hidden_layers": spec["num_hidden_layers"],
            "active_moe_layer_ids": spec["active"],
            "num_experts": spec["num_experts"],
            "num_experts_per_token": spec["top_k"],
            "num_shared_experts": spec["num_shared_experts"],
            "hidden_size": spec["hidden_size"],
            "routed_expert_hidden_size": spec["routed_expert_hidden_size"],
            "moe_intermediate_size": spec["moe_intermediate_size"],
            "hidden_act": spec["hidden_act"],
        },
        "source": source,
        "expert_pack": pack,
        "tokenizer": tokenizer_section(a.tokenizer_dir),
        "verification": {"structure": "complete", "payload_samples": a.payload_samples,
                         "full_source_hashes": a.full_source_hashes, "full_pack_hash": a.full_pack_hash},
    }
    if a.profile == "scaled":
        manifest["k3pack"] = {"profile": "scaled", "layer_roles": layer_roles}
    with open(a.output, "w", encoding="utf-8", newline="\n") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
