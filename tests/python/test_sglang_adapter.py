"""k3pack.sglang.kimi_k3_nonexpert_weights_iterator against an independent
reimplementation of SGLang's iterator (gguf_oracle.sglang_nonexpert_weights):
names, order, torch dtypes, shapes, values, and exception types + texts."""

import json
import os
import shutil
import unittest

import numpy as np
import torch

import _util
import gguf_oracle as oracle
import k3pack
from k3pack.sglang import kimi_k3_nonexpert_weights_iterator

TORCH_DTYPES = {"uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
                "int64": torch.int64, "float16": torch.float16, "float32": torch.float32,
                "float64": torch.float64, "bfloat16": torch.bfloat16}


def bits(tensor):
    """A torch tensor's bytes as a numpy array of the same shape (bf16 -> int16)."""
    t = tensor.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def expected_k3pack(name, value, dtype_name, source_type):
    """The oracle's SGLang value turned into k3pack's default (corrected) BF16 form."""
    if source_type == "BF16" and dtype_name == "uint8":
        value = value.view("<u2")  # bytes -> bit patterns, element shape
        return value, "bfloat16"
    return value, dtype_name


class AdapterCase(unittest.TestCase):
    """Helpers: run both sides and compare, or compare their exceptions."""

    def collect(self, manifest, **kw):
        return list(kimi_k3_nonexpert_weights_iterator(manifest, **kw))

    def assert_same_stream(self, manifest, source_types, sglang_compat):
        # Compat mode: every byte SGLang's (A_log from torch.log itself);
        # default: A_log correctly rounded, BF16 corrected.
        want = list(oracle.sglang_nonexpert_weights(manifest, torch_a_log=sglang_compat))
        got = self.collect(manifest, sglang_compat=sglang_compat)
        self.assertEqual([n for n, _ in got], [n for n, _, _ in want])
        for (name, tensor), (_, value, dtype_name) in zip(got, want):
            if not sglang_compat:
                value, dtype_name = expected_k3pack(name, value, dtype_name, source_types.get(name))
            self.assertEqual(tensor.dtype, TORCH_DTYPES[dtype_name], name)
            self.assertEqual(tuple(tensor.shape), value.shape, name)
            got_bits = bits(tensor)
            self.assertEqual(got_bits.dtype.itemsize, value.dtype.itemsize, name)
            self.assertEqual(got_bits.tobytes(), value.tobytes(), name)
        return got

    def assert_same_error(self, manifest, **kw):
        with self.assertRaises(Exception) as want:
            list(oracle.sglang_nonexpert_weights(manifest))
        with self.assertRaises(Exception) as got:
            self.collect(manifest, **kw)
        self.assertIs(type(got.exception), type(want.exception))
        self.assertEqual(str(got.exception), str(want.exception))
        return got.exception


def _f32(a):
    return np.asarray(a, dtype="<f4").tobytes()


