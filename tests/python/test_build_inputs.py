"""k3pack.build finds the inputs a shard directory implies as `k3pack build`
does (the tokenizer directory by SGLang's server's candidate rule, the model
config beside the shards or in it) and says which; none or several
tokenizer directories is SGLang's RuntimeError text. Before, model_config and
tokenizer_dir were required arguments."""

import os
import shutil
import unittest

import _util
import k3pack


class BuildInputs(_util.SynthModelTestCase):
    def test_only_the_shard_directory(self):
        logged = []
        out = k3pack.build(self.model, profile="scaled", safety_margin_gib=0, log=logged.append)
        self.assertEqual(out["inputs"], {"model_config": os.path.join(self.model, "config.json"),
                                         "tokenizer_dir": os.path.join(self.model, "tokenizer")})
        self.assertIn("using tokenizer_dir=%s (" % os.path.join(self.model, "tokenizer"), "\n".join(logged))
        self.assertIn("using model_config=%s (config.json beside the shards)" % os.path.join(self.model, "config.json"),
                      "\n".join(logged))
        self.assertEqual(out["document"]["tokenizer"]["path"], os.path.realpath(os.path.join(self.model, "tokenizer")))

    def test_a_rerun_asking_for_shard_hashes_the_manifest_lacks_says_so(self):
        # Before: "already built" and nothing else, the manifest kept without the hashes asked for.
        m = os.path.join(self.tmp.path, "no-shard-hashes")
        shutil.copytree(self.model, m, ignore=shutil.ignore_patterns("*.pack*", "*.manifest.json"))
        k3pack.build(m, profile="scaled", safety_margin_gib=0, full_source_hashes=False)
        logged = []
        out = k3pack.build(m, profile="scaled", safety_margin_gib=0, log=logged.append)
        self.assertTrue(out["already_built"])
        self.assertFalse(out["document"]["verification"]["full_source_hashes"])
        self.assertIn("was written without whole-shard SHA-256 of the shards (full_source_hashes=False) and is kept "
                      "as it is", "\n".join(logged))
        logged = []
        k3pack.build(m, profile="scaled", safety_margin_gib=0, full_source_hashes=False, log=logged.append)
        self.assertNotIn("whole-shard", "\n".join(logged))

    def test_a_rerun_asking_for_more_payload_samples_writes_the_manifest_anew(self):
        # Before: "already built", and the manifest kept its 6 samples (`k3pack build` the same).
        m = os.path.join(self.tmp.path, "more-samples")
        shutil.copytree(self.model, m, ignore=shutil.ignore_patterns("*.pack*", "*.manifest.json"))
        k3pack.build(m, profile="scaled", safety_margin_gib=0)
        logged = []
        out = k3pack.build(m, profile="scaled", safety_margin_gib=0, payload_samples=50, log=logged.append)
        self.assertFalse(out["already_built"])
        self.assertEqual(out["document"]["expert_pack"]["payload_samples_verified"], 50)
        self.assertIn("payload sample(s) verified, not 50: writing a new manifest as asked", "\n".join(logged))
        self.assertTrue(k3pack.build(m, profile="scaled", safety_margin_gib=0, payload_samples=50)["already_built"])

    def test_shards_alone_raise_sglangs_text(self):
        root = os.path.join(self.tmp.path, "alone")
        gguf = os.path.join(root, "gguf")
        os.makedirs(gguf)
        for p in k3pack.ShardSet.discover(self.model):
            shutil.copy(p, gguf)
        before = sorted(os.listdir(gguf))
        with self.assertRaises(RuntimeError) as cm:
            k3pack.build(gguf, profile="scaled", safety_margin_gib=0)
        first = str(cm.exception).splitlines()[0]
        self.assertEqual(first, "could not uniquely derive Kimi tokenizer beside %s; candidates: none" % gguf)
        self.assertIn("pass tokenizer_dir with the Kimi tokenizer directory", cm.exception.k3pack_hint)
        self.assertEqual(sorted(os.listdir(gguf)), before)
        # Given, the tokenizer directory also gives the model config.
        logged = []
        tok = os.path.join(self.model, "tokenizer")
        out = k3pack.build(gguf, tokenizer_dir=tok, profile="scaled", safety_margin_gib=0, log=logged.append)
        self.assertEqual(out["inputs"]["model_config"], os.path.join(tok, "config.json"))
        self.assertEqual(out["inputs"]["tokenizer_dir"], tok)
        self.assertFalse(any(line.startswith("using tokenizer_dir") for line in logged), logged)


if __name__ == "__main__":
    unittest.main()
