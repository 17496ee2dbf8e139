"""Independent Python reference of SGLang's readers of the Kimi expert pack
and its adapter manifest, written from the compatibility spec
(docs/sglang-expert-pack.md), sharing no code with k3pack:

  * store_checks: KimiGGMLExpertPackStore's start-up checks (§2.7 steps
    1-14, §7.2), with the §6.7 texts;
  * iterator_checks: the non-expert iterator's manifest checks (§2.7, §5.3,
    §6.4 texts); GGUF headers parsed by tests/manifest/sglang_manifest_ref.py;
  * validate_pack: validate_ggml_moe_pack (§1.1, §6.2 texts), which
    prepare_kimi_pack runs on an existing pack (§8.1 step 5);
  * prepare_pack_decision: what the server's auto-preparation (§8.4 steps
    1 and 5) does with what it finds beside a shard: reuse or rebuild.

The model constants are SGLang's (93 layers, 896 experts, top-k 16, MoE
layers 1..92) unless a test passes the dimensions of a scaled model, which
asks "what would SGLang's code do with these constants".
"""
import hashlib
import json
import os
import re
import struct
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "manifest"))
import sglang_manifest_ref as gguf_ref  # noqa: E402  (struct-only GGUF header reader)

FORMAT = "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1"
HARD_CONSTRAINTS = {"top_k": 16, "top_k_is_immutable": True, "all_selected_experts_must_execute": True,
                    "expert_pruning_allowed": False, "requantization_allowed": False}