class HandWrittenModel(AdapterCase):
    """A small GGUF written by the oracle with every emission rule in it."""

    def setUp(self):
        self.tmp = _util.TempDir()
        rng = np.random.default_rng(3)
        d = 32
        self.tensors = [
            ("token_embd.weight", "Q8_0", [64, 8], rng.integers(0, 256, 8 * 2 * 34, dtype=np.uint8).tobytes()),
            ("output_norm.weight", "F32", [d], _f32(rng.standard_normal(d))),
            ("output.weight", "BF16", [d, 4], rng.integers(0, 65536, 4 * d, dtype=np.uint16).astype("<u2").tobytes()),
            ("output_res_score.weight", "F32", [d], _f32(rng.standard_normal(d))),
            ("blk.0.attn_norm.weight", "F16", [d], rng.standard_normal(d).astype("<f2").tobytes()),
            ("blk.0.attn_res_score.weight", "F16", [d], rng.standard_normal(d).astype("<f2").tobytes()),
            ("blk.1.ssm_a", "F32", [1, 4, 1, 1], _f32(-np.exp(rng.standard_normal(4)))),
            ("blk.1.ssm_dt.bias", "F32", [8], _f32(rng.standard_normal(8))),
            ("blk.1.ssm_conv1d_q.weight", "F32", [4, 8], _f32(rng.standard_normal(32))),
            ("blk.1.ffn_up_exps.weight", "Q2_K", [256, 2, 2], rng.integers(0, 256, 4 * 84, dtype=np.uint8).tobytes()),
            ("blk.1.ffn_up_shexp.weight", "Q4_0", [64, 2], rng.integers(0, 256, 2 * 2 * 18, dtype=np.uint8).tobytes()),
            ("blk.3.attn_k_b.weight", "Q4_0", [32, 4, 2], rng.integers(0, 256, 8 * 18, dtype=np.uint8).tobytes()),
            ("blk.3.attn_v_b.weight", "Q2_K", [256, 2], rng.integers(0, 256, 2 * 84, dtype=np.uint8).tobytes()),
            ("blk.3.ffn_res_score.weight", "F32", [d], _f32(rng.standard_normal(d))),
        ]
        self.write(self.tensors)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, tensors, split=2):
        kv = [("general.architecture", 8, "kimi-k3")]
        paths = []
        parts = [tensors[:split], tensors[split:]] if split else [tensors]
        for i, part in enumerate(parts):
            p = os.path.join(self.tmp.path, "HAND-%05d-of-%05d.gguf" % (i + 1, len(parts)))
            oracle.write_gguf(p, kv + [("split.no", 2, i), ("split.count", 2, len(parts)),
                                       ("split.tensors.count", 5, len(tensors))], part)
            paths.append(p)
        self.paths = paths
        self.manifest_doc = oracle.source_manifest(paths)
        self.manifest = os.path.join(self.tmp.path, "m.json")
        oracle.write_json(self.manifest, self.manifest_doc)

    def rewrite_manifest(self, doc):
        oracle.write_json(self.manifest, doc)

    def source_types(self):
        types = {}
        for name, tname, _, _ in self.tensors:
            for target in oracle.checkpoint_targets(name) if "exps" not in name else ():
                types[target] = tname
        return types

    def test_default_matches_oracle_with_bf16_corrected(self):
        got = self.assert_same_stream(self.manifest, self.source_types(), sglang_compat=False)
        names = [n for n, _ in got]
        # Spot checks of the rules (independent of both implementations).
        self.assertEqual(names[0:2], ["model.embed_tokens.qweight_type", "model.embed_tokens.qweight"])
        self.assertIn("lm_head.weight", names)
        lm = dict(got)["lm_head.weight"]
        self.assertEqual((lm.dtype, tuple(lm.shape)), (torch.bfloat16, (4, 32)))
        self.assertEqual(dict(got)["model.embed_tokens.qweight_type"].shape, ())
        self.assertEqual(int(dict(got)["model.embed_tokens.qweight_type"]), 8)
        self.assertEqual(tuple(dict(got)["model.output_attn_res_proj.weight"].shape), (1, 32))
        self.assertEqual(dict(got)["model.layers.0.self_attention_res_norm.weight"].dtype, torch.float16)
        self.assertIn("model.layers.3.self_attn.k_b_qweight_type", names)
        self.assertFalse(any("exps" in n or "experts.w" in n for n in names))

    def test_sglang_compat_matches_oracle_exactly(self):
        got = self.assert_same_stream(self.manifest, {}, sglang_compat=True)
        lm = dict(got)["lm_head.weight"]
        self.assertEqual((lm.dtype, tuple(lm.shape)), (torch.uint8, (4, 64)))

    def test_zero_copy_and_copy_option(self):
        recs = {r.name: r for r in k3pack.nonexpert_tensors(self.manifest)}
        self.assertTrue(recs["model.norm.weight"].zero_copy)
        self.assertFalse(recs["model.norm.weight"].array.flags.writeable)
        self.assertEqual(recs["lm_head.weight"].dtype, "bfloat16")
        self.assertEqual(recs["lm_head.weight"].array.dtype, np.uint16)
        copied = dict(kimi_k3_nonexpert_weights_iterator(self.manifest, copy=True))
        copied["model.norm.weight"].add_(1.0)  # fresh, writable
        # A view outlives its stream and records (its base owns the mapping),
        # also after release_pages dropped its pages.
        kept = recs["model.norm.weight"].array
        want = dict((n, v) for n, v, _ in oracle.sglang_nonexpert_weights(self.manifest))["model.norm.weight"]
        del recs
        import gc

        gc.collect()
        self.assertEqual(kept.tobytes(), want.tobytes())

    def test_nonexpert_weights_numpy(self):
        pairs = list(k3pack.nonexpert_weights(self.manifest))
        want = list(oracle.sglang_nonexpert_weights(self.manifest))
        self.assertEqual([n for n, _ in pairs], [n for n, _, _ in want])
        for (n, a), (_, v, _) in zip(pairs, want):
            self.assertIsInstance(a, np.ndarray)
            if n != "lm_head.weight":
                self.assertEqual((a.dtype, a.shape, a.tobytes()), (v.dtype, v.shape, v.tobytes()), n)

    def test_a_log_compat_is_torch_default_is_correctly_rounded(self):
        # 4096 heads: torch's vectorized float32 log is 1 ulp off the correctly
        # rounded value for about 1 % of inputs, so the two modes differ here.
        rng = np.random.default_rng(11)
        x = (-np.exp(rng.standard_normal(4096))).astype("<f4")
        self.tensors[6] = ("blk.1.ssm_a", "F32", [1, 4096, 1, 1], x.tobytes())
        self.write(self.tensors)
        torch_log = torch.log(-torch.tensor(x.reshape(1, 1, 4096, 1))).numpy()
        exact = np.log(-x.astype(np.float64)).astype(np.float32).reshape(1, 1, 4096, 1)
        self.assertTrue((torch_log != exact).any(), "this torch's log is correctly rounded: nothing to tell apart")
        name = "model.layers.1.self_attn.A_log"
        compat = dict(self.collect(self.manifest, sglang_compat=True))[name]
        default = dict(self.collect(self.manifest))[name]
        self.assertEqual((compat.dtype, tuple(compat.shape)), (torch.float32, (1, 1, 4096, 1)))
        self.assertEqual(compat.numpy().tobytes(), torch_log.tobytes())
        self.assertEqual(default.numpy().tobytes(), exact.tobytes())
        self.assertEqual(dict(k3pack.nonexpert_weights(self.manifest))[name].tobytes(), exact.tobytes())

    # ---- faults: same exception type and text as the oracle (SGLang)

    def test_unsupported_format(self):
        self.manifest_doc["format"] = "SOMETHING-ELSE"
        self.rewrite_manifest(self.manifest_doc)
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), "Kimi-K3 manifest format is unsupported")

    def test_incomplete(self):
        self.manifest_doc["complete"] = False
        self.rewrite_manifest(self.manifest_doc)
        self.assert_same_error(self.manifest)

    def test_missing_shard(self):
        os.unlink(self.paths[1])
        e = self.assert_same_error(self.manifest)
        self.assertIsInstance(e, FileNotFoundError)

    def test_changed_shard_size(self):
        with open(self.paths[0], "ab") as f:
            f.write(b"\0" * 32)
        size = os.path.getsize(self.paths[0])
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), "Kimi-K3 GGUF shard is missing or changed: %s" % os.path.realpath(self.paths[0]))
        # What changed, as the CLI's metadata check says (it had no hint).
        self.assertEqual(e.k3pack_hint, "size %d != %d (file != manifest); rebuild the manifest" % (size, size - 32))

    def test_inventory_changed(self):
        self.manifest_doc["source"]["tensors"] = [t for t in self.manifest_doc["source"]["tensors"]
                                                  if t["name"] != "blk.1.ssm_dt.bias"]
        self.rewrite_manifest(self.manifest_doc)
        self.assert_same_error(self.manifest)

    def test_type_changed(self):
        for t in self.manifest_doc["source"]["tensors"]:
            if t["name"] == "blk.3.attn_v_b.weight":
                t["dtype"] = "Q3_K"
        self.rewrite_manifest(self.manifest_doc)
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), "Kimi-K3 GGUF tensor type changed: blk.3.attn_v_b.weight")

    def test_missing_key_is_key_error(self):
        del self.manifest_doc["source"]["shards"]
        self.rewrite_manifest(self.manifest_doc)
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), str(KeyError("shards")))

    def test_unknown_name(self):
        self.tensors.append(("blk.1.ffn_mystery.weight", "F32", [4], _f32([1, 2, 3, 4])))
        self.write(self.tensors)
        e = self.assert_same_error(self.manifest)
        self.assertIsInstance(e, KeyError)

    def test_duplicate_target(self):
        # ssm_g (KDA) and attn_gate (MLA) both map to self_attn.g_proj.weight.
        self.tensors += [("blk.2.ssm_g.weight", "F32", [4], _f32([1, 2, 3, 4])),
                         ("blk.2.attn_gate.weight", "F32", [4], _f32([1, 2, 3, 4]))]
        self.write(self.tensors)
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), "duplicate Kimi-K3 target parameter: model.layers.2.self_attn.g_proj.weight")

    def test_residual_not_vector(self):
        self.tensors.append(("blk.5.ffn_res_score.weight", "F32", [2, 2], _f32([1, 2, 3, 4])))
        self.write(self.tensors)
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), "Kimi-K3 attention-residual score must be a vector, got (2, 2)")

    def test_ssm_a_not_negative(self):
        self.tensors[6] = ("blk.1.ssm_a", "F32", [1, 4, 1, 1], _f32([-1, 0.5, -2, -3]))
        self.write(self.tensors)
        self.assert_same_error(self.manifest)

    def test_ssm_a_nan(self):
        self.tensors[6] = ("blk.1.ssm_a", "F32", [1, 4, 1, 1], _f32([-1, np.nan, -2, -3]))
        self.write(self.tensors)
        e = self.assert_same_error(self.manifest)
        self.assertEqual(str(e), "Kimi-K3 GGUF ssm_a must contain finite floating values")

    def test_ssm_a_shape_checked_unless_compat(self):
        # A shape SGLang's A_log loader cannot take: k3pack rejects it up front
        # (deliberate difference); sglang_compat streams it as SGLang would.
        self.tensors[6] = ("blk.1.ssm_a", "F32", [1, 1, 4, 1], _f32([-1, -0.5, -2, -3]))
        self.write(self.tensors)
        with self.assertRaises(ValueError) as cm:
            self.collect(self.manifest)
        self.assertIn("ssm_a must have shape", str(cm.exception))
        self.assert_same_stream(self.manifest, {}, sglang_compat=True)

    def test_missing_manifest_file(self):
        e = self.assert_same_error(os.path.join(self.tmp.path, "nope.json"))
        self.assertIsInstance(e, FileNotFoundError)

    def test_malformed_manifest_json(self):
        with open(self.manifest, "w") as f:
            f.write('{"format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1", "complete": tru')
        e = self.assert_same_error(self.manifest)
        self.assertIsInstance(e, json.JSONDecodeError)

    def test_a_shard_given_as_the_manifest_is_named_not_read_whole(self):
        # k3pack names a shard given where the manifest goes from its first
        # bytes. The wrapper then re-read it whole with json.load to raise
        # Python's own exception: a shard of tens of GB read into memory to
        # fail on its first byte, and k3pack's message lost.
        big = os.path.join(self.tmp.path, "BIG-00001-of-00001.gguf")
        with open(self.paths[0], "rb") as src, open(big, "wb") as dst:
            dst.write(src.read())
            dst.truncate(1 << 36)  # 64 GiB apparent, sparse: json.load would need it all in memory
        for path in (self.paths[0], big):
            with self.assertRaises(ValueError) as cm:
                self.collect(path)
            self.assertNotIsInstance(cm.exception, json.JSONDecodeError)
            self.assertIn(path + " is a GGUF file, not a manifest", str(cm.exception))
        # Only k3pack's own naming of the file counts, not a path that happens
        # to hold those words: malformed JSON there is still Python's error.
        odd = os.path.join(self.tmp.path, "odd, not a manifest")
        os.mkdir(odd)
        with open(os.path.join(odd, "m.json"), "w") as f:
            f.write('{"format": tru')
        e = self.assert_same_error(os.path.join(odd, "m.json"))
        self.assertIsInstance(e, json.JSONDecodeError)


