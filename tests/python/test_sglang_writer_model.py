"""bench/sglang_writer_ref.py, the spec model of SGLang's pack writer that
bench_python_pack.py measures k3pack's builder against, writes the very pack
k3pack builds (so the two do the same copy), and refuses what SGLang's
writer refuses."""

import filecmp
import glob
import os
import sys
import unittest

import _util
import k3pack

sys.path.insert(0, os.path.join(_util.REPO, "bench"))
import sglang_writer_ref  # noqa: E402


class SglangWriterModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "model")
        _util.synth(cls.model, all_data=True)
        cls.shards = sorted(glob.glob(os.path.join(cls.model, "*.gguf")))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_same_bytes_as_k3pack(self):
        ours = os.path.join(self.tmp.path, "k3pack.pack")
        ref = os.path.join(self.tmp.path, "model.pack")
        built = k3pack.build_pack(self.model, os.path.join(self.model, "config.json"), out=ours,
                                  profile="scaled", safety_margin_gib=0)
        size = sglang_writer_ref.write_pack(self.shards, ref)
        self.assertEqual(size, built["size"])
        self.assertTrue(filecmp.cmp(ours, ref, shallow=False), "the model's pack differs from k3pack's")
        self.assertFalse(os.path.exists(ref + ".partial"))

    def test_refuses_existing_outputs(self):
        out = os.path.join(self.tmp.path, "exists.pack")
        open(out, "wb").close()
        with self.assertRaises(FileExistsError) as e:
            sglang_writer_ref.write_pack(self.shards, out)
        self.assertEqual(str(e.exception), "refusing to overwrite existing Expert Pack: " + out)
        other = os.path.join(self.tmp.path, "other.pack")
        open(other + ".partial", "wb").close()
        with self.assertRaises(FileExistsError) as e:
            sglang_writer_ref.write_pack(self.shards, other)
        self.assertEqual(str(e.exception), "partial Expert Pack already exists: " + other + ".partial")


if __name__ == "__main__":
    unittest.main()
