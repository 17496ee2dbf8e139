"""Independent test oracle: a minimal GGUF reader/writer and SGLang's
non-expert iterator semantics, written from the specs with only struct,
json, re and numpy. Nothing here imports k3pack, so the tests compare two
separately written implementations.

Reader semantics follow gguf-py's GGUFReader (spec: gguf doc section 5.1):
element types (F16, F32, F64, I8..I64) come out typed in reversed-ne shape,
every other type (BF16 included) as uint8 rows of the byte shape.
The iterator follows kimi_k3_nonexpert_weights_iterator (sglang doc 5.1-5.3,
6.4), producing numpy arrays plus the torch dtype name SGLang would produce.
"""

import json
import math
import os
import re
import struct

import numpy as np

# id -> (name, block size, type size); removed ids omitted.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
TYPE_ID = {v[0]: k for k, v in GGML_TYPES.items()}
ELEMENT_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}

# GGUF value types: id -> (struct code, size); 8 = string, 9 = array.
VALUE_TYPES = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
               6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
VALUE_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32",
                    7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}


class OracleTensor:
    def __init__(self, name, dims, type_id, offset):
        self.name, self.dims, self.type_id, self.offset = name, dims, type_id, offset
        self.type_name, self.block, self.type_size = GGML_TYPES[type_id]
        n = 1
        for d in dims:
            n *= d
        self.n_elements = n
        self.nbytes = n * self.type_size // self.block
        self.data_offset = None
        self.data = None


def metadata_kv(gguf, keys=None):
    """An OracleGGUF's metadata (or the `keys` of it) as write_gguf's kv list."""
    by_name = {v: k for k, v in VALUE_TYPE_NAMES.items()}
    out = []
    for key, value in gguf.metadata.items():
        if keys is not None and key not in keys:
            continue
        tname = gguf.metadata_types[key]
        if tname.startswith("ARRAY["):
            out.append((key, 9, (by_name[tname[6:-1]], value)))
        else:
            out.append((key, by_name[tname], value))
    return out