class ImportsAndHelpers(unittest.TestCase):
    def test_torch_only_imported_by_the_adapter(self):
        import subprocess
        import sys

        code = ("import sys; sys.path.insert(0, %r); import k3pack; assert 'torch' not in sys.modules; "
                "k3pack.GGUFFile; print('ok')" % os.path.join(_util.REPO, "python"))
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={k: v for k, v in os.environ.items() if k != "K3PACK_PYTHON_DIR"})
        self.assertEqual(out.stdout.strip(), "ok", out.stdout)

    def test_ssm_a_to_a_log(self):
        x = -np.exp(np.linspace(-3, 3, 9)).astype(np.float32)
        got = k3pack.ssm_a_to_a_log(x)
        self.assertEqual(got.dtype, np.float32)
        np.testing.assert_allclose(got, np.log(-x.astype(np.float64)), rtol=2e-7)
        with self.assertRaises(ValueError) as cm:
            k3pack.ssm_a_to_a_log(np.array([-1.0, 0.0], np.float32))
        self.assertEqual(str(cm.exception), "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values")
        with self.assertRaises(ValueError) as cm:
            k3pack.ssm_a_to_a_log(np.array([-1.0, np.inf], np.float32))
        self.assertEqual(str(cm.exception), "Kimi-K3 GGUF ssm_a must contain finite floating values")
        bf = np.array([0xBF80], np.uint16)  # bfloat16 -1.0 -> log(1) = 0
        self.assertEqual(int(k3pack.ssm_a_to_a_log(bf, dtype="bfloat16")[0]), 0)
        # SGLang's ValueError for values that are not floating point (was TypeError).
        for ints in (np.array([-1], np.int32), [-1], np.array([True])):
            with self.assertRaises(ValueError) as cm:
                k3pack.ssm_a_to_a_log(ints)
            self.assertEqual(str(cm.exception), "Kimi-K3 GGUF ssm_a must contain finite floating values")
        # A list of floats (float64) is checked as float32.
        got = k3pack.ssm_a_to_a_log([-1.0, -np.e])
        self.assertEqual(got.dtype, np.float32)
        np.testing.assert_allclose(got, [0.0, 1.0], atol=1e-6)


