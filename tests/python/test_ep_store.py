"""Rank stores from Python (issue 15): k3pack.sglang.KimiGGMLExpertPackStore
and k3pack.ExpertStore with ep_size / ep_rank, over a rank pack (the full
pack with k3pack.ep in its manifest and every unowned object zeroed, which
is what a hole reads as) or over the full pack.

A rank store serves only its experts, byte-identical to the full pack, and
refuses a route to another rank's expert with a ValueError naming layer,
expert, this rank and the owner, before reading anything."""

import json
import os
import shutil
import unittest

import _util  # noqa: F401  (import path)
import numpy as np
import torch

import k3pack
from k3pack.sglang import KimiGGMLExpertPackStore
from test_sglang_store import pack_objects


def owned(size, rank, experts):
    per = experts // size
    return range(rank * per, (rank + 1) * per)


class EpStoreCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.pack, cls.manifest, cls.doc = _util.build_tiny(cls.tmp.path)
        cls.layers = cls.doc["model"]["active_moe_layer_ids"]
        cls.num_layers = cls.doc["model"]["num_hidden_layers"]
        cls.experts = cls.doc["model"]["num_experts"]
        cls.top_k = cls.doc["model"]["num_experts_per_token"]
        cls.objects = pack_objects(cls.pack)
        cls.ep_size = 2 if cls.experts % 4 else 4
        cls.rank = 1
        cls.rank_pack, cls.rank_manifest = cls.make_rank_pack(cls.ep_size, cls.rank)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def make_rank_pack(cls, size, rank):
        """The full pack with unowned objects zeroed, its digest sidecar (so a
        read of a zeroed object would fail its CRC) and k3pack.ep."""
        path = os.path.join(cls.tmp.path, f"rank{rank}.expert-major.pack")
        shutil.copyfile(cls.pack, path)
        if os.path.exists(cls.pack + ".digests"):
            shutil.copyfile(cls.pack + ".digests", path + ".digests")
        mine = owned(size, rank, cls.experts)
        offsets = object_offsets(cls.pack)
        with open(path, "r+b") as f:
            for (layer, expert), data in cls.objects.items():
                if expert not in mine:
                    f.seek(offsets[(layer, expert)])
                    f.write(bytes(len(data)))
        doc = json.loads(json.dumps(cls.doc))
        doc["expert_pack"]["path"] = path
        doc["k3pack"]["ep"] = {"size": size, "rank": rank, "first_expert": mine.start, "end_expert": mine.stop}
        manifest = os.path.join(cls.tmp.path, f"rank{rank}.manifest.json")
        with open(manifest, "w") as f:
            json.dump(doc, f)
        return path, manifest

    def open(self, pack, manifest, **kw):
        kw.setdefault("cache_vram_mib", 6)
        kw.setdefault("cache_vram_reserve_mib", 1)
        store = KimiGGMLExpertPackStore(pack, manifest_path=manifest, expected_layers=self.num_layers,
                                        expected_experts=self.experts, expected_top_k=self.top_k, **kw)
        self.addCleanup(store.close)
        return store

    def refusal(self, layer, expert, size, rank):
        mine = owned(size, rank, self.experts)
        owner = expert // (self.experts // size)
        return (f"layer {layer} expert {expert} is not served by this EP rank store, rank {rank} of {size} "
                f"(experts {mine.start}..{mine.stop - 1}): rank {owner} owns it; SGLang's EP never routes it "
                f"here: a routing bug")


def object_offsets(pack_path):
    import struct

    with open(pack_path, "rb") as f:
        data = f.read()
    _, _, _, count, _ = struct.unpack_from("<16sIIQQ", data, 0)
    out = {}
    for i in range(0, count, 3):
        name, expert, _, offset, _ = struct.unpack_from("<128siIQQ", data, 40 + i * 152)
        out[(int(name.split(b"\0")[0].decode().split(".")[1]), expert)] = offset
    return out


