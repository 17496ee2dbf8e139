"""Faults of an audit of damaged packs and manifests (docs/RELIABILITY.md,
session 42). Each test failed before its fix."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import _util  # noqa: F401  (import path)


class ManifestThatIsAPipe(unittest.TestCase):
    """The C++ stream refuses a named pipe without reading it; the Python
    fallback that reproduces SGLang's open() + json.load exceptions then
    opened it and waited for a writer forever."""

    def test_loader_and_iterator_refuse_a_pipe_without_waiting(self):
        d = tempfile.mkdtemp(prefix="k3fifo-")
        self.addCleanup(shutil.rmtree, d, True)
        fifo = os.path.join(d, "m.json")
        os.mkfifo(fifo)
        for call in ("next(iter(k3pack.nonexpert_weights(%r)))" % fifo,
                     "next(kimi_k3_nonexpert_weights_iterator(%r))" % fifo):
            with self.subTest(call=call):
                code = ("import k3pack\nfrom k3pack.sglang import kimi_k3_nonexpert_weights_iterator\n"
                        "try:\n    %s\nexcept (OSError, ValueError) as e:\n    print('refused:', e)\n" % call)
                try:
                    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
                except subprocess.TimeoutExpired:
                    self.fail("waited on the pipe: " + call)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("refused:", r.stdout)
                self.assertIn(fifo, r.stdout)


if __name__ == "__main__":
    unittest.main()