class InstallIntoSglang(unittest.TestCase):
    """install_into_sglang() patches SGLang's module and names imported from it
    (a stand-in package plays SGLang, which is not installed here)."""

    def test_patches_module_and_imported_names(self):
        import sys

        import k3pack.sglang as adapter

        def original(manifest_path):
            yield from ()

        names = ["sglang", "sglang.srt", "sglang.srt.model_loader", adapter.SGLANG_MODULE, "fake_consumer"]
        with _util.StandInModules(*names):
            sys.modules[adapter.SGLANG_MODULE].kimi_k3_nonexpert_weights_iterator = original
            consumer = sys.modules["fake_consumer"]
            consumer.kimi_k3_nonexpert_weights_iterator = original
            patched = adapter.install_into_sglang()
            self.assertEqual(patched, sorted([adapter.SGLANG_MODULE, "fake_consumer"]))
            # copy=True by default: SGLang gets fresh tensors, as from its own iterator.
            self.assertIs(consumer.kimi_k3_nonexpert_weights_iterator, adapter._copying_iterator)


class InstallIntoSglangWithoutSglang(unittest.TestCase):
    """Before: Python's bare "No module named 'sglang'" (or '...kimi_k3_gguf'
    for an SGLang without the path), naming neither the interpreter nor what
    to do."""

    def test_sglang_not_installed(self):
        import importlib.util
        import sys

        import k3pack.sglang as adapter

        with _util.StandInModules("sglang", adapter.SGLANG_MODULE):  # restored on exit
            # Another test's stand-ins gone, `import sglang` looks on sys.path.
            sys.modules.pop(adapter.SGLANG_MODULE)
            sys.modules.pop("sglang")
            if importlib.util.find_spec("sglang") is not None:
                self.skipTest("SGLang is installed here")
            with self.assertRaises(ModuleNotFoundError) as ctx:
                adapter.install_into_sglang()
        self.assertEqual(ctx.exception.name, "sglang")
        self.assertIn("SGLang is not installed for this Python (%s)" % sys.executable, str(ctx.exception))
        self.assertIn("kimi_k3_nonexpert_weights_iterator", str(ctx.exception))

    def test_sglang_without_the_kimi_k3_module(self):
        import sys

        import k3pack.sglang as adapter

        with _util.StandInModules("sglang", "sglang.srt", "sglang.srt.model_loader", adapter.SGLANG_MODULE):
            sys.modules[adapter.SGLANG_MODULE] = None  # as when SGLang has no such module
            with self.assertRaises(ModuleNotFoundError) as ctx:
                adapter.install_into_sglang()
        self.assertEqual(ctx.exception.name, adapter.SGLANG_MODULE)
        self.assertIn("this SGLang has no module %s" % adapter.SGLANG_MODULE, str(ctx.exception))


