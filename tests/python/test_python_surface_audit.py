"""Faults of an audit of the Python surface (arguments of the wrong type,
paths ending in '/', builders' keywords, refused calls that left files).
Each test failed before its fix."""

import json
import os
import unittest

import _util  # noqa: F401  (import path)

import k3pack
from k3pack.sglang import KimiGGMLExpertPackStore


class PathArgumentsOfTheWrongType(_util.TinyPackTestCase):
    """nonexpert_tensors and the drop-in store took str() of any path: None
    became the file "None" (and bytes "b'/m.json'"), refused as a missing
    file that the caller never named, in the current directory."""

    def test_nonexpert_stream_refuses_none_and_bytes(self):
        for bad, shown in [(None, "NoneType"), (self.manifest.encode(), "bytes")]:
            for call in (lambda: k3pack.nonexpert_tensors(bad), lambda: list(k3pack.nonexpert_weights(bad))):
                with self.assertRaises(TypeError) as cm:
                    call()
                self.assertIn(f"manifest_path must be a str or os.PathLike[str], got {shown}", str(cm.exception))

    def test_sglang_iterator_refuses_none(self):
        from k3pack.sglang import kimi_k3_nonexpert_weights_iterator

        with self.assertRaises(TypeError) as cm:
            next(kimi_k3_nonexpert_weights_iterator(None))
        self.assertEqual(str(cm.exception), "manifest_path must be a str or os.PathLike[str], got NoneType")

    def test_dropin_store_refuses_none_and_bytes(self):
        kw = dict(expected_layers=self.num_layers, expected_experts=self.experts, expected_top_k=self.top_k)
        with self.assertRaises(TypeError) as cm:
            KimiGGMLExpertPackStore(None, manifest_path=self.manifest, **kw)
        self.assertEqual(str(cm.exception), "pack_path must be a str or os.PathLike[str], got NoneType")
        with self.assertRaises(TypeError) as cm:
            KimiGGMLExpertPackStore(self.pack, manifest_path=self.manifest.encode(), **kw)
        self.assertTrue(str(cm.exception).startswith("manifest_path must be a str or os.PathLike[str], got bytes"))


class DropInIntegerKeywords(_util.TinyPackTestCase):
    """k3pack's own keywords of the drop-in store went through int():
    host_cache_mib=1.5 was 1 MiB (then a MemoryError about a 1 MiB budget),
    "8" was 8, and ep_size="2" a rank store."""

    def test_float_and_str_are_type_errors_naming_the_keyword(self):
        for kw, text in [({"host_cache_mib": 1.5}, "host_cache_mib must be an int, got float"),
                         ({"host_cache_mib": "8"}, "host_cache_mib must be an int, got str"),
                         ({"host_cache_mib": None}, "host_cache_mib must be an int, got NoneType"),
                         ({"ep_size": "2", "ep_rank": 0}, "ep_size must be an int, got str"),
                         ({"ep_size": 2, "ep_rank": 0.0}, "ep_rank must be an int, got float")]:
            with self.subTest(kw=kw):
                with self.assertRaises(TypeError) as cm:
                    self.dropin(**kw)
                self.assertEqual(str(cm.exception), text)

    def test_numpy_integers_still_serve(self):
        import numpy as np

        store = self.dropin(host_cache_mib=np.int64(8), ep_size=np.int32(2), ep_rank=np.uint8(1))
        self.addCleanup(store.close)
        self.assertEqual((store.host_cache_mib, store.ep_size, store.ep_rank), (8, 2, 1))


class DropInStoreIsNotCopied(_util.TinyPackTestCase):
    """copy.copy(store) gave a second store over the same engine, closed
    under it when the original was collected."""

    def test_copy_and_pickle_are_refused(self):
        import copy
        import pickle

        store = self.dropin()
        self.addCleanup(store.close)
        for call in (copy.copy, copy.deepcopy, pickle.dumps):
            with self.subTest(call=call.__name__):
                with self.assertRaises(TypeError) as cm:
                    call(store)
                self.assertTrue(str(cm.exception).startswith("cannot pickle 'KimiGGMLExpertPackStore' object"))


