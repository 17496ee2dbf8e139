"""Every public path-taking API of k3pack and k3pack.sglang takes an
os.PathLike (SGLang passes pathlib.Path; its signatures say
`str | os.PathLike[str]`) and gives what the str path gives. The bindings
take std::string, so each of these raised "TypeError: incompatible function
arguments" before. Also: install_into_sglang() may be called again in any
order of copy/store (copy=False then copy=True used to make the installed
iterator call itself: RecursionError)."""

import json
import os
import pathlib
import sys
import unittest
from unittest import mock

import _util
import k3pack
import k3pack.sglang as adapter

try:
    import torch
except ImportError:  # pragma: no cover - torch is installed where the suite runs
    torch = None

P = pathlib.Path

# Timings and timestamps: the only values two identical calls may differ in.
VOLATILE = ("seconds", "open_seconds", "mb_per_s", "created_at")

# The public names that take a path, by module, and those that take none:
# a new public name must be put in one of them (and tested with a Path).
PATH_TAKING = {
    k3pack: {"GGUFFile", "ShardSet", "parse_shard_name", "NonExpertStream", "nonexpert_weights", "nonexpert_tensors",
             "build_pack", "validate_pack", "create_manifest", "read_manifest", "verify_pack", "build", "ExpertStore",
             "synth"},
    adapter: {"kimi_k3_nonexpert_weights_iterator", "install_into_sglang", "KimiGGMLExpertPackStore"},
}
NO_PATHS = {
    k3pack: {"GGUFTensor", "ggml_type_info", "ggml_types", "__version__", "NonExpertTensor", "ssm_a_to_a_log",
             "dequantize", "tensor_stats", "quant_isa", "dequantize_tensor", "serialize_manifest", "Acquisition",
             "ExpertView", "synth_faults"},
    adapter: {"to_torch"},
}


