"""GGUF files whose names are not UTF-8 (a code-reading audit of the
bindings): the tests failed before their fix."""

import os
import unittest

import _util
import k3pack


class NonUtf8ShardNamesTest(unittest.TestCase):
    """A shard named with bytes that are not UTF-8 (os.listdir gives it as a
    str with surrogate escapes, as os.fsdecode does): ShardSet opened the set
    and then raised UnicodeDecodeError from .paths, .prefix, .tensors[i].path
    and repr(); GGUFFile refused the name os.listdir gave ("incompatible
    constructor arguments")."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "model")
        k3pack.synth(cls.model, shards=2)
        raw = os.fsencode(cls.model)
        for name in os.listdir(raw):
            if name.endswith(b".gguf"):
                os.rename(os.path.join(raw, name), os.path.join(raw, b"mod\xff" + name[name.index(b"-0"):]))
        cls.names = sorted(n for n in os.listdir(cls.model) if n.endswith(".gguf"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_shard_set_reports_the_names_os_listdir_gives(self):
        s = k3pack.ShardSet(self.model)
        want = [os.path.join(self.model, n) for n in self.names]
        self.assertEqual(s.paths, want)
        self.assertEqual(s.prefix, "mod\udcff")
        self.assertEqual(s.directory, self.model)
        self.assertEqual(sorted({t.path for t in s.tensors}), want)
        self.assertEqual([g.path for g in s.shards], want)
        self.assertEqual(k3pack.ShardSet.discover(self.model), want)
        self.assertIn("\\udcff", repr(s.shards[0]))

    def test_gguf_file_opens_the_name_os_listdir_gives(self):
        path = os.path.join(self.model, self.names[0])
        g = k3pack.GGUFFile(path)
        self.assertEqual(g.path, path)
        self.assertGreater(len(g), 0)

    def test_a_path_of_another_kind_is_still_a_type_error(self):
        with self.assertRaises(TypeError):
            k3pack.GGUFFile(3)
        with self.assertRaises(TypeError):
            k3pack.ShardSet(None)


class NonUtf8TensorNameTest(unittest.TestCase):
    """`name` shows a tensor name that is not UTF-8 with U+FFFD, but repr()
    of the same GGUFTensor raised UnicodeDecodeError."""

    def test_repr(self):
        import gguf_oracle
        import numpy as np

        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        path = os.path.join(tmp.path, "t.gguf")
        gguf_oracle.write_gguf(path, [], [("tA", "F32", [4], np.zeros(4, np.float32).tobytes())])
        with open(path, "rb") as f:
            blob = f.read()
        with open(path, "wb") as f:
            f.write(blob.replace(b"tA", b"t\xff", 1))
        t = k3pack.GGUFFile(path).tensors[0]
        self.assertEqual(t.name, "t\ufffd")
        self.assertEqual(repr(t), "GGUFTensor(t\ufffd, F32, (4,), nbytes=16)")


if __name__ == "__main__":
    unittest.main()
