"""k3pack.build refuses, as `k3pack build` does, a checkpoint the doctor finds
SGLang cannot load (here BF16 matrices, which SGLang's GGUF linears never
receive as qweights), before a byte is written, unless
allow_unsupported=True. Before, the Python build packed it silently."""

import os
import unittest

import _util
import k3pack


class BuildUnsupported(unittest.TestCase):
    def setUp(self):  # a model per test: one of them builds a pack
        self.tmp = _util.TempDir()
        self.model = os.path.join(self.tmp.path, "model")
        _util.synth(self.model, matrix_type="BF16")

    def tearDown(self):
        self.tmp.cleanup()

    def packs(self):
        return [f for f in os.listdir(self.model) if f.endswith(".pack")]

    def test_refused_like_the_cli(self):
        with self.assertRaises(Exception) as cm:
            k3pack.build(self.model, profile="scaled", safety_margin_gib=0)
        self.assertIn("SGLang cannot load this checkpoint: doctor reports", str(cm.exception))
        self.assertEqual(self.packs(), [])
        if _util.have_cli():
            cli = _util.run_cli("build", self.model, "--profile", "scaled", check=False)
            self.assertNotEqual(cli.returncode, 0)
            self.assertIn("SGLang cannot load this checkpoint: doctor reports", cli.stderr)

    def test_allow_unsupported_builds(self):
        out = k3pack.build(self.model, profile="scaled", safety_margin_gib=0, allow_unsupported=True)
        self.assertTrue(os.path.exists(out["manifest"]))
        self.assertEqual(len(self.packs()), 1)


if __name__ == "__main__":
    unittest.main()