class DropInCudaWithoutIndex(_util.TinyPackTestCase):
    """initialize_device_cache("cuda") handed torch.cuda.mem_get_info a device
    without an index, which it refuses ("Expected a torch.device with a
    specified index or an integer, but got:cuda"): the most natural call
    failed on every GPU. Checked without a GPU: mem_get_info is replaced by
    one that applies torch's own index rule and then stops the call."""

    def test_mem_get_info_gets_the_current_device_index(self):
        from unittest import mock

        import torch
        from torch.cuda._utils import _get_device_index

        class Stop(Exception):
            pass

        seen = []

        def mem_get_info(device=None):
            seen.append(_get_device_index(device))  # torch's rule: ValueError without an index
            raise Stop

        store = self.dropin()
        self.addCleanup(store.close)
        with mock.patch.object(torch.cuda, "current_device", return_value=0), \
                mock.patch.object(torch.cuda, "mem_get_info", mem_get_info):
            for device in ("cuda", torch.device("cuda"), "cuda:0"):
                with self.subTest(device=device):
                    with self.assertRaises(Stop):
                        store.initialize_device_cache(device)
        self.assertEqual(seen, [0, 0, 0])


class StatsPathEndingInSlash(_util.TinyPackTestCase):
    """ExpertStore(stats_path="dir/") opened; its close() then made that
    directory and refused it ("is a directory"), losing the counters."""

    def test_refused_at_open_and_nothing_made(self):
        target = os.path.join(self.tmp.path, "stats-dir") + "/"
        with self.assertRaises(FileExistsError) as cm:
            k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=8 << 20, stats_path=target)
        self.assertEqual(str(cm.exception), f"stats_path {target} ends in '/', so it names a directory, not a file")
        self.assertEqual(cm.exception.k3pack_hint,
                         f"pass stats_path a path for a regular file, such as {target}NAME")
        self.assertFalse(os.path.exists(target))

    def test_dropin_resolves_it_as_sglang_does(self):
        # SGLang's Path(stats_path).resolve() drops the '/': a file of that name.
        target = os.path.join(self.tmp.path, "dropin-stats.json")
        store = self.dropin(stats_path=target + "/")
        store.close()
        self.assertTrue(os.path.isfile(target))


class PrefetchRequestIdIsNamedAsGiven(_util.TinyPackTestCase):
    """prefetch(..., request_id=-1) and keep(...) said "request_ids must be
    non-negative": acquire's keyword, which these methods do not take."""

    def test_messages_name_request_id(self):
        store = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=8 << 20)
        self.addCleanup(store.close)
        layer = self.layers[0]
        for method in (store.prefetch, store.keep):
            # A value of another type is a TypeError (session 44), a bad int a ValueError.
            for bad, text, error in [(-1, "request_id must be non-negative", ValueError),
                                     (2 ** 64, "request_id must be below 2**64", ValueError),
                                     ("a", "request_id must be None or an int, got str", TypeError),
                                     ([1], f"{method.__name__} takes one request_id: the request whose next token "
                                           "was predicted", ValueError)]:
                with self.subTest(method=method.__name__, bad=bad):
                    with self.assertRaises(error) as cm:
                        method(layer, [0], request_id=bad)
                    self.assertEqual(str(cm.exception), text)
        # acquire's keyword keeps its own words.
        with self.assertRaises(ValueError) as cm:
            store.acquire(layer, [list(range(self.top_k))], request_ids=-1)
        self.assertEqual(str(cm.exception), "request_ids must be non-negative")


class KnownShardDigests(_util.TinyPackTestCase):
    """create_manifest(known_shard_sha256=) wrote any string into the
    manifest as the shard's digest ("y" included)."""

    def test_malformed_digest_is_refused(self):
        model = os.path.join(self.tmp.path, "model")
        shard = os.path.realpath(k3pack.ShardSet.discover(model)[0])
        out = os.path.join(self.tmp.path, "digest.manifest.json")
        for bad in ["y", "AB" * 32, "ab" * 31, "ab" * 33]:
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError) as cm:
                    k3pack.create_manifest(model, self.pack, os.path.join(model, "config.json"),
                                           os.path.join(model, "tokenizer"), output=out, profile="scaled",
                                           known_shard_sha256={shard: bad})
                self.assertEqual(str(cm.exception),
                                 f"known_shard_sha256[{shard!r}] must be a SHA-256 digest (64 lowercase hex "
                                 f"digits, as hashlib's hexdigest()), got {bad!r}")
                self.assertFalse(os.path.exists(out))


class CreateManifestPlace(_util.TinyPackTestCase):
    """create_manifest(output=) took a side file of the pack (force=True
    replaced its .inputs record, and every later build of the pack refused
    it) and the tokenizer directory (the model's manifest then failed
    verify: "has a file the manifest does not record"), both refused by
    `k3pack build` and `k3pack manifest`."""

    def test_side_files_and_tokenizer_directory_are_refused(self):
        model = os.path.join(self.tmp.path, "model")
        config, tok = os.path.join(model, "config.json"), os.path.join(model, "tokenizer")
        with open(self.pack + ".inputs", "rb") as f:
            record = f.read()
        for side in (".inputs", ".lock", ".digests"):
            with self.subTest(side=side):
                with self.assertRaises(FileExistsError) as cm:
                    k3pack.create_manifest(model, self.pack, config, tok, output=self.pack + side, profile="scaled",
                                           force=True)
                self.assertIn(f"output {self.pack}{side} is an input (expert_pack (its {side}))", str(cm.exception))
        with open(self.pack + ".inputs", "rb") as f:
            self.assertEqual(f.read(), record)
        out = os.path.join(tok, "m.json")
        with self.assertRaises(FileExistsError) as cm:
            k3pack.create_manifest(model, self.pack, config, tok, output=out, profile="scaled")
        self.assertIn(f"output {out} is in tokenizer_dir {tok}: the manifest records every file", str(cm.exception))
        self.assertFalse(os.path.exists(out))


