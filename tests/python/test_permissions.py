"""k3pack.build run by a user other than the owner of the model's files (the
Python side of tests/cli/permissions_test.cpp): every other Python test runs
as root, which lists and reads anything. Each test runs a short script as
nobody (setpriv) over a model root made, and skips where it cannot."""

import os
import subprocess
import unittest

import _util

NOBODY = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

SCRIPT = """
import sys, k3pack
try:
    k3pack.build(sys.argv[1], profile="scaled", safety_margin_gib=0)
    print("built")
except Exception as e:
    print("OSError" if isinstance(e, OSError) else type(e).__name__, getattr(e, "errno", None))
    print(str(e))
    print("hint:", getattr(e, "k3pack_hint", ""))
"""


def can_run_as_nobody():
    return os.geteuid() == 0 and os.path.exists(NOBODY[0])


@unittest.skipUnless(can_run_as_nobody(), "needs root and setpriv")
class BuildAsAnotherUserTest(unittest.TestCase):
    def setUp(self):
        self.tmp = _util.TempDir()
        self.addCleanup(self.tmp.cleanup)
        self.model = os.path.join(self.tmp.path, "model")
        _util.synth(self.model)
        # Readable by others, the model directory writable (the outputs go there).
        for root, dirs, files in os.walk(self.tmp.path):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        os.chmod(self.model, 0o777)
        self.tok = os.path.join(self.model, "tokenizer")
        self.addCleanup(os.chmod, self.tok, 0o755)

    def build_as_nobody(self):
        python_dir = os.environ.get("K3PACK_PYTHON_DIR", os.path.join(_util.REPO, "python"))
        env = dict(os.environ, PYTHONPATH=python_dir, HOME=self.tmp.path)
        proc = subprocess.run(NOBODY + ["timeout", "-k", "5", "120", "/usr/bin/python3", "-c", SCRIPT, self.model],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        return proc.stdout

    def assert_nothing_built(self, out):
        left = [f for f in os.listdir(self.model) if f.endswith(".pack") or f.endswith(".pack.partial")]
        self.assertEqual(left, [], out)

    def test_an_unlistable_tokenizer_directory_is_refused_before_the_pack(self):
        # Before: the rule's look at the inputs skipped the directory without
        # a word, the whole pack was built, then the manifest failed on it.
        os.chmod(self.tok, 0o711)
        out = self.build_as_nobody()
        self.assertIn("OSError 13\ncannot list tokenizer directory %s: Permission denied\n" % self.tok, out)
        self.assert_nothing_built(out)
        self.assertIn("pass a readable copy as tokenizer_dir", out)

    def test_an_unreadable_tokenizer_file_is_refused_before_the_pack(self):
        # Before: `cannot open .../tiktoken.model` after the whole pack was built.
        os.chmod(os.path.join(self.tok, "tiktoken.model"), 0o600)
        out = self.build_as_nobody()
        self.assertIn("OSError 13\ncannot open %s/tiktoken.model: Permission denied\n" % self.tok, out)
        self.assert_nothing_built(out)
        self.assertIn("pass a readable copy as tokenizer_dir", out)


if __name__ == "__main__":
    unittest.main()
