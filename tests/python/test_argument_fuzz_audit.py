"""Faults of an argument fuzz of the Python surface (docs/RELIABILITY.md,
"session 44"). Each test failed before its fix."""

import os
import subprocess
import sys
import tempfile
import unittest

import _util  # noqa: F401  (import path)

import k3pack


class DeeplyNestedJson(unittest.TestCase):
    """read_manifest of a 140 KB file of nested arrays died of SIGSEGV: the
    tree was walked recursively, one stack frame per level."""

    def test_is_a_value_error(self):
        with tempfile.TemporaryDirectory(prefix="k3py-") as tmp:
            path = os.path.join(tmp, "deep.json")
            with open(path, "w") as f:
                f.write("[" * 70000 + "]" * 70000)
            # In a child: a regression kills it, not the test run.
            code = ("import k3pack, sys\n"
                    "try:\n"
                    "    k3pack.read_manifest(sys.argv[1])\n"
                    "except ValueError as e:\n"
                    "    print(e)\n")
            run = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout.strip(),
                             f"{path}: manifest is not valid JSON: JSON nested more than 512 levels deep")


class NulBytesInPaths(_util.TinyPackTestCase):
    """A path holding a NUL reached C++ cut at the NUL: GGUFFile(shard +
    '\\0junk') opened the shard, ExpertStore(pack + '\\0x', ...) read the
    pack as its own digest sidecar. Refused as open() refuses it."""

    def test_every_path_taking_call_refuses_it(self):
        model = os.path.join(os.path.dirname(self.pack), "model")
        shard = os.path.join(model, sorted(n for n in os.listdir(model) if n.endswith(".gguf"))[0])
        calls = {
            "argument 1": [lambda: k3pack.GGUFFile(shard + "\0junk"), lambda: k3pack.ShardSet(model + "\0x"),
                           lambda: k3pack.read_manifest(self.manifest + "\0x"),
                           lambda: k3pack.verify_pack(self.manifest + "\0x"),
                           lambda: k3pack.ExpertStore(self.pack + "\0x", self.manifest)],
            "argument 2": [lambda: k3pack.ExpertStore(self.pack, self.manifest + "\0x")],
            "manifest_path": [lambda: k3pack.nonexpert_tensors(self.manifest + "\0x")],
            "out": [lambda: k3pack.build_pack(model, os.path.join(model, "config.json"), out=self.pack + "\0x")],
        }
        for where, group in calls.items():
            for call in group:
                with self.subTest(where=where):
                    with self.assertRaises(ValueError) as cm:
                        call()
                    self.assertEqual(str(cm.exception), f"embedded null byte in {where}")
        # Without the NUL, the same calls work.
        self.assertEqual(k3pack.read_manifest(self.manifest), self.doc)


class WritersFromTheirOwnCallbacks(_util.SynthModelTestCase):
    """build_pack called from its own progress callback ran through the
    pack's lock (re-entrant for its thread): the inner build replaced the
    outer one's files, which then failed ("cannot exchange ...")."""

    def test_a_writer_in_a_callback_is_refused_and_the_outer_call_finishes(self):
        out = os.path.join(self.tmp.path, "reentrant.pack")
        config = os.path.join(self.model, "config.json")
        refused = []

        def progress(_):
            if refused:
                return
            for call in (lambda: k3pack.build_pack(self.model, config, out=out, profile="scaled"),
                         lambda: k3pack.build(self.model, pack=out, profile="scaled")):
                try:
                    call()
                    refused.append("accepted")
                except RuntimeError as e:
                    refused.append(str(e))

        result = k3pack.build_pack(self.model, config, out=out, profile="scaled", progress=progress,
                                   safety_margin_gib=0)
        self.assertEqual(result["pack"], out)
        self.assertEqual(len(refused), 2, refused)
        for text, call in zip(refused, ("k3pack.build_pack", "k3pack.build")):
            self.assertTrue(text.startswith(call + " cannot be called from a progress or log callback of a k3pack "
                                            "call running on this thread"), text)
        self.assertTrue(k3pack.validate_pack(out, self.model, config, profile="scaled"))


class ManifestOutputRefusedFirst(_util.TinyPackTestCase):
    """create_manifest(output=<a user's file>) hashed every shard whole (18
    minutes at full scale) before refusing the path (as `k3pack manifest`)."""

    def test_nothing_is_read_before_the_refusal(self):
        model = os.path.join(os.path.dirname(self.pack), "model")
        note = os.path.join(os.path.dirname(self.pack), "notes.txt")
        with open(note, "w") as f:
            f.write("mine\n")
        said = []
        for force in (False, True):
            with self.assertRaises(FileExistsError) as cm:
                k3pack.create_manifest(model, self.pack, os.path.join(model, "config.json"),
                                       os.path.join(model, "tokenizer"), output=note, profile="scaled", force=force,
                                       progress=said.append)
            self.assertIn("not an adapter manifest", str(cm.exception))
        self.assertEqual(said, [])
        with open(note) as f:
            self.assertEqual(f.read(), "mine\n")


class WordsOfTheErrors(_util.TinyPackTestCase):
    def test_serialize_manifest_of_a_lone_surrogate_is_a_value_error_in_plain_words(self):
        with self.assertRaises(ValueError) as cm:
            k3pack.serialize_manifest({"path": "/m/\udcff.gguf"})
        self.assertIn("serialize_manifest: the manifest holds text that UTF-8 cannot encode (a lone surrogate",
                      str(cm.exception))
        self.assertNotIn("json.exception", str(cm.exception))

    def test_a_manifest_that_does_not_parse_says_where_without_the_librarys_tag(self):
        with tempfile.TemporaryDirectory(prefix="k3py-") as tmp:
            path = os.path.join(tmp, "bad.json")
            with open(path, "w") as f:
                f.write('{"format": "SGLANG')
            with self.assertRaises(ValueError) as cm:
                k3pack.read_manifest(path)
            self.assertTrue(str(cm.exception).startswith(f"{path}: manifest is not valid JSON: parse error at line 1, "
                                                         "column 19"), str(cm.exception))

    def test_request_ids_of_another_type_are_type_errors(self):
        store = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=8 << 20)
        self.addCleanup(store.close)
        ids = [list(range(self.top_k))]
        with self.assertRaises(TypeError) as cm:
            store.acquire(self.layers[0], ids, request_ids=1.5)
        self.assertEqual(str(cm.exception), "request_ids must be None, an int or a sequence of ints, got float")
        with self.assertRaises(TypeError) as cm:
            store.prefetch(self.layers[0], [0], request_id=1.5)
        self.assertEqual(str(cm.exception), "request_id must be None or an int, got float")
        # A sequence, even of one id, is not the one id prefetch takes (it was taken as 1).
        with self.assertRaises(ValueError) as cm:
            store.prefetch(self.layers[0], [0], request_id=[1])
        self.assertTrue(str(cm.exception).startswith("prefetch takes one request_id"), str(cm.exception))


if __name__ == "__main__":
    unittest.main()