class BuildKeywords(_util.TinyPackTestCase):
    """k3pack.build of a model already built returned before its options
    reached build_pack: a misspelt keyword (threds=2) and a bad value
    (payload_samples=-1, threads=-1) passed unnoticed, where `k3pack build`
    refuses them; on a fresh build a misspelt one was build_pack()'s
    "incompatible function arguments"."""

    def build(self, **kw):
        model = os.path.join(self.tmp.path, "model")
        return k3pack.build(model, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                            pack=self.pack, manifest=self.manifest, profile="scaled", **kw)

    def test_already_built_still_checks_the_options(self):
        self.assertTrue(self.build()["already_built"])
        with self.assertRaises(TypeError) as cm:
            self.build(threds=2)
        self.assertEqual(str(cm.exception), "build() got an unexpected keyword argument 'threds'")
        with self.assertRaises(ValueError) as cm:
            self.build(payload_samples=-1)
        self.assertEqual(str(cm.exception), "payload_samples must be in 0..9223372036854775807, got -1")
        with self.assertRaises(ValueError) as cm:
            self.build(threads=-1)
        self.assertEqual(str(cm.exception), "threads must be in 0..2147483647, got -1")
        with self.assertRaises(TypeError) as cm:
            self.build(threads=1.5)
        self.assertEqual(str(cm.exception), "threads must be an int, got float")
        self.assertTrue(self.build(threads=1, restart=False)["already_built"])


class CallbacksThatAreNotCallable(_util.TinyPackTestCase):
    """progress=5 or log=[] was taken: each call of it was an unraisable
    "'int' object is not callable" printed to stderr, and the operation went
    on without the progress the caller asked for."""

    def test_type_error_naming_the_keyword_before_any_work(self):
        model = os.path.join(self.tmp.path, "model")
        config, tok = os.path.join(model, "config.json"), os.path.join(model, "tokenizer")
        out = os.path.join(self.tmp.path, "callback.pack")
        calls = [
            ("progress", "int", lambda: k3pack.verify_pack(self.manifest, progress=5)),
            ("progress", "list", lambda: k3pack.validate_pack(self.pack, model, config, profile="scaled",
                                                              progress=[])),
            ("progress", "str", lambda: k3pack.create_manifest(model, self.pack, config, tok, profile="scaled",
                                                               progress="x")),
            ("progress", "int", lambda: k3pack.build_pack(model, config, out=out, profile="scaled", progress=5)),
            ("log", "int", lambda: k3pack.build_pack(model, config, out=out, profile="scaled", log=5)),
            ("log", "int", lambda: k3pack.synth(os.path.join(self.tmp.path, "callback-model"), log=5)),
            ("log", "int", lambda: k3pack.build(model, config, tok, pack=self.pack, manifest=self.manifest,
                                                profile="scaled", log=5)),
            ("progress", "int", lambda: k3pack.build(model, config, tok, pack=self.pack, manifest=self.manifest,
                                                     profile="scaled", progress=5)),
        ]
        for keyword, shown, call in calls:
            with self.subTest(keyword=keyword, shown=shown):
                with self.assertRaises(TypeError) as cm:
                    call()
                self.assertEqual(str(cm.exception), f"{keyword} must be a callable or None, got {shown}")
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(os.path.join(self.tmp.path, "callback-model")))