PACK_MAGIC = b"GGMLMOEPACKv1\0\0\0"
HEADER = struct.Struct("<16sIIQQ")
ENTRY = struct.Struct("<128siIQQ")
ROLES = ("up", "gate", "down")
NAME_RE = re.compile(r"^blk\.(?P<layer>\d+)\.ffn_(?P<role>up|gate|down)_exps\.weight$")
ROUTED_RE = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down)_exps\.weight$")
SHARD_RE = re.compile(r"-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _load(manifest_path):
    with open(manifest_path, encoding="utf-8") as f:
        return json.load(f)


def store_checks(pack_path, manifest_path, expected_layers=93, expected_experts=896, expected_top_k=16,
                 active_layers=None, k3_types=True, verify_pack_sha256=False):
    """Raises what SGLang's store raises at start-up; returns the index digest."""
    active_layers = list(range(1, 93)) if active_layers is None else list(active_layers)
    pack, manifest_p = Path(pack_path).resolve(), Path(manifest_path).resolve()
    if not pack.is_file() or not manifest_p.is_file():
        raise FileNotFoundError(f"Kimi expert-pack or manifest is missing: {pack}, {manifest_p}")
    m = _load(manifest_p)
    if not m.get("complete") or m.get("format") != FORMAT:
        raise ValueError("Kimi expert-pack manifest is incomplete or unsupported")
    if m.get("hard_constraints") != HARD_CONSTRAINTS:
        raise ValueError("Kimi manifest hard constraints do not match runtime policy")
    model = m["model"]
    dims = (int(model["num_hidden_layers"]), int(model["num_experts"]), int(model["num_experts_per_token"]))
    expected = (expected_layers, expected_experts, expected_top_k)
    if dims != expected or expected_top_k != 16 and k3_types:
        raise ValueError(f"Kimi expert-pack dimensions {dims} != {expected}; Top-K is immutable at 16")
    if tuple(int(v) for v in model["active_moe_layer_ids"]) != tuple(active_layers):
        raise ValueError("Kimi active routed MoE layers must be exactly 1..92")
    ep = m["expert_pack"]
    if Path(ep["path"]).resolve() != pack:
        raise ValueError("Kimi manifest expert-pack path does not match pack_path")
    size = pack.stat().st_size
    if int(ep["size"]) != size:
        raise ValueError("Kimi expert-pack size does not match its manifest")
    if ep.get("physical_role_order") != ["up", "gate", "down"]:
        raise ValueError("Kimi expert-pack physical role order is unsupported")
    roles = ep["roles"]
    if k3_types:
        for role, (name, type_id) in zip(ROLES, (("Q2_K", 10), ("Q2_K", 10), ("Q3_K", 11))):
            if roles[role]["dtype"] != name or int(roles[role]["dtype_id"]) != type_id:
                raise ValueError(f"Kimi expert-pack {role} quant type is unsupported")
    role_bytes = {r: int(roles[r]["expert_bytes"]) for r in ROLES}
    if sum(role_bytes.values()) != int(ep["object_bytes"]):
        raise ValueError("Kimi expert-pack role sizes do not match object bytes")
    role_offsets = {"up": 0, "gate": role_bytes["up"], "down": role_bytes["up"] + role_bytes["gate"]}
    count = len(active_layers) * expected_experts * 3
    alignment = int(ep["alignment"])
    digest = hashlib.sha256()
    with open(pack, "rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise ValueError("Kimi expert-pack header is truncated")
        magic, version, header_size, index_count, data_start = HEADER.unpack(head)
        if (magic != PACK_MAGIC or version != 1 or header_size != 40 or index_count != count
                or data_start != int(ep["data_start"])):
            raise ValueError("Kimi expert-pack header does not match its manifest")
        digest.update(head)
        index = f.read(count * ENTRY.size)
    if len(index) < count * ENTRY.size:
        raise ValueError("Kimi expert-pack index is truncated")
    digest.update(index)
    previous_end, object_offset = data_start, {}
    for i in range(count):
        name, expert, reserved, offset, nbytes = ENTRY.unpack_from(index, i * ENTRY.size)
        obj, role_id = divmod(i, 3)
        layer_i, want_expert = divmod(obj, expected_experts)
        layer, role = active_layers[layer_i], ROLES[role_id]
        match = NAME_RE.fullmatch(name.split(b"\0", 1)[0].decode("utf-8"))
        if (not match or int(match["layer"]) != layer or match["role"] != role or expert != want_expert
                or reserved != 0):
            raise ValueError(f"Kimi expert-pack identity mismatch at index {i}")
        if (nbytes != role_bytes[role] or offset % alignment or offset < previous_end
                or offset + nbytes > size):
            raise ValueError(f"Kimi expert-pack range mismatch at index {i}")
        if role == "up":
            object_offset[(layer, expert)] = offset
        if offset != object_offset[(layer, expert)] + role_offsets[role]:
            raise ValueError(f"Kimi expert object is not contiguous at index {i}")
        previous_end = offset + nbytes
    if previous_end != size:
        raise ValueError("Kimi expert-pack file has trailing or missing bytes")
    if digest.hexdigest() != ep["index_sha256"]:
        raise ValueError("Kimi expert-pack index SHA-256 does not match manifest")
    if verify_pack_sha256:
        if not ep.get("sha256"):
            raise ValueError("full pack verification requested, but manifest has no full SHA-256")
        if gguf_ref.sha256_of(gguf_ref.map_file(pack)) != ep["sha256"]:
            raise ValueError("Kimi expert-pack SHA-256 does not match manifest")
    # Read for the synthesized header and the entry records.
    m["source"]["inventory_sha256"], m["model"]["config_sha256"]
    for role in ROLES:
        tuple(roles[role]["logical_shape"])
    return ep["index_sha256"]


def iterator_checks(manifest_path):
    """The non-expert iterator's checks before it yields (no tensor data is
    read). Returns the number of non-routed tensors it would stream."""
    m = _load(manifest_path)
    if m.get("format") != FORMAT:
        raise ValueError("Kimi-K3 manifest format is unsupported")
    if not m.get("complete"):
        raise ValueError("Kimi-K3 manifest is incomplete")
    source = m["source"]
    streamed = 0
    for shard in source["shards"]:
        path = Path(shard["path"])
        if not path.is_file() or path.stat().st_size != int(shard["size"]):
            raise FileNotFoundError(f"Kimi-K3 GGUF shard is missing or changed: {path}")
        _, tensors, _, data = gguf_ref.read_gguf(path)
        data.close()
        recorded = {t["name"]: t for t in source["tensors"] if int(t["shard_index"]) == int(shard["index"])}
        if {t["name"] for t in tensors} != set(recorded):
            raise ValueError(f"Kimi-K3 GGUF shard inventory changed: {path}")
        for t in tensors:
            if t["dtype"] != recorded[t["name"]]["dtype"]:
                raise ValueError(f"Kimi-K3 GGUF tensor type changed: {t['name']}")
            streamed += not ROUTED_RE.fullmatch(t["name"])
    return streamed


def pack_path_for(shard):
    """prepare_kimi_pack's pack beside a shard (§3): the name up to -NNNNN-of-NNNNN.gguf."""
    shard = Path(shard)
    match = SHARD_RE.search(shard.name)
    if not match:
        raise ValueError(f"Kimi GGUF name is not a numbered shard: {shard}")
    return shard.parent / (shard.name[:match.start()] + ".expert-major.pack")


def validate_pack(pack_path, shard_dir, num_experts=896, active_layers=None, payload_samples=6):
    """validate_ggml_moe_pack against the shards of `shard_dir` (§6.2 texts)."""
    active_layers = list(range(1, 93)) if active_layers is None else list(active_layers)
    pack = Path(pack_path).resolve(strict=True)
    tensors = {}
    blobs = []
    for i, shard in enumerate(sorted(Path(shard_dir).resolve(strict=True).glob("*.gguf"),
                                     key=lambda p: int(SHARD_RE.search(p.name)["number"]))):
        _, ts, _, data = gguf_ref.read_gguf(shard)
        blobs.append(data)
        for t in ts:
            tensors[t["name"]] = dict(t, shard=i)
    data = gguf_ref.map_file(pack)
    size = len(data)
    if size < HEADER.size:
        raise ValueError("GGML expert-pack header is truncated")
    magic, version, header_size, count, data_start = HEADER.unpack_from(data, 0)
    if magic != PACK_MAGIC or version != 1:
        raise ValueError("GGML expert-pack magic or version does not match")
    if header_size != HEADER.size:
        raise ValueError("GGML expert-pack header size does not match")
    expected_count = len(active_layers) * num_experts * 3
    if count != expected_count:
        raise ValueError(f"GGML expert-pack has {count} entries; expected {expected_count}")
    if data_start < HEADER.size + count * ENTRY.size or data_start % 4096:
        raise ValueError("GGML expert-pack data_start is invalid or unaligned")
    if size < HEADER.size + count * ENTRY.size:
        raise ValueError("GGML expert-pack index is truncated")
    previous_end, entries = data_start, []
    for i in range(count):
        raw_name, expert, reserved, offset, nbytes = ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size)
        if reserved:
            raise ValueError("GGML expert-pack reserved entry field must be zero")
        try:
            name = raw_name.split(b"\0", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("expert-pack tensor name is not valid UTF-8") from None
        match = NAME_RE.fullmatch(name)
        if not match:
            raise ValueError(f"invalid expert tensor name: {name!r}")
        obj, role_id = divmod(i, 3)
        layer_i, want_expert = divmod(obj, num_experts)
        want = (active_layers[layer_i], ROLES[role_id], want_expert)
        actual = (int(match["layer"]), match["role"], expert)
        if actual != want:
            raise ValueError("GGML expert-pack is not complete expert-major up/gate/down layout at index "
                             f"{i}: expected={want}, actual={actual}")
        expert_bytes = tensors[name]["nbytes"] // num_experts
        if nbytes != expert_bytes:
            raise ValueError(f"expert-pack byte size mismatch for index {i}: {nbytes} != {expert_bytes}")
        if offset % 4096:
            raise ValueError(f"expert-pack entry {i} is not 4 KiB aligned")
        if offset < previous_end or offset + nbytes > size:
            raise ValueError(f"expert-pack entry {i} overlaps or is out of range")
        previous_end = offset + nbytes
        entries.append((name, expert, offset, nbytes))
    if size != previous_end:
        raise ValueError(f"expert-pack has unexplained trailing bytes: {size - previous_end}")
    if payload_samples <= 0:
        picks = []
    elif payload_samples == 1:
        picks = [0]
    else:
        picks = sorted({round(i * (count - 1) / (payload_samples - 1)) for i in range(payload_samples)})
    for i in picks:
        name, expert, offset, nbytes = entries[i]
        t = tensors[name]
        start = t["data_offset"] + expert * nbytes
        if data[offset:offset + nbytes] != blobs[t["shard"]][start:start + nbytes]:
            raise ValueError(f"expert-pack payload does not match GGUF source for {name} expert {expert}")
    return len(picks)


def prepare_pack_decision(shard, **validate_kw):
    """prepare_kimi_pack on start-up: ("EXPERT_PACK_VALID", pack) when the
    pack beside the shard is reused, ("EXPERT_PACK_INVALID", detail) when the
    server would delete it and build its own."""
    pack = pack_path_for(shard)
    try:
        validate_pack(pack, Path(shard).parent, **validate_kw)
    except (OSError, ValueError) as exc:
        return "EXPERT_PACK_INVALID", str(exc)
    return "EXPERT_PACK_VALID", str(pack)