class DropInRankStore(EpStoreCase):
    def test_rank_pack_serves_its_experts_and_refuses_the_others(self):
        store = self.open(self.rank_pack, self.rank_manifest)
        self.assertEqual((store.ep_size, store.ep_rank), (self.ep_size, self.rank))  # from the manifest
        mine = owned(self.ep_size, self.rank, self.experts)
        self.assertEqual(store.owned_experts, mine)
        store.initialize_device_cache("cpu")
        width = min(self.top_k, len(mine))
        for layer in self.layers:
            for first in range(mine.start, mine.stop, width):
                ids = torch.tensor([[min(e, mine.stop - 1) for e in range(first, first + width)]])
                tensor, slots = store.acquire(layer, ids)
                for e, s in zip(ids.reshape(-1).tolist(), slots):
                    want = self.objects[(layer, e)]
                    self.assertEqual(store.device_cache[s, :len(want)].numpy().tobytes(), want)
                store.mark_used(slots)
        snap = store.snapshot()
        reads = snap["pack_reads"]
        self.assertEqual(snap["k3pack"]["checksum_errors"], 0)
        self.assertEqual(snap["k3pack"]["ep"]["owned_objects"], len(self.layers) * len(mine))
        stray = (mine.stop) % self.experts
        layer = self.layers[-1]
        with self.assertRaises(ValueError) as cm:
            store.acquire(layer, torch.tensor([[mine.start, stray][:max(1, min(2, self.top_k))]]))
        if self.top_k >= 2:
            self.assertEqual(str(cm.exception).splitlines()[0], self.refusal(layer, stray, self.ep_size, self.rank))
        with self.assertRaises(ValueError) as cm:
            store.acquire(layer, torch.tensor([[stray]]))
        self.assertEqual(str(cm.exception), self.refusal(layer, stray, self.ep_size, self.rank))
        self.assertEqual(store.snapshot()["pack_reads"], reads)  # refused before any read
        # A rank row holds 1..top_k routes.
        with self.assertRaises(ValueError) as cm:
            store.acquire(layer, torch.tensor([[mine.start] * (self.top_k + 1)]))
        self.assertIn("an EP rank's routes must be 1..", str(cm.exception))

    def test_prefetch_is_refused_too(self):
        store = self.open(self.rank_pack, self.rank_manifest, host_cache_mib=8, prefetch=True)
        store.initialize_device_cache("cpu")
        stray = (owned(self.ep_size, self.rank, self.experts).stop) % self.experts
        with self.assertRaises(ValueError) as cm:
            store.prefetch(self.layers[0], [stray])
        self.assertEqual(str(cm.exception), self.refusal(self.layers[0], stray, self.ep_size, self.rank))
        self.assertEqual(store.snapshot()["pack_reads"], 0)

    def test_explicit_rank_over_the_full_pack_and_disagreement(self):
        store = self.open(self.pack, self.manifest, ep_size=self.ep_size, ep_rank=0)
        self.assertEqual((store.ep_size, store.ep_rank), (self.ep_size, 0))
        store.initialize_device_cache("cpu")
        layer = self.layers[0]
        tensor, slots = store.acquire(layer, torch.tensor([[0]]))
        self.assertEqual(store.device_cache[slots[0], :len(self.objects[(layer, 0)])].numpy().tobytes(),
                         self.objects[(layer, 0)])
        store.mark_used(slots)
        last = self.experts - 1
        with self.assertRaises(ValueError) as cm:
            store.acquire(layer, torch.tensor([[last]]))
        self.assertEqual(str(cm.exception), self.refusal(layer, last, self.ep_size, 0))
        with self.assertRaises(ValueError) as cm:
            self.open(self.rank_pack, self.rank_manifest, ep_size=self.ep_size, ep_rank=0)
        self.assertTrue(str(cm.exception).startswith("EP rank mismatch: the store was opened as rank 0 of"),
                        str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.open(self.pack, self.manifest, ep_rank=1)
        self.assertIn("ep_size and ep_rank go together", str(cm.exception))

    def test_full_store_keeps_sglang_width_rule(self):
        store = self.open(self.pack, self.manifest)
        self.assertEqual(store.ep_size, 1)
        store.initialize_device_cache("cpu")
        if self.top_k > 1:
            with self.assertRaises(ValueError) as cm:
                store.acquire(self.layers[0], torch.tensor([[0]]))
            self.assertTrue(str(cm.exception).startswith(f"runtime top-k must be exactly {self.top_k}"))


class ExpertStoreBinding(EpStoreCase):
    def test_expert_store_rank(self):
        with k3pack.ExpertStore(self.rank_pack, self.rank_manifest, cache_bytes=64 << 20) as s:
            info = s.info
            mine = owned(self.ep_size, self.rank, self.experts)
            self.assertEqual((info["ep_size"], info["ep_rank"]), (self.ep_size, self.rank))
            self.assertEqual(info["owned_experts"], (mine.start, mine.stop))
            layer = self.layers[0]
            a = s.acquire(layer, np.array([[mine.start]]))
            self.assertEqual(bytes(a.routes[0].bytes), self.objects[(layer, mine.start)])
            s.mark_used(a)
            with self.assertRaises(ValueError) as cm:
                s.acquire(layer, np.array([[0]]))
            self.assertEqual(str(cm.exception), self.refusal(layer, 0, self.ep_size, self.rank))
            with self.assertRaises(ValueError) as cm:
                s.prefetch(layer, np.array([0]))
            self.assertEqual(str(cm.exception), self.refusal(layer, 0, self.ep_size, self.rank))
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, ep_size=self.ep_size,
                                ep_rank=0) as s:
            self.assertEqual(s.info["owned_experts"], (0, self.experts // self.ep_size))


if __name__ == "__main__":
    unittest.main()