class OracleGGUF:
    """Parses one GGUF file (little-endian v2/v3) into metadata + tensors."""

    def __init__(self, path):
        self.path = path
        self.raw = np.memmap(path, dtype=np.uint8, mode="r")
        buf = self.raw
        self.pos = 0
        magic = bytes(buf[0:4])
        if magic != b"GGUF":
            raise ValueError("not a GGUF file")
        self.pos = 4
        self.version = self._u("I")
        n_tensors = self._u("Q")
        n_kv = self._u("Q")
        self.metadata = {}
        self.metadata_types = {}
        for _ in range(n_kv):
            key = self._str()
            vtype = self._u("I")
            value, tname = self._value(vtype)
            if key in self.metadata:
                raise KeyError(key)
            self.metadata[key] = value
            self.metadata_types[key] = tname
        self.alignment = self.metadata.get("general.alignment", 32)
        self.tensors = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u("I")
            dims = [self._u("q") for _ in range(n_dims)]
            type_id = self._u("I")
            offset = self._u("Q")
            self.tensors.append(OracleTensor(name, dims, type_id, offset))
        self.data_offset = (self.pos + self.alignment - 1) // self.alignment * self.alignment
        for t in self.tensors:
            t.data_offset = self.data_offset + t.offset
            t.data = self._view(t)
        self.by_name = {t.name: t for t in self.tensors}

    def _u(self, code):
        size = struct.calcsize("<" + code)
        (v,) = struct.unpack_from("<" + code, self.raw, self.pos)
        self.pos += size
        return v

    def _str(self):
        n = self._u("Q")
        s = bytes(self.raw[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def _value(self, vtype):
        if vtype == 8:
            return self._str(), "STRING"
        if vtype == 9:
            etype = self._u("I")
            count = self._u("Q")
            items = [self._value(etype)[0] for _ in range(count)]
            return items, "ARRAY[%s]" % VALUE_TYPE_NAMES[etype]
        code, _ = VALUE_TYPES[vtype]
        v = self._u(code)
        if vtype == 6:
            v = float(np.float32(v))
        return v, VALUE_TYPE_NAMES[vtype]

    def _view(self, t):
        np_dims = list(reversed(t.dims))
        raw = self.raw[t.data_offset:t.data_offset + t.nbytes]
        if t.type_name in ELEMENT_DTYPES:
            return raw.view(ELEMENT_DTYPES[t.type_name]).reshape(np_dims)
        byte_shape = np_dims[:-1] + [np_dims[-1] // t.block * t.type_size]
        return raw.reshape(byte_shape)


# ------------------------------------------------------------------ writer

def _pack_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == 8:
        return _pack_str(value)
    if vtype == 9:
        etype, items = value
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(_pack_value(etype, it) for it in items)
    return struct.pack("<" + VALUE_TYPES[vtype][0], value)


def write_gguf(path, kv, tensors, alignment=32, version=3, gap=0):
    """kv: list of (key, vtype, value) (arrays: value = (etype, items));
    tensors: list of (name, type_name, dims (ne order), bytes). `alignment`
    is only the layout: a general.alignment key, if wanted, is the caller's.
    Versions 2 and 3 share one layout. gap: bytes (a multiple of the
    alignment) left unused after each tensor, so that offsets are valid but
    not packed end to end (gguf-py reads such files)."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, value in kv:
        head += _pack_str(key) + struct.pack("<I", vtype) + _pack_value(vtype, value)
    offset = 0
    infos = b""
    for name, tname, dims, data in tensors:
        infos += _pack_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
        infos += struct.pack("<IQ", TYPE_ID[tname], offset)
        offset += (len(data) + alignment - 1) // alignment * alignment + gap
    blob = head + infos
    blob += b"\0" * ((-len(blob)) % alignment)
    for _, _, _, data in tensors:
        blob += data + b"\0" * ((-len(data)) % alignment + gap)
    with open(path, "wb") as f:
        f.write(blob)


# ------------------------------------------------- SGLang's name mapping

_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
        "output_norm.weight": "model.norm.weight"}
_COMMON = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias", "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_routed_down.weight": "mlp.routed_expert_down_proj.weight",
    "ffn_routed_norm.weight": "mlp.routed_expert_norm.weight",
    "ffn_routed_up.weight": "mlp.routed_expert_up_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
_KDA = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "ssm_g.weight": "self_attn.g_proj.weight",
    "ssm_beta.weight": "self_attn.b_proj.weight", "ssm_f_a.weight": "self_attn.f_a_proj.weight",
    "ssm_f_b.weight": "self_attn.f_b_proj.weight", "ssm_conv1d_q.weight": "self_attn.q_conv1d.weight",
    "ssm_conv1d_k.weight": "self_attn.k_conv1d.weight", "ssm_conv1d_v.weight": "self_attn.v_conv1d.weight",
    "ssm_a": "self_attn.A_log", "ssm_dt.bias": "self_attn.dt_bias", "ssm_norm.weight": "self_attn.o_norm.weight",
}
_MLA = {
    "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight", "attn_gate.weight": "self_attn.g_proj.weight",
    "attn_k_b.weight": "self_attn.k_b_qweight", "attn_v_b.weight": "self_attn.v_b_qweight",
}
_BLK = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<suffix>.+)$")
_ROUTED = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down)_exps\.weight$")


def checkpoint_targets(name):
    if name == "output_res_score.weight":
        return ("model.output_attn_res_proj.weight", "model.output_attn_res_norm.weight")
    if name in _TOP:
        return (_TOP[name],)
    m = _BLK.fullmatch(name)
    if m:
        prefix = "model.layers.%d." % int(m.group("layer"))  # SGLang writes int(layer)
        suffix = m.group("suffix")
        if suffix == "attn_res_score.weight":
            return (prefix + "self_attention_res_proj.weight", prefix + "self_attention_res_norm.weight")
        if suffix == "ffn_res_score.weight":
            return (prefix + "mlp_res_proj.weight", prefix + "mlp_res_norm.weight")
        for table in (_COMMON, _KDA, _MLA):
            if suffix in table:
                return (prefix + table[suffix],)
    raise KeyError("unsupported Kimi-K3 GGUF tensor name: %s" % name)


def torch_dtype_name(arr):
    """The torch dtype torch.tensor(arr) would produce."""
    return {"uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
            "float16": "float16", "float32": "float32", "float64": "float64"}[arr.dtype.name]


def sglang_nonexpert_weights(manifest_path, torch_a_log=False):
    """Yields (name, numpy array, torch dtype name) as SGLang's iterator would
    (arrays are copies, like torch.tensor(tensor.data)); raises SGLang's
    exception types and texts. A_log is correctly rounded (C's log in double,
    rounded once to the source type), or with torch_a_log=True exactly SGLang's
    torch.log(-torch.tensor(raw))."""
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("format") != "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1":
        raise ValueError("Kimi-K3 manifest format is unsupported")
    if not manifest.get("complete"):
        raise ValueError("Kimi-K3 manifest is incomplete")
    by_shard = {}
    for rec in manifest["source"]["tensors"]:
        by_shard.setdefault(int(rec["shard_index"]), {})[rec["name"]] = rec
    emitted = set()
    for shard in manifest["source"]["shards"]:
        path = shard["path"]
        if not os.path.exists(path) or os.path.getsize(path) != int(shard["size"]):
            raise FileNotFoundError("Kimi-K3 GGUF shard is missing or changed: %s" % path)
        reader = OracleGGUF(path)
        expected = by_shard.get(int(shard["index"]), {})
        if {t.name for t in reader.tensors} != set(expected):
            raise ValueError("Kimi-K3 GGUF shard inventory changed: %s" % path)
        for t in reader.tensors:
            if t.type_name != expected[t.name]["dtype"]:
                raise ValueError("Kimi-K3 GGUF tensor type changed: %s" % t.name)
            if _ROUTED.fullmatch(t.name):
                continue
            targets = checkpoint_targets(t.name)
            quantized = t.type_name not in ("F32", "F16", "BF16")
            raw = np.array(t.data)  # a copy, as torch.tensor(...) makes
            for index, target in enumerate(targets):
                if t.name.endswith(".ssm_a"):
                    if raw.dtype.kind != "f" or not np.all(np.isfinite(raw)):
                        raise ValueError("Kimi-K3 GGUF ssm_a must contain finite floating values")
                    if not np.all(raw < 0):
                        raise ValueError("Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values")
                    if torch_a_log:
                        import torch

                        if raw.dtype == np.float16:
                            # The torch SGLang runs on (2.x) takes log of a CPU
                            # Half tensor in float and rounds it to half; the
                            # 1.13 this machine has refuses it ("log_vml_cpu").
                            value = np.log(-raw.astype(np.float32)).astype(np.float16)
                        else:
                            value = torch.log(-torch.tensor(raw)).numpy()
                    else:
                        # math.log (C's log, correctly rounded in glibc), not
                        # np.log: numpy's vectorized float64 log can be 1 ulp off.
                        value = np.array([math.log(-x) for x in raw.astype(np.float64).ravel()],
                                         dtype=np.float64).reshape(raw.shape).astype(raw.dtype)
                elif len(targets) == 2:
                    if raw.ndim != 1:
                        raise ValueError("Kimi-K3 attention-residual score must be a vector, got %r"
                                         % (tuple(raw.shape),))
                    if index == 0:
                        value = raw[np.newaxis, :]
                    elif index == 1:
                        value = np.ones_like(raw)
                    else:
                        raise ValueError("invalid Kimi-K3 attention-residual target %d" % index)
                else:
                    value = raw
                name = target
                if quantized and name.endswith(".weight"):
                    name = name[: -len("weight")] + "qweight"
                # The runtime name is checked first, then its qweight_type.
                if name in emitted:
                    raise ValueError("duplicate Kimi-K3 target parameter: %s" % name)
                if quantized:
                    type_name = name[: -len("qweight")] if name.endswith("qweight") else name
                    type_name += "qweight_type"
                    if type_name in emitted:
                        raise ValueError("duplicate Kimi-K3 target parameter: %s" % type_name)
                    emitted.add(type_name)
                    type_value = np.array(t.type_id, dtype=np.uint8)
                    yield type_name, type_value, torch_dtype_name(type_value)
                emitted.add(name)
                yield name, value, torch_dtype_name(value)


# ------------------------------------------------------- minimal manifest

def _sha256_range(path, n):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(n))
    return h.hexdigest()


def source_manifest(shard_paths):
    """The parts of an adapter manifest the non-expert iterator reads
    (format, complete, source.shards, source.tensors), computed from the
    oracle's own reading of the shards."""
    shards, tensors = [], []
    for index, path in enumerate(shard_paths):
        g = OracleGGUF(path)
        path = os.path.realpath(path)
        shards.append({"index": index, "path": path, "size": os.path.getsize(path),
                       "metadata_nbytes": g.data_offset, "metadata_sha256": _sha256_range(path, g.data_offset),
                       "tensor_count": len(g.tensors)})
        for t in g.tensors:
            tensors.append({"name": t.name, "shape": list(t.dims), "dtype": t.type_name, "dtype_id": t.type_id,
                            "shard_index": index, "data_offset": t.data_offset, "nbytes": t.nbytes})
    tensors.sort(key=lambda r: r["name"])
    return {"format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1", "complete": True,
            "source": {"shards": shards, "tensors": tensors}}


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")
