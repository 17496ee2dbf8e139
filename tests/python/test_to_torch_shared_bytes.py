"""k3pack.sglang.to_torch over bytes that are not private to the array (a
code-reading audit of the bindings): the tests failed before their fix."""

import os
import subprocess
import sys
import textwrap
import unittest
import warnings

import numpy as np

import _util
import k3pack


def torch_or_skip(test):
    try:
        import torch  # noqa: F401
    except ImportError:
        test.skipTest("torch is not installed")


class SharedBytesTest(_util.TinyPackTestCase):
    """to_torch(copy=False) hands torch a writable alias of any read-only
    array whose base is one of k3pack's capsules, on the grounds that k3pack's
    arrays are private copy-on-write mappings. An ExpertStore view is the
    store's shared cache: the tensor wrote into it without torch's
    read-only warning, and every later hit served the change."""

    def test_store_view_keeps_torch_warning(self):
        torch_or_skip(self)
        from k3pack.sglang import to_torch

        ids = np.arange(self.top_k).reshape(1, self.top_k)
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            with store.acquire(self.layers[0], ids) as acq:
                view = acq[0].up
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    to_torch(view, "uint8")
                self.assertTrue(any("not writable" in str(w.message) for w in caught),
                                [str(w.message) for w in caught])

    def test_private_arrays_still_convert_without_warning(self):
        torch_or_skip(self)
        from k3pack.sglang import to_torch

        g = k3pack.GGUFFile(k3pack.ShardSet(os.path.join(self.tmp.path, "model")).paths[0])
        name = next(t.name for t in g.tensors if t.type == "F32")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t = to_torch(g.tensor_data(name), "float32")
            t.add_(1)  # a private page: the file and other arrays keep their bytes
            for rec in k3pack.nonexpert_tensors(self.manifest):
                to_torch(rec.array, rec.dtype)


class SharedFallbackTest(unittest.TestCase):
    """Past 16,384 live private arrays, GGUFFile hands out views of the
    file's shared read-only mapping; to_torch made a writable tensor of one
    without a warning, and its first write killed the process (SIGSEGV)."""

    def test_fallback_view_keeps_torch_warning(self):
        torch_or_skip(self)
        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        code = textwrap.dedent("""
            import sys, warnings
            import numpy as np
            sys.path.insert(0, %r)
            import gguf_oracle, k3pack
            from k3pack.sglang import to_torch
            path = %r
            gguf_oracle.write_gguf(path, [], [("t", "F32", [4], np.ones(4, np.float32).tobytes())])
            g = k3pack.GGUFFile(path)
            held = [g.tensor_data("t") for _ in range(16384)]
            shared = g.tensor_data("t")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                to_torch(shared, "float32")
            print(any("not writable" in str(w.message) for w in caught))
        """) % (os.path.dirname(os.path.abspath(__file__)), os.path.join(tmp.path, "t.gguf"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip(), "True")


if __name__ == "__main__":
    unittest.main()