class FsPath:
    """An os.PathLike that is not a pathlib path (str() is not its path)."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return "FsPath(%r)" % self.path


def stable(result):
    """result without VOLATILE keys, at any depth."""
    if isinstance(result, dict):
        return {k: stable(v) for k, v in result.items() if k not in VOLATILE}
    if isinstance(result, (list, tuple)):
        return type(result)(stable(v) for v in result)
    return result


def arrays(pairs):
    """[(name, bytes)] of (name, array-like) pairs."""
    out = []
    for name, value in pairs:
        if torch is not None and isinstance(value, torch.Tensor):
            value = value.contiguous().view(torch.uint8).numpy() if value.numel() else value.numpy()
        out.append((name, bytes(memoryview(value).cast("B")) if value.size else b""))
    return out


class PathLikeArguments(_util.TinyPackTestCase):
    """Each path-taking API, called with pathlib.Path (and os.PathLike)
    arguments, positional and keyword, against the same call with str."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = os.path.join(cls.tmp.path, "model")
        cls.config = os.path.join(cls.model, "config.json")
        cls.tokenizer = os.path.join(cls.model, "tokenizer")
        cls.shards = k3pack.ShardSet.discover(cls.model)

    def test_every_public_name_is_classified(self):
        for module in (k3pack, adapter):
            self.assertEqual(set(module.__all__), PATH_TAKING[module] | NO_PATHS[module], module.__name__)

    def test_classes_are_the_extension_classes(self):
        # The constructors are wrapped in place: isinstance and type identity hold.
        for name in ("GGUFFile", "ShardSet", "NonExpertStream", "ExpertStore"):
            self.assertIs(getattr(k3pack, name), getattr(k3pack._k3pack, name))
        gguf = k3pack.GGUFFile(P(self.shards[0]))
        self.assertIsInstance(gguf, k3pack.GGUFFile)
        self.assertIs(type(gguf), k3pack._k3pack.GGUFFile)
        # Docstrings (pybind11's signature line) stay visible.
        self.assertIn("path: str", k3pack.GGUFFile.__init__.__doc__)
        self.assertIn("manifest: str", k3pack.verify_pack.__doc__)
        self.assertEqual(k3pack.read_manifest.__name__, "read_manifest")

    def test_gguf_file(self):
        ref = k3pack.GGUFFile(self.shards[0])
        for got in (k3pack.GGUFFile(P(self.shards[0])), k3pack.GGUFFile(path=P(self.shards[0])),
                    k3pack.GGUFFile(FsPath(self.shards[0]), False)):
            self.assertEqual(got.path, ref.path)
            self.assertEqual([t.name for t in got.tensors], [t.name for t in ref.tensors])
            self.assertEqual(got.file_size, ref.file_size)
            name = ref.tensors[0].name
            self.assertEqual(got.tensor_data(name).tobytes(), ref.tensor_data(name).tobytes())

    def test_shard_set_and_discover(self):
        ref = k3pack.ShardSet(self.model)
        for got in (k3pack.ShardSet(P(self.model)), k3pack.ShardSet(path=P(self.model), architecture="kimi-k3")):
            self.assertEqual(got.paths, ref.paths)
            self.assertEqual(got.tensor_count, ref.tensor_count)
        self.assertEqual(k3pack.ShardSet.discover(P(self.model)), self.shards)
        self.assertEqual(k3pack.ShardSet.discover(path=FsPath(self.model)), self.shards)

    def test_parse_shard_name(self):
        for shard in self.shards:
            self.assertEqual(k3pack.parse_shard_name(P(shard)), k3pack.parse_shard_name(shard))
            self.assertEqual(k3pack.parse_shard_name(P(os.path.basename(shard))),
                             k3pack.parse_shard_name(os.path.basename(shard)))

    def test_read_manifest(self):
        self.assertEqual(k3pack.read_manifest(P(self.manifest)), k3pack.read_manifest(self.manifest))
        self.assertEqual(k3pack.read_manifest(path=FsPath(self.manifest)), k3pack.read_manifest(self.manifest))

    def test_verify_pack(self):
        ref = stable(k3pack.verify_pack(self.manifest))
        self.assertEqual(stable(k3pack.verify_pack(P(self.manifest))), ref)
        self.assertEqual(stable(k3pack.verify_pack(manifest=P(self.manifest), samples=2)),
                         stable(k3pack.verify_pack(self.manifest, samples=2)))

    def test_validate_pack(self):
        ref = stable(k3pack.validate_pack(self.pack, self.model, self.config, profile="scaled"))
        got = stable(k3pack.validate_pack(P(self.pack), P(self.model), P(self.config), profile="scaled"))
        self.assertEqual(got, ref)
        got = stable(k3pack.validate_pack(pack_path=P(self.pack), gguf_dir=FsPath(self.model),
                                          model_config=P(self.config), profile="scaled"))
        self.assertEqual(got, ref)

    def test_build_pack(self):
        out = os.path.join(self.tmp.path, "bp.expert-major.pack")
        ref = k3pack.build_pack(self.model, self.config, out=out, profile="scaled", safety_margin_gib=0, force=True,
                                hash_sources=True)
        got = k3pack.build_pack(P(self.model), P(self.config), out=P(out), profile="scaled", safety_margin_gib=0,
                                force=True, hash_sources=True)
        self.assertEqual(stable(got), stable(ref))
        got = k3pack.build_pack(gguf_dir=P(self.model), model_config=FsPath(self.config), out=P(out),
                                profile="scaled", safety_margin_gib=0)
        self.assertTrue(got["already_built"])
        self.assertEqual(got["pack"], out)

    def test_create_manifest(self):
        out = os.path.join(self.tmp.path, "cm.manifest.json")
        ref = k3pack.create_manifest(self.model, self.pack, self.config, self.tokenizer, output=out,
                                     profile="scaled", force=True)
        got = k3pack.create_manifest(P(self.model), P(self.pack), P(self.config), P(self.tokenizer), output=P(out),
                                     profile="scaled", force=True)
        self.assertEqual(stable(got), stable(ref))
        # known_shard_sha256 is keyed by shard path: os.PathLike keys too.
        built = k3pack.build_pack(self.model, self.config, out=os.path.join(self.tmp.path, "cm.pack"),
                                  profile="scaled", safety_margin_gib=0, force=True, hash_sources=True)
        known = built["source_sha256"]
        self.assertTrue(known)
        ref = k3pack.create_manifest(self.model, built["pack"], self.config, self.tokenizer, output=out,
                                     profile="scaled", force=True, known_shard_sha256=known)
        got = k3pack.create_manifest(gguf_dir=P(self.model), expert_pack=P(built["pack"]), model_config=P(self.config),
                                     tokenizer_dir=P(self.tokenizer), output=P(out), profile="scaled", force=True,
                                     known_shard_sha256={P(k): v for k, v in known.items()})
        self.assertEqual(stable(got), stable(ref))

    def test_build(self):
        kw = dict(profile="scaled", safety_margin_gib=0)
        # The class's pack and manifest: already built, the same answer either way.
        ref = k3pack.build(self.model, self.config, self.tokenizer, pack=self.pack, manifest=self.manifest, **kw)
        got = k3pack.build(P(self.model), P(self.config), P(self.tokenizer), pack=P(self.pack),
                           manifest=P(self.manifest), **kw)
        self.assertTrue(ref["already_built"])
        self.assertEqual(stable(got), stable(ref))
        # A fresh build from Path arguments only.
        fresh_pack = os.path.join(self.tmp.path, "fresh.expert-major.pack")
        fresh_manifest = os.path.join(self.tmp.path, "fresh.manifest.json")
        got = k3pack.build(gguf_dir=P(self.model), model_config=P(self.config), tokenizer_dir=FsPath(self.tokenizer),
                           pack=P(fresh_pack), manifest=P(fresh_manifest), **kw)
        self.assertFalse(got["already_built"])
        self.assertEqual((got["pack"]["pack"], got["manifest"]), (fresh_pack, fresh_manifest))
        self.assertEqual(got["inputs"], ref["inputs"])
        ref = k3pack.build(self.model, self.config, self.tokenizer, pack=fresh_pack, manifest=fresh_manifest, **kw)
        self.assertEqual(stable(got["document"]), stable(ref["document"]))
        # Implied inputs found from a Path gguf_dir, as from a str one.
        self.assertEqual(k3pack.build(P(self.model), pack=P(fresh_pack), manifest=P(fresh_manifest), **kw)["inputs"],
                         k3pack.build(self.model, pack=fresh_pack, manifest=fresh_manifest, **kw)["inputs"])

    def test_synth(self):
        first = os.path.join(self.tmp.path, "synth-a")
        second = os.path.join(self.tmp.path, "synth-b")
        ref = k3pack.synth(first)
        got = k3pack.synth(out_dir=P(second))
        self.assertFalse(got["already_built"])
        self.assertEqual(json.loads(json.dumps(got).replace(second, first)), ref)
        again = k3pack.synth(first)
        self.assertEqual(k3pack.synth(P(first)), again)
        self.assertEqual(k3pack.synth(FsPath(first)), again)

    def test_nonexpert_stream_and_weights(self):
        ref = arrays((r.name, r.array) for r in k3pack.NonExpertStream(self.manifest))
        self.assertTrue(ref)
        self.assertEqual(arrays((r.name, r.array) for r in k3pack.NonExpertStream(P(self.manifest))), ref)
        self.assertEqual(arrays((r.name, r.array) for r in k3pack.NonExpertStream(manifest_path=FsPath(self.manifest),
                                                                                   copy=True)), ref)
        self.assertEqual(arrays((r.name, r.array) for r in k3pack.nonexpert_tensors(P(self.manifest))), ref)
        self.assertEqual(arrays(k3pack.nonexpert_weights(FsPath(self.manifest))), ref)
        self.assertEqual(arrays(k3pack.nonexpert_weights(manifest_path=P(self.manifest), copy=True)), ref)

    def test_expert_store(self):
        def info(store):
            return stable(store.info), stable(store.stats())

        stats = os.path.join(self.tmp.path, "es-stats.json")
        ref = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=8 << 20, stats_path=stats)
        got = k3pack.ExpertStore(P(self.pack), FsPath(self.manifest), cache_bytes=8 << 20, stats_path=P(stats))
        kw = k3pack.ExpertStore(pack_path=P(self.pack), manifest_path=P(self.manifest), cache_bytes=8 << 20)
        try:
            self.assertEqual(info(got), info(ref))
            self.assertEqual(info(kw)[0], info(ref)[0])
            got.write_stats()
            self.assertTrue(os.path.isfile(stats))
        finally:
            for store in (ref, got, kw):
                store.close()

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_sglang_iterator(self):
        ref = arrays(adapter.kimi_k3_nonexpert_weights_iterator(self.manifest))
        self.assertTrue(ref)
        self.assertEqual(arrays(adapter.kimi_k3_nonexpert_weights_iterator(P(self.manifest))), ref)
        self.assertEqual(arrays(adapter.kimi_k3_nonexpert_weights_iterator(FsPath(self.manifest), copy=True)), ref)
        self.assertEqual(arrays(adapter.kimi_k3_nonexpert_weights_iterator(manifest_path=P(self.manifest))), ref)
        self.assertEqual(arrays(adapter._copying_iterator(P(self.manifest))), ref)

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_sglang_store(self):
        def opened(pack, manifest, stats):
            return adapter.KimiGGMLExpertPackStore(
                pack, manifest_path=manifest, expected_layers=self.num_layers, expected_experts=self.experts,
                expected_top_k=self.top_k, cache_vram_mib=6, cache_vram_reserve_mib=1, stats_path=stats)

        stats = os.path.join(self.tmp.path, "store-stats.json")
        ref = opened(self.pack, self.manifest, stats)
        try:
            for got in (opened(P(self.pack), P(self.manifest), P(stats)),
                        opened(FsPath(self.pack), FsPath(self.manifest), FsPath(stats))):
                try:
                    self.assertEqual((got.pack_path, got.manifest_path, got.stats_path),
                                     (ref.pack_path, ref.manifest_path, ref.stats_path))
                    self.assertEqual(vars(got.header), vars(ref.header))
                    key = (self.layers[0], 0, 0)
                    self.assertEqual(got.entries[key].shape, ref.entries[key].shape)
                finally:
                    got.close()
        finally:
            ref.close()


