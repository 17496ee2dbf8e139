"""The attributes SGLang's KimiGGMLExpertPackStore gives its callers besides
acquire/mark_used (spec §7.2-§7.3), for k3pack.sglang's drop-in:

  * header: the synthesized v1 pack header the shared code reads (flags 3,
    index_count, data_start, alignment, num_layers = expected_layers,
    num_experts, top_k, role_count 3, the three digests);
  * entries: (layer, expert, logical role id) -> entry record, logical ids
    gate 0, up 1, down 2 (SGLang's MoE method reads
    entries[(layer, 0, 0)].shape and entries[(layer, 0, 2)].shape);
  * stats: SGLang's mutable stats dict (its loader adds dense_bytes).

entries reads each record from the pack index on first use instead of
building SGLang's 247,296 objects up front.
"""

import hashlib
import operator
import os
import struct
from collections.abc import Mapping, MutableMapping

_ENTRY = struct.Struct("<128siIQQ")
_HEADER_BYTES = 40
_PHYSICAL = ("up", "gate", "down")
_LOGICAL = ("gate", "up", "down")  # SGLang's ROLE_NAMES: role_id gate 0, up 1, down 2


def object_generation(index_sha256, layer, expert):
    """SGLang's per-object generation: the first 8 bytes (little-endian) of
    sha256(f"{index_sha256}:{layer}:{expert}"), 1 if that is 0."""
    digest = hashlib.sha256(f"{index_sha256}:{layer}:{expert}".encode("ascii")).digest()
    return int.from_bytes(digest[:8], "little") or 1


def _held_int(value):
    """The int a dict keyed by ints finds `value` as, else None. A dict
    matches a key by hash and ==: 3.0, numpy.int64(3), Fraction(3) and True
    (as 1) find an int key; 3.5, NaN or "3" find none."""
    try:
        whole = operator.index(value)
    except TypeError:
        try:
            whole = int(value)  # truncates (3.5 -> 3): the comparison below refuses that
        except (TypeError, ValueError, OverflowError):
            return None
    whole = int(whole)
    return whole if value == whole and hash(value) == hash(whole) else None


class PackHeader:
    """SGLang's synthesized header of a Kimi pack (spec §7.2)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return "PackHeader(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()) + ")"


class ExpertPackEntry:
    """One (layer, expert, role) record with the values SGLang's Kimi store
    gives it (spec §7.2 step 4)."""

    __slots__ = ("layer", "expert", "role_id", "role", "tensor_name", "dtype_id", "dtype", "shape", "pack_offset",
                 "pack_nbytes", "source_slice_offset", "source_slice_nbytes", "checksum", "quant_scheme",
                 "transform_id", "block_size", "generation")

    def __init__(self, **fields):
        for k, v in fields.items():
            setattr(self, k, v)

    def __repr__(self):
        return "ExpertPackEntry(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


class PackEntries(Mapping):
    """entries[(layer, expert, role_id)] read from the pack index on demand.
    Looked up as SGLang's dict of int keys is: a key equal to one it holds
    (3.0 for 3) finds that entry, with int fields; any other raises KeyError."""

    def __init__(self, pack_path, manifest, active_layer_ids, num_experts, index_sha256):
        self._path = pack_path
        self._layers = list(active_layer_ids)
        self._layer_index = {layer: i for i, layer in enumerate(self._layers)}
        self._experts = int(num_experts)
        self._index_sha256 = index_sha256
        roles = manifest["expert_pack"]["roles"]
        per_layer = {}
        ext = manifest.get("k3pack") or {}
        for record in ext.get("layer_roles") or []:
            per_layer[int(record["layer"])] = record
        self._roles = roles
        self._per_layer = per_layer
        self._cache = {}

    def __len__(self):
        return len(self._layers) * self._experts * 3

    def __iter__(self):
        for layer in self._layers:
            for expert in range(self._experts):
                for role_id in range(3):
                    yield (layer, expert, role_id)

    def _held_key(self, key):
        """The (layer, expert, role_id) ints SGLang's dict would find `key` as,
        or None. Hashed first: an unhashable key is a dict's TypeError."""
        hash(key)
        if not isinstance(key, tuple) or len(key) != 3:
            return None
        parts = [_held_int(v) for v in key]
        if None in parts:
            return None
        layer, expert, role_id = parts
        if layer in self._layer_index and 0 <= expert < self._experts and 0 <= role_id < 3:
            return layer, expert, role_id
        return None

    def __contains__(self, key):
        return self._held_key(key) is not None

    def __getitem__(self, key):
        held = self._held_key(key)
        if held is None:
            raise KeyError(key)
        if held in self._cache:
            return self._cache[held]
        layer, expert, role_id = held
        role = _LOGICAL[role_id]
        index = (self._layer_index[layer] * self._experts + expert) * 3 + _PHYSICAL.index(role)
        fd = os.open(self._path, os.O_RDONLY)
        try:
            raw = os.pread(fd, _ENTRY.size, _HEADER_BYTES + index * _ENTRY.size)
        finally:
            os.close(fd)
        name, _, _, offset, nbytes = _ENTRY.unpack(raw)
        types = self._per_layer.get(layer, {}).get(role) or self._roles[role]
        dtype = str(types["dtype"])
        entry = ExpertPackEntry(
            layer=layer, expert=expert, role_id=role_id, role=role,
            tensor_name=name.split(b"\0", 1)[0].decode("utf-8"), dtype_id=int(types["dtype_id"]), dtype=dtype,
            shape=tuple(int(v) for v in self._roles[role]["logical_shape"]), pack_offset=offset, pack_nbytes=nbytes,
            source_slice_offset=0, source_slice_nbytes=nbytes, checksum="", quant_scheme=dtype,
            transform_id="identity-v1", block_size=256,
            generation=object_generation(self._index_sha256, layer, expert))
        self._cache[held] = entry
        return entry


class StoreStats(MutableMapping):
    """SGLang's store.stats: the engine's live counters, plus keys a caller
    sets (SGLang's loader sets dense_bytes), which snapshot() and the stats
    file then carry too. Deleting a key only drops a caller's value."""

    def __init__(self, engine):
        self._engine = engine
        self.extra = {}

    # snapshot()'s own keys, not in SGLang's stats dict.
    _NOT_SGLANG = ("mean_read_ms", "route_calls_by_layer", "route_tokens_by_layer")

    def _current(self):
        values = {k: v for k, v in self._engine.snapshot().items() if k not in self._NOT_SGLANG}
        values.update(self.extra)
        return values

    def __getitem__(self, key):
        if key in self.extra:  # a caller's value needs no snapshot
            return self.extra[key]
        return self._current()[key]

    # One snapshot for a whole view, not one per key.
    def items(self):
        return self._current().items()

    def values(self):
        return self._current().values()

    def copy(self):
        return self._current()

    def __setitem__(self, key, value):
        self.extra[key] = value

    def __delitem__(self, key):
        del self.extra[key]

    def __iter__(self):
        return iter(self._current())

    def __len__(self):
        return len(self._current())