class SynthModel(AdapterCase):
    """The tiny synthetic Kimi-K3 model, with manifests from the oracle and
    (when the CLI has them) from `k3pack pack` + `k3pack manifest`."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.clean = os.path.join(cls.tmp.path, "clean")
        _util.synth(cls.clean)
        cls.paths = k3pack.ShardSet.discover(cls.clean)
        cls.manifest = os.path.join(cls.tmp.path, "clean.json")
        oracle.write_json(cls.manifest, oracle.source_manifest(cls.paths))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def source_types(self, manifest):
        with open(manifest, encoding="utf-8") as f:
            doc = json.load(f)
        types = {}
        for t in doc["source"]["tensors"]:
            if "_exps." in t["name"]:
                continue
            try:
                for target in oracle.checkpoint_targets(t["name"]):
                    types[target] = t["dtype"]
            except KeyError:
                pass
        return types

    def test_clean_stream(self):
        for compat in (False, True):
            got = self.assert_same_stream(self.manifest, self.source_types(self.manifest), compat)
            self.assertGreater(len(got), 20)
            self.assertTrue(any(n.endswith("A_log") for n, _ in got))

    def test_real_manifest(self):
        if not (_util.cli_has_command("manifest") and _util.cli_has_command("pack")):
            self.skipTest("k3pack pack/manifest not built")
        pack = os.path.join(self.tmp.path, "tiny.expert-major.pack")
        manifest = os.path.join(self.tmp.path, "real.json")
        cfg = os.path.join(self.clean, "config.json")
        if not os.path.exists(pack):
            _util.run_cli("pack", "--gguf-dir", self.clean, "--model-config", cfg, "--profile", "scaled",
                          "--pack", pack, "--safety-margin-gib", "0", "--progress", "none")
        _util.run_cli("manifest", "--gguf-dir", self.clean, "--pack", pack, "--model-config", cfg,
                      "--tokenizer-dir", os.path.join(self.clean, "tokenizer"), "--manifest", manifest,
                      "--profile", "scaled")
        self.assert_same_stream(manifest, self.source_types(manifest), False)

    def fault_manifest(self, fault):
        out = os.path.join(self.tmp.path, fault)
        if not os.path.isdir(out):
            _util.synth(out, fault=fault)
        m = os.path.join(self.tmp.path, fault + ".json")
        oracle.write_json(m, oracle.source_manifest(k3pack.ShardSet.discover(out)))
        return m

    def test_fault_raw_ssm_a(self):
        e = self.assert_same_error(self.fault_manifest("raw-ssm-a"))
        self.assertIsInstance(e, ValueError)

    def test_fault_nan_ssm_a(self):
        self.assert_same_error(self.fault_manifest("nan-ssm-a"))

    def test_fault_zero_ssm_a(self):
        e = self.assert_same_error(self.fault_manifest("zero-ssm-a"))
        self.assertEqual(str(e), "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values")

    def test_fault_unknown_tensor_name(self):
        e = self.assert_same_error(self.fault_manifest("unknown-tensor-name"))
        self.assertEqual(str(e), str(KeyError("unsupported Kimi-K3 GGUF tensor name: blk.1.ffn_mystery.weight")))

    def test_shard_replaced_by_other_model(self):
        other = os.path.join(self.tmp.path, "other")
        shutil.copytree(self.clean, other)
        m = os.path.join(self.tmp.path, "other.json")
        oracle.write_json(m, oracle.source_manifest(k3pack.ShardSet.discover(other)))
        _util.synth(other, matrix_type="Q4_0", force=True)
        self.assert_same_error(m)


if __name__ == "__main__":
    unittest.main()