@unittest.skipIf(torch is None, "torch is not installed")
class RepeatedInstall(_util.TinyPackTestCase):
    """install_into_sglang() called again and again, copy and store in any
    order, against stand-in SGLang modules: each call switches what SGLang's
    modules hold; k3pack's own modules and a module that imported k3pack's
    function itself keep k3pack's objects; the installed iterator yields."""

    ITERATOR = "kimi_k3_nonexpert_weights_iterator"
    STORE = "KimiGGMLExpertPackStore"

    def test_any_order_of_copy_and_store(self):
        own_iterator = adapter.kimi_k3_nonexpert_weights_iterator
        own_store = adapter.KimiGGMLExpertPackStore
        copying = adapter._copying_iterator
        expected_names = [name for name, _ in k3pack.nonexpert_weights(self.manifest)]

        def original(manifest_path):
            yield from ()

        class Original:
            pass

        names = ["sglang", "sglang.srt", "sglang.srt.model_loader", adapter.SGLANG_MODULE, "sglang.srt.layers",
                 "sglang.srt.layers.moe", adapter.SGLANG_STORE_MODULE, "sglang.srt.late_import", "fake_consumer",
                 "fake_user"]
        with _util.StandInModules(*names):
            loader = sys.modules[adapter.SGLANG_MODULE]
            moe = sys.modules[adapter.SGLANG_STORE_MODULE]
            late = sys.modules["sglang.srt.late_import"]
            consumer = sys.modules["fake_consumer"]  # `from sglang... import` both names before the install
            user = sys.modules["fake_user"]  # `from k3pack.sglang import` both names: never touched
            setattr(loader, self.ITERATOR, original)
            setattr(moe, self.STORE, Original)
            setattr(consumer, self.ITERATOR, original)
            setattr(consumer, self.STORE, Original)
            setattr(user, self.ITERATOR, own_iterator)
            setattr(user, self.STORE, own_store)

            steps = [(False, False), (True, False), (False, False), (False, True), (True, True), (True, False),
                     (False, True), (False, False), (True, True), (True, True), (False, False)]
            store_installed = False
            for i, (copy, store) in enumerate(steps):
                with self.subTest(step=i, copy=copy, store=store):
                    patched = adapter.install_into_sglang(copy=copy, store=store)
                    if i == 1:
                        # SGLang's module imported by another of its modules after the first install.
                        setattr(late, self.ITERATOR, getattr(loader, self.ITERATOR))
                    store_installed = store_installed or store
                    want_iterator = copying if copy else own_iterator
                    want_store = own_store if store_installed else Original
                    for module in (loader, consumer) + ((late,) if i >= 1 else ()):
                        self.assertIs(getattr(module, self.ITERATOR), want_iterator, module.__name__)
                    for module in (moe, consumer):
                        self.assertIs(getattr(module, self.STORE), want_store, module.__name__)
                    self.assertIn(adapter.SGLANG_MODULE, patched)
                    self.assertIn("fake_consumer", patched)
                    self.assertEqual(adapter.SGLANG_STORE_MODULE in patched, store)
                    self.assertFalse([n for n in patched if n == "k3pack" or n.startswith("k3pack.")], patched)
                    self.assertNotIn("fake_user", patched)
                    # k3pack's own names, and a user's import of them, are left alone.
                    self.assertIs(adapter.kimi_k3_nonexpert_weights_iterator, own_iterator)
                    self.assertIs(adapter._copying_iterator, copying)
                    self.assertIs(adapter.KimiGGMLExpertPackStore, own_store)
                    self.assertIs(getattr(user, self.ITERATOR), own_iterator)
                    self.assertIs(getattr(user, self.STORE), own_store)
                    # What SGLang calls yields tensors (a RecursionError here before).
                    yielded = list(getattr(loader, self.ITERATOR)(P(self.manifest)))
                    self.assertEqual([name for name, _ in yielded], expected_names)
                    self.assertTrue(all(isinstance(t, torch.Tensor) for _, t in yielded))

    def test_copying_iterator_does_not_use_the_module_global(self):
        def boom(*args, **kwargs):
            raise AssertionError("the module global was called")

        with mock.patch.object(adapter, "kimi_k3_nonexpert_weights_iterator", boom):
            yielded = list(adapter._copying_iterator(self.manifest))
        self.assertTrue(yielded)
        self.assertTrue(all(isinstance(t, torch.Tensor) for _, t in yielded))


if __name__ == "__main__":
    unittest.main()
