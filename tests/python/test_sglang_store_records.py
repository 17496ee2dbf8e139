"""The drop-in store carries the attributes SGLang's KimiGGMLExpertPackStore
gives the code around it (spec sglang-expert-pack.md 7.2-7.3): `header`
(the synthesized v1 header), `entries` keyed (layer, expert, logical role id)
with the values 7.2 step 4 lists (SGLang's MoE method reads
entries[(layer, 0, 0)].shape and entries[(layer, 0, 2)].shape), and the
mutable `stats` dict (SGLang's loader sets stats["dense_bytes"]). Before,
none existed: SGLang's MoE method failed with AttributeError on a store
install_into_sglang(store=True) had swapped in.

Expected values come from the pack index parsed here with struct and the
manifest, not from k3pack."""

import hashlib
import json
import struct
import unittest

import _util

PACK_ENTRY = struct.Struct("<128siIQQ")
PHYSICAL = ("up", "gate", "down")


class SglangStoreRecords(_util.TinyPackTestCase):
    def test_header_is_sglangs_synthesized_header(self):
        store = self.dropin()
        try:
            h = store.header
            ep = self.doc["expert_pack"]
            self.assertEqual(h.flags, 3)
            self.assertEqual(h.index_count, len(self.layers) * self.experts * 3)
            self.assertEqual(h.data_start, ep["data_start"])
            self.assertEqual(h.alignment, ep["alignment"])
            self.assertEqual(h.num_layers, self.num_layers)  # expected_layers, not the active count
            self.assertEqual(h.num_experts, self.experts)
            self.assertEqual(h.top_k, self.top_k)
            self.assertEqual(h.role_count, 3)
            self.assertEqual(h.model_identity_sha256, "0" * 64)
            self.assertEqual(h.source_blob_sha256, self.doc["source"]["inventory_sha256"])
            self.assertEqual(h.config_sha256, self.doc["model"]["config_sha256"])
        finally:
            store.close()

    def test_entries_hold_the_index_values_under_logical_role_ids(self):
        store = self.dropin()
        try:
            ep = self.doc["expert_pack"]
            with open(self.pack, "rb") as f:
                data = f.read(40 + PACK_ENTRY.size * len(self.layers) * self.experts * 3)
            self.assertEqual(len(store.entries), len(self.layers) * self.experts * 3)
            for layer in (self.layers[0], self.layers[-1]):
                for expert in (0, self.experts - 1):
                    gen = hashlib.sha256(f"{ep['index_sha256']}:{layer}:{expert}".encode("ascii")).digest()
                    gen = int.from_bytes(gen[:8], "little") or 1
                    for role_id, role in enumerate(("gate", "up", "down")):
                        i = (self.layers.index(layer) * self.experts + expert) * 3 + PHYSICAL.index(role)
                        name, _, _, offset, nbytes = PACK_ENTRY.unpack_from(data, 40 + i * PACK_ENTRY.size)
                        e = store.entries[(layer, expert, role_id)]
                        self.assertEqual(e.tensor_name, name.split(b"\0")[0].decode())
                        self.assertEqual(e.tensor_name, f"blk.{layer}.ffn_{role}_exps.weight")
                        self.assertEqual((e.layer, e.expert, e.role_id), (layer, expert, role_id))
                        self.assertEqual(e.pack_offset, offset)
                        self.assertEqual(e.pack_nbytes, nbytes)
                        self.assertEqual(e.source_slice_nbytes, nbytes)
                        self.assertEqual(e.source_slice_offset, 0)
                        self.assertEqual(e.shape, tuple(ep["roles"][role]["logical_shape"]))
                        self.assertEqual(e.dtype_id, ep["roles"][role]["dtype_id"])
                        self.assertEqual(e.quant_scheme, e.dtype)
                        self.assertEqual((e.checksum, e.transform_id, e.block_size), ("", "identity-v1", 256))
                        self.assertEqual(e.generation, gen)
                        # The role's bytes sit at the store's role offset in the object.
                        self.assertEqual(offset - store.entries[(layer, expert, 1)].pack_offset,
                                         store.role_offsets[role])
            self.assertNotIn((0, 0, 0), store.entries)
            with self.assertRaises(KeyError):
                store.entries[(0, 0, 0)]
            with self.assertRaises(KeyError):
                store.entries[(self.layers[0], self.experts, 0)]
        finally:
            store.close()

    def test_stats_dict_takes_dense_bytes_into_snapshot_and_file(self):
        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        if True:
            stats_path = f"{tmp.path}/stats.json"
            store = self.dropin(stats_path=stats_path)
            self.assertEqual(store.stats["cache_policy"], "reuse-lfu-lru-v2")
            self.assertEqual(store.stats["pack_entries"], len(self.layers) * self.experts * 3)
            store.stats["dense_bytes"] = 12345
            self.assertEqual(store.stats["dense_bytes"], 12345)
            self.assertEqual(store.snapshot()["dense_bytes"], 12345)
            store.close()
            with open(stats_path, encoding="ascii") as f:
                self.assertEqual(json.load(f)["dense_bytes"], 12345)


class SglangStoreTexts(_util.TinyPackTestCase):
    def test_top_k_shape_is_printed_as_a_tuple(self):
        # SGLang formats tuple(topk_ids.shape): "(1, 3)", not "torch.Size([1, 3])".
        import torch

        store = self.dropin()
        try:
            store.initialize_device_cache("cpu")
            for shape, text in (((1, self.top_k - 1), f"(1, {self.top_k - 1})"), ((self.top_k,), f"({self.top_k},)")):
                with self.assertRaises(ValueError) as e:
                    store.acquire(self.layers[0], torch.zeros(shape, dtype=torch.int64))
                self.assertEqual(str(e.exception), f"runtime top-k must be exactly {self.top_k}; received shape {text}")
        finally:
            store.close()

    def test_pack_sha256_falls_back_to_the_index_digest_when_empty(self):
        # SGLang: str(expert_pack.get("sha256") or index digest).
        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        with open(self.manifest, encoding="utf-8") as f:
            doc = json.load(f)
        doc["expert_pack"]["sha256"] = ""
        edited = f"{tmp.path}/m.json"
        with open(edited, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        from k3pack.sglang import KimiGGMLExpertPackStore

        store = KimiGGMLExpertPackStore(self.pack, manifest_path=edited, expected_layers=self.num_layers,
                                        expected_experts=self.experts, expected_top_k=self.top_k,
                                        cache_vram_mib=6, cache_vram_reserve_mib=1)
        try:
            self.assertEqual(store.pack_sha256, doc["expert_pack"]["index_sha256"])
        finally:
            store.close()


class SglangStorePaths(_util.TinyPackTestCase):
    def test_stats_path_is_resolved_like_pathlib(self):
        import os

        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        real = os.path.join(tmp.path, "real")
        os.mkdir(real)
        os.symlink(real, os.path.join(tmp.path, "link"))
        store = self.dropin(stats_path=os.path.join(tmp.path, "link", "s.json"))
        try:
            self.assertEqual(store.stats_path, os.path.join(os.path.realpath(real), "s.json"))
        finally:
            store.close()
        self.assertTrue(os.path.exists(os.path.join(real, "s.json")))


if __name__ == "__main__":
    unittest.main()