class DequantizeOfAnArrayOfAnotherKind(unittest.TestCase):
    """dequantize read the bits of any array of the type's width: int32
    [1, 2] as F32 came back [1e-45, 3e-45], float16 1.0 as BF16 0.0078125,
    float32 1.0 as I32 1065353216, without a word."""

    def test_values_of_another_kind_are_refused(self):
        import numpy as np

        for values, name in [(np.array([1, 2], np.int32), "F32"), (np.array([1.0], np.float16), "BF16"),
                             (np.array([1.0], np.float32), "I32"), (np.array([1], np.int64), "F64"),
                             (np.array([True]), "I8")]:
            for call in (k3pack.dequantize, k3pack.tensor_stats):
                with self.subTest(dtype=str(values.dtype), name=name, call=call.__name__):
                    with self.assertRaises(TypeError) as cm:
                        call(values, name)
                    article = "an" if str(values.dtype)[0] in "aeiou" else "a"
                    self.assertTrue(str(cm.exception).startswith(
                        f"{article} {values.dtype} array cannot hold {name} data: its values would be read as {name} "
                        "bit patterns"), str(cm.exception))

    def test_own_values_and_raw_bits_still_decode(self):
        import numpy as np

        one = np.array([1.0], np.float32)
        for arr, name in [(one, "F32"), (one.view(np.uint32), "F32"), (one.astype(np.float16), "F16"),
                          (one.astype(np.float16).view(np.uint16), "F16"), (np.array([0x3F80], np.uint16), "BF16"),
                          (np.array([0x3F80], np.int16), "BF16"), (np.array([0x3C00], np.int16), "F16"),
                          (np.array([0x3F80], np.uint16).view("V2"), "BF16"), (np.array([1], np.int32), "I32"),
                          (np.array([1], np.int8), "I8"), (np.array([1], np.uint8), "I8")]:
            with self.subTest(dtype=str(arr.dtype), name=name):
                self.assertEqual(k3pack.dequantize(arr, name).tolist(), [1.0])


class ValidatePackOfADirectory(_util.TinyPackTestCase):
    """validate_pack(<a directory>, ...) raised "read failed at offset 0: Is
    a directory", naming no file; SGLang's open() names it."""

    def test_names_the_directory(self):
        model = os.path.join(self.tmp.path, "model")
        with self.assertRaises(IsADirectoryError) as cm:
            k3pack.validate_pack(self.tmp.path, model, os.path.join(model, "config.json"), profile="scaled")
        self.assertEqual(str(cm.exception), f"[Errno 21] Is a directory: {self.tmp.path!r}")


class ManifestThatIsADirectory(_util.TinyPackTestCase):
    """verify_pack and read_manifest given the directory
    holding the manifest raised "cannot read M: read failed at offset 0: Is
    a directory" (session 38); SGLang's read_text() names it, and the hint
    names the manifest inside when there is one."""

    def test_names_the_directory_and_the_manifest_in_it(self):
        where = os.path.dirname(self.manifest)
        calls = [("verify_pack", lambda: k3pack.verify_pack(where)),
                 ("read_manifest", lambda: k3pack.read_manifest(where))]
        for name, call in calls:
            with self.assertRaises(IsADirectoryError, msg=name) as cm:
                call()
            self.assertEqual(str(cm.exception), f"[Errno 21] Is a directory: {where!r}", name)
            self.assertIn("pass the adapter manifest file", cm.exception.k3pack_hint, name)
        # A directory holding a manifest under the writers' default name: the hint names it.
        holder = os.path.join(self.tmp.path, "holder")
        os.makedirs(holder, exist_ok=True)
        inside = os.path.join(holder, "kimi-k3-expert-pack.manifest.json")
        with open(self.manifest, "rb") as src, open(inside, "wb") as dst:
            dst.write(src.read())
        with self.assertRaises(IsADirectoryError) as cm:
            k3pack.read_manifest(holder)
        self.assertEqual(cm.exception.k3pack_hint, f"pass the manifest in it: {inside}")


class SynthRefusedOptionsLeaveNothing(unittest.TestCase):
    """k3pack.synth refused shards=0, hidden=0 or vocab=0 only after it had
    made out_dir and its .k3pack-synth.partial marker (`k3pack synth` makes
    nothing): the next call there was told of "an interrupted synth"."""

    def setUp(self):
        self.tmp = _util.TempDir()
        self.addCleanup(self.tmp.cleanup)

    def test_nothing_is_made(self):
        out = os.path.join(self.tmp.path, "model")
        for kw, text in [({"shards": 0}, "shards must be in 1..65535, got 0"),
                         ({"shards": 70000}, "shards must be in 1..65535, got 70000"),
                         ({"shards": 60000}, "shards 60000 is more than the model's"),
                         ({"hidden": 0}, "invalid model dimensions"),
                         ({"vocab": 0}, "invalid model dimensions")]:
            with self.subTest(kw=kw):
                with self.assertRaises(ValueError) as cm:
                    k3pack.synth(out, **kw)
                self.assertIn(text, str(cm.exception))
                self.assertFalse(os.path.exists(out))
        # And the directory then takes a model without a word about an interrupted one.
        lines = []
        k3pack.synth(out, log=lines.append)
        self.assertEqual(lines, [])
        with open(os.path.join(out, "config.json")) as f:
            self.assertIn("text_config", json.load(f))


if __name__ == "__main__":
    unittest.main()
